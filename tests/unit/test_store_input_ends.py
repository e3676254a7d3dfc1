"""The assignor lease holder reads where the tables' input topics end and publishes it, with where they start read
every few seconds (a fake admin client here; the real broker in tests/integration/one_stack/test_input_lag.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from freshroute.metadata.tables import TableSpec
from store_node.input_ends import InputEndsWatcher
from store_node.settings import StoreNodeSettings


class Future:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    def result(self, timeout=None):
        return SimpleNamespace(offset=self.offset)


class Admin:
    def __init__(self, ends: dict[str, dict[int, int]], starts: dict[str, dict[int, int]] | None = None) -> None:
        self.ends, self.asked, self.polls = ends, [], 0
        self.starts = starts or {t: {p: 0 for p in ps} for t, ps in ends.items()}
        self.asked_starts: list = []

    def poll(self, timeout=None):
        self.polls += 1  # its librdkafka log queue served
        return 0

    def list_topics(self, topic, timeout=None):
        parts = self.ends.get(topic)
        meta = SimpleNamespace(error=None, partitions={p: None for p in parts}) if parts else None
        return SimpleNamespace(topics={topic: meta} if meta else {})

    def list_offsets(self, wanted, request_timeout=None):
        earliest = {type(spec).__name__ for spec in wanted.values()} == {"EarliestSpec"}
        (self.asked_starts if earliest else self.asked).append(sorted((tp.topic, tp.partition) for tp in wanted))
        offsets = self.starts if earliest else self.ends
        return {tp: Future(offsets[tp.topic][tp.partition]) for tp in wanted}


class Metadata:
    def __init__(self) -> None:
        self.published = []

    def publish_input_ends(self, ends) -> None:
        self.published.append(ends)


def spec(name: str, topic: str | None) -> TableSpec:
    return TableSpec(name, f"{name}-changelog", 4, "k", input_topic=topic)


def test_the_lease_holder_publishes_every_input_topics_ends_in_one_request_and_the_others_do_not():
    admin = Admin({"readings": {0: 40, 1: 7}, "orders": {0: 3}})
    metadata, holds = Metadata(), {"lease": False}
    tables = {"a": spec("a", "readings"), "b": spec("b", "readings"), "c": spec("c", "orders"),
              "d": spec("d", None), "e": spec("e", "missing")}
    watcher = InputEndsWatcher(StoreNodeSettings(node_id="n1"), metadata, lambda: holds["lease"], lambda: tables,
                               admin_factory=lambda cfg: admin)
    watcher.start()
    try:
        time.sleep(0.6)
        assert metadata.published == []  # not the lease holder
        holds["lease"] = True
        deadline = time.monotonic() + 5
        while not metadata.published and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watcher.stop()
    ends = metadata.published[0]
    assert {t: e.ends for t, e in ends.items()} == {"readings": {0: 40, 1: 7}, "orders": {0: 3}}
    assert admin.asked[0] == [("orders", 0), ("readings", 0), ("readings", 1)]  # one request for every partition
    assert admin.polls >= len(admin.asked) >= 1  # its librdkafka log lines served at every read


def test_the_input_topics_log_starts_are_published_with_their_ends_and_read_again_every_few_seconds(monkeypatch):
    import store_node.input_ends as input_ends

    admin = Admin({"readings": {0: 40, 1: 7}}, starts={"readings": {0: 10, 1: 0}})
    watcher = InputEndsWatcher(StoreNodeSettings(node_id="n1"), Metadata(), lambda: True,
                               lambda: {"a": spec("a", "readings")}, admin_factory=lambda cfg: admin)
    clock = {"s": 100.0}
    monkeypatch.setattr(input_ends.time, "monotonic", lambda: clock["s"])
    first = watcher.read(["readings"])["readings"]
    assert (first.ends, first.starts) == ({0: 40, 1: 7}, {0: 10, 1: 0})
    admin.starts["readings"][0] = 25  # the broker's retention deleted some
    again = watcher.read(["readings"])["readings"]
    assert again.starts == {0: 10, 1: 0} and len(admin.asked_starts) == 1  # not due yet: as read before
    clock["s"] += input_ends.STARTS_EVERY_S
    assert watcher.read(["readings"])["readings"].starts == {0: 25, 1: 0} and len(admin.asked_starts) == 2
    assert len(admin.asked) == 3  # the ends, every time


def test_log_starts_that_cannot_be_read_leave_the_ends_published_without_them():
    class NoStarts(Admin):
        def list_offsets(self, wanted, request_timeout=None):
            if {type(spec).__name__ for spec in wanted.values()} == {"EarliestSpec"}:
                raise RuntimeError("the broker did not answer")
            return super().list_offsets(wanted, request_timeout)

    admin = NoStarts({"readings": {0: 40}})
    watcher = InputEndsWatcher(StoreNodeSettings(node_id="n1"), Metadata(), lambda: True,
                               lambda: {"a": spec("a", "readings")}, admin_factory=lambda cfg: admin)
    ends = watcher.read(["readings"])["readings"]
    assert (ends.ends, ends.starts) == ({0: 40}, {})

"""The pipeline's news for read-your-writes: a mark per batch end with the changelog's ends read after it, and the
input records it rejected."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from freshroute.metadata.progress import MARKS_KEPT, InputMark
from pipeline.reflected import ReflectionPublisher


class Admin:
    """Answers list_offsets with the changelog ends it is given."""

    def __init__(self, ends):
        self.ends = ends
        self.asked = 0

    def list_offsets(self, wanted, request_timeout):
        self.asked += 1
        return {tp: SimpleNamespace(result=lambda _t, o=self.ends[tp.topic][tp.partition]: SimpleNamespace(offset=o))
                for tp in wanted}


class Store:
    def __init__(self, marks=None):
        self.marks = {}
        self.rejected = {}
        self._start = marks or {}

    def input_marks(self):
        return self._start

    def publish_input_marks(self, table, marks):
        self.marks[table] = list(marks)

    def publish_rejections(self, topic, rejected):
        self.rejected[topic] = {p: list(rs) for p, rs in rejected.items()}


def wait_for(check, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError("not published in time")


def test_each_batch_end_publishes_a_mark_with_the_changelog_ends_read_after_it():
    old = InputMark({0: 5}, {0: 1, 1: 1}, 1)
    store, admin, stop = Store({"t": (old,)}), Admin({"t-changelog": {0: 40, 1: 70}}), threading.Event()
    publisher = ReflectionPublisher(store, lambda: admin, stop)
    publisher.start()
    try:
        publisher.batch_ended("t", "t-changelog", 2, {0: 12, 1: 9})
        wait_for(lambda: len(store.marks.get("t", ())) == 2)
        mark = store.marks["t"][-1]
        assert store.marks["t"][0] == old  # the marks published before a restart are kept
        assert (mark.input, mark.changelog) == ({0: 12, 1: 9}, {0: 40, 1: 70})
        asked = admin.asked
        publisher.batch_ended("t", "t-changelog", 2, {0: 12, 1: 9})  # no further: no new mark
        publisher.rejected("readings", 1, 17, "invalid_json")
        wait_for(lambda: "readings" in store.rejected)
        assert store.rejected["readings"] == {1: [(17, "invalid_json")]}
        assert len(store.marks["t"]) == 2 and admin.asked == asked  # nothing moved: no ends read
        for i in range(MARKS_KEPT + 5):
            publisher.batch_ended("t", "t-changelog", 2, {0: 13 + i, 1: 9})
            time.sleep(0.001)
        wait_for(lambda: store.marks["t"][-1].input[0] == 13 + MARKS_KEPT + 4)
        assert len(store.marks["t"]) <= MARKS_KEPT
    finally:
        stop.set()
        publisher.join(5)
    assert not publisher.is_alive()

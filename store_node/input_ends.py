"""Where the tables' input topics end, read from the broker and published for routers and clients.

A table's input lag is how far its changelog is behind its input. The pipeline says where its batches have
read to; if it were also the one to say where the input ends, a pipeline that stops or dies would leave every
answer saying it is caught up. So a store node — the assignor lease holder, one per cluster — reads the input
topics' ends from the broker a few times a second and writes them to the metadata store
(``{ns}:input:ends``), where routers and clients set them against the pipeline's progress
(:func:`freshroute.metadata.progress.input_lag_at`). Where the topics start (their log start offsets, which move only
as the broker's retention deletes) is read every few seconds and published with them: how much of its input a
table version building has consumed is counted from there (:mod:`freshroute.metadata.catch_up`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping

from freshroute.changelog_reader import end_offsets, start_offsets
from freshroute.lag import now_ms
from freshroute.metadata.progress import InputEnds
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.tables import TableSpec
from freshroute.settings import kafka_logging
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)

READ_EVERY_S = 0.25
STARTS_EVERY_S = 5.0  # the log starts: they move only when the broker deletes by retention
_TIMEOUT_S = 2.0


class InputEndsWatcher:
    """While ``holds_lease()``: the ends of every input topic ``tables()`` names, published every :data:`READ_EVERY_S`."""

    def __init__(self, settings: StoreNodeSettings, metadata: MetadataStore, holds_lease: Callable[[], bool],
                 tables: Callable[[], Mapping[str, TableSpec]], admin_factory: Callable[[dict], Any] | None = None) -> None:
        self._settings = settings
        self._metadata = metadata
        self._holds_lease = holds_lease
        self._tables = tables
        self._admin_factory = admin_factory
        self._admin: Any = None
        self._partitions: dict[str, list[int]] = {}
        self._starts: dict[str, dict[int, int]] = {}
        self._starts_read = float("-inf")  # when (monotonic s) the log starts were last read
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="input-ends", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(READ_EVERY_S):
            if not self._holds_lease():
                continue
            topics = sorted({t.input_topic for t in self._tables().values() if t.input_topic})
            if not topics:
                continue
            try:
                self._metadata.publish_input_ends(self.read(topics))
                if self._failing:
                    log.info("input topics' ends read and published again")
                self._failing = False
            except Exception as e:  # noqa: BLE001 — the broker or Redis away: routers stop trusting old ends
                if not self._failing:
                    log.warning("cannot read or publish the input topics' ends (%s); retrying", e)
                self._failing = True

    def read(self, topics: list[str]) -> dict[str, InputEnds]:
        """Each topic's ends, in one request to the broker."""
        admin = self._admin_client()
        admin.poll(0)  # hands librdkafka's log lines to the node's logger; nothing else would
        for topic in topics:
            if topic not in self._partitions:
                meta = admin.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
                if meta is None or meta.error is not None or not meta.partitions:
                    continue  # not there (yet): its tables' lag stays the pipeline's word
                self._partitions[topic] = sorted(meta.partitions)
        now = now_ms()
        known = {t: self._partitions[t] for t in topics if t in self._partitions}
        ends = end_offsets(admin, known, _TIMEOUT_S)
        self._read_starts(admin, known)
        return {topic: InputEnds(e, now, self._starts.get(topic, {})) for topic, e in ends.items()}

    def _read_starts(self, admin: Any, known: dict[str, list[int]]) -> None:
        """The topics' log starts, read again every :data:`STARTS_EVERY_S` (and for a topic not read yet); a failed
        read leaves them as they were (none known: no progress is said, the ends are published all the same)."""
        due = time.monotonic() - self._starts_read >= STARTS_EVERY_S
        wanted = known if due else {t: ps for t, ps in known.items() if t not in self._starts}
        if not wanted:
            return
        try:
            self._starts.update(start_offsets(admin, wanted, _TIMEOUT_S))
        except Exception as e:  # noqa: BLE001 — the ends matter more: they go on
            log.debug("cannot read the input topics' log starts (%s); retrying", e)
        if due:
            self._starts_read = time.monotonic()

    def _admin_client(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            factory = self._admin_factory or AdminClient
            self._admin = factory(self._settings.kafka(
                **{"client.id": f"freshroute-store-{self._settings.node_id}-input-ends"},
                **kafka_logging(f"store_node.kafka.{self._settings.node_id}")))
        return self._admin

"""What each table reflects of its input, published for lookups that wait for a writer's events (read your writes).

Two kinds of news. A **mark** after each micro-batch, and after each checkpoint of a Real-time query: once the
batch's rows are in Kafka (the micro-batch sink waits for every acknowledgement; Spark's Kafka sink flushes before
a task commits), where the table's changelog ends, against where the batch read its input to
(:class:`freshroute.metadata.progress.InputMark`). A replica that has applied that far reflects every earlier input
record, whichever key it touched. And each input record the pipeline **rejected**, with its reason: a lookup waiting for
it ends at once with WRITE_REJECTED rather than at its deadline.

Written by a thread of its own, as the input lag is: a slow broker or Redis never holds up the supervising loop;
it keeps only the latest news and writes it when it can.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Callable, Iterable

from freshroute.changelog_reader import end_offsets
from freshroute.lag import now_ms
from freshroute.metadata.progress import MARKS_KEPT, REJECTIONS_KEPT, InputMark

log = logging.getLogger("pipeline")

_WRITE_EVERY_S = 0.05
_TIMEOUT_S = 5.0


class ReflectionPublisher(threading.Thread):
    """Publishes each table's marks and each input topic's rejected records to the metadata store."""

    def __init__(self, store: Any, admin: Callable[[], Any], stop: threading.Event,
                 rejects: Iterable[Any] = ()) -> None:
        super().__init__(name="reflected", daemon=True)
        self.store = store
        self._admin_factory = admin
        self._admin: Any = None
        self.stop_event = stop
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._ended: dict[str, tuple[str, int, dict[int, int]]] = {}  # table → (changelog, partitions, input read to)
        self._rejected: list[tuple[str, int, int, str]] = []
        self.marks: dict[str, deque[InputMark]] = {}
        self.rejections: dict[str, dict[int, deque[tuple[int, str]]]] = {}
        self._failing = False
        for writer in rejects:  # each source's rejected records (pipeline.sink.RejectWriter), as they are noted
            writer.on_rejected = self.rejected

    def batches_ended(self, runs: Iterable[Any], input_offsets: dict[int, int] | None) -> None:
        """The tables of ``runs`` (:class:`pipeline.outputs.TableRun`) have a batch or checkpoint that read their input to
        ``input_offsets`` (None: none) in their changelogs."""
        for run in runs if input_offsets else ():
            self.batch_ended(run.table.name, run.spec.topic, run.spec.partitions, input_offsets)

    def batch_ended(self, table: str, changelog: str, partitions: int, input_offsets: dict[int, int]) -> None:
        """A batch (or a Real-time checkpoint) of ``table`` ended having read its input to ``input_offsets``
        (partition → next offset), its rows in ``changelog``."""
        if not input_offsets:
            return
        with self._lock:
            self._ended[table] = (changelog, partitions, dict(input_offsets))
        self._wake.set()

    def rejected(self, topic: str, partition: int, offset: int, reason: str) -> None:
        """The input record at ``topic``/``partition``/``offset`` was rejected for ``reason``."""
        with self._lock:
            self._rejected.append((topic, int(partition), int(offset), reason))
        self._wake.set()

    def run(self) -> None:
        try:
            self.marks = {t: deque(m, maxlen=MARKS_KEPT) for t, m in self.store.input_marks().items()}
        except Exception:  # noqa: BLE001 — Redis away at start: marks start again from the next batch
            self.marks = {}
        while not self.stop_event.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            with self._lock:
                ended, self._ended = self._ended, {}
                rejected, self._rejected = self._rejected, []
            try:
                self._publish(ended, rejected)
                if self._failing:
                    log.info("read-your-writes marks published again")
                self._failing = False
            except Exception as e:  # noqa: BLE001 — the broker or Redis away: newer news replaces this
                if not self._failing:
                    log.warning("read-your-writes marks not published (%s); retrying",
                                str(e).splitlines()[0] if str(e) else type(e).__name__)
                self._failing = True
                with self._lock:
                    self._ended = {**ended, **self._ended}
                    self._rejected = rejected + self._rejected
            self.stop_event.wait(_WRITE_EVERY_S)

    def _publish(self, ended: dict[str, tuple[str, int, dict[int, int]]],
                 rejected: list[tuple[str, int, int, str]]) -> None:
        topics: set[str] = set()
        for topic, partition, offset, reason in rejected:
            parts = self.rejections.setdefault(topic, {})
            parts.setdefault(partition, deque(maxlen=REJECTIONS_KEPT)).append((offset, reason))
            topics.add(topic)
        for topic in topics:
            self.store.publish_rejections(topic, self.rejections[topic])
        # Only tables further in their input than their last mark need one, and the changelog's ends read.
        moved = {table: e for table, e in ended.items() if not self._marked(table, e[2])}
        if not moved:
            return
        # Read after the batches ended: the changelog can only have grown, so the mark is never ahead of its rows.
        if self._admin is None:
            self._admin = self._admin_factory()
        ends = end_offsets(self._admin, {changelog: range(partitions) for changelog, partitions, _ in moved.values()},
                           _TIMEOUT_S)
        at = now_ms()
        for table, (changelog, _, read_to) in moved.items():
            marks = self.marks.setdefault(table, deque(maxlen=MARKS_KEPT))
            marks.append(InputMark(read_to, ends[changelog], at))
            self.store.publish_input_marks(table, list(marks))

    def _marked(self, table: str, read_to: dict[int, int]) -> bool:
        """Whether ``table``'s last mark is already as far in its input as ``read_to``."""
        marks = self.marks.get(table)
        return bool(marks) and all(o <= marks[-1].input.get(p, 0) for p, o in read_to.items())

"""How far each table is behind its input, from its query's progress, published to Redis for routers and clients.

A micro-batch's progress names the source's latest offsets (what was there to read) and the
batch's end offsets (what it read); the difference is the input not yet in the changelog. When
a batch ends with nothing left, the table was caught up then; while it is behind, answers can
say for how long. Written by a thread of its own, so that a Redis outage never slows the
supervising loop: it keeps only the latest figures and writes them when it can.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import orjson

from freshroute.metadata import InputLag, now_ms

log = logging.getLogger("pipeline")

_WRITE_EVERY_S = 0.2


def _offset_sum(raw: Any) -> int | None:
    """The sum of a source offset's per-partition offsets (our source's JSON, or Spark's Kafka source's)."""
    if raw is None:
        return None
    doc = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw

    def total(node: Any) -> int:
        if isinstance(node, dict):
            return sum(total(v) for v in node.values())
        return node if isinstance(node, int) and not isinstance(node, bool) else 0

    return total(doc.get("partitions", doc)) if isinstance(doc, dict) else None


def records_behind(progress: Any) -> int | None:
    """Input records the batch left unread (admission control, or input that arrived while it ran); None: unknown."""
    sources = getattr(progress, "sources", None) or []
    if not sources:
        return None
    latest, end = _offset_sum(getattr(sources[0], "latestOffset", None)), _offset_sum(sources[0].endOffset)
    if latest is None or end is None:
        return None
    return max(0, latest - end)


class InputLagPublisher(threading.Thread):
    """Keeps each table's :class:`InputLag` in Redis, as the supervising loop observes its batches."""

    def __init__(self, store: Any, stop: threading.Event, where: str) -> None:
        super().__init__(name="input-lag", daemon=True)
        self.store = store
        self.stop_event = stop
        self.where = where
        self.latest: dict[str, InputLag] = {}
        self._pending: dict[str, InputLag] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def observe(self, table: str, progress: Any) -> InputLag | None:
        """Note a batch's progress; returns the table's input lag as of now (None when the source says nothing)."""
        behind = records_behind(progress)
        if behind is None:
            return None
        now = now_ms()
        previous = self.latest.get(table)
        caught_up = now if behind == 0 or previous is None else previous.caught_up_ms
        lag = self.latest[table] = InputLag(behind, caught_up, now)
        with self._lock:
            self._pending[table] = lag
        self._wake.set()
        return lag

    def run(self) -> None:
        healthy: bool | None = None
        while not self.stop_event.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            with self._lock:
                pending, self._pending = self._pending, {}
            if pending:
                try:
                    for table, lag in pending.items():
                        self.store.publish_input_lag(table, lag)
                    healthy = True
                except Exception as e:  # noqa: BLE001 — Redis trouble: newer figures replace these when it is back
                    if healthy is not False:
                        log.warning("Redis at %s is unavailable (%s): input lag not published; retrying", self.where,
                                    str(e).splitlines()[0] if str(e) else type(e).__name__)
                    healthy = False
                    with self._lock:
                        self._pending = {**pending, **self._pending}
            self.stop_event.wait(_WRITE_EVERY_S)

"""Where each table's query is in its input, from its progress, published to Redis for routers and clients.

A micro-batch's progress names the source's latest offsets (what was there to read when it started) and the
batch's end offsets (what it read). A batch that read everything there was leaves the table caught up as of
its start. The end offsets, with where the input ends now (read from the broker by a store node), are what
routers and clients work the input lag out from (:func:`freshroute.metadata.progress.input_lag_at`), so that a stopped
pipeline never looks fresh. Besides each batch, the figures of every table whose query is running are
published again once a second: a pipeline that has gone silent is known to be not running.

Each observation is also a sample of the table's records behind: the rate they have been falling at over the last
minute or so (:class:`freshroute.metadata.catch_up.LagTrend`) is published beside them, with the pipeline's
``switch_lag``, so that listings can say when a version building will have caught up
(:func:`freshroute.metadata.catch_up.catch_up`).

Written by a thread of its own, so that a Redis outage never slows the supervising loop: it keeps only the
latest figures and writes them when it can.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import replace
from typing import Any, Iterable

import orjson

from freshroute.lag import now_ms
from freshroute.metadata.catch_up import LagTrend
from freshroute.metadata.progress import InputLag

log = logging.getLogger("pipeline")

_WRITE_EVERY_S = 0.2
ALIVE_EVERY_MS = 1000  # how often a running table's figures are published again without a batch


def source_offsets(raw: Any) -> dict[int, int] | None:
    """Partition → offset of a Kafka source offset (Spark's JSON: ``{"topic": {"0": 42, …}}``; a query reads one
    topic); None when there is none."""
    if raw is None:
        return None
    doc = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
    if not isinstance(doc, dict):
        return None
    return {int(p): int(o) for parts in doc.values() if isinstance(parts, dict) for p, o in parts.items()}


def records_behind(progress: Any) -> int | None:
    """Input records the batch left unread (admission control, or input that arrived while it ran); None: unknown."""
    sources = getattr(progress, "sources", None) or []
    if not sources:
        return None
    latest, end = source_offsets(getattr(sources[0], "latestOffset", None)), source_offsets(sources[0].endOffset)
    if latest is None or end is None:
        return None
    return max(0, sum(latest.values()) - sum(end.values()))


def batch_start_ms(progress: Any) -> int | None:
    """When the batch started (its trigger), from the progress's ISO timestamp."""
    raw = getattr(progress, "timestamp", None)
    if not raw:
        return None
    return int(dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp() * 1000)


class InputLagPublisher(threading.Thread):
    """Keeps each table's :class:`InputLag` in Redis, as the supervising loop observes its batches."""

    def __init__(self, store: Any, stop: threading.Event, where: str, switch_lag: int | None = None) -> None:
        """``switch_lag``: the pipeline's, published with each table's figures (None: not said)."""
        super().__init__(name="input-lag", daemon=True)
        self.store = store
        self.stop_event = stop
        self.where = where
        self.switch_lag = switch_lag
        self.latest: dict[str, InputLag] = {}
        self._trends: dict[str, LagTrend] = {}
        self.started_ms = now_ms()
        self._running: tuple[str, ...] = ()
        self._pending: dict[str, InputLag] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def observe(self, table: str, progress: Any) -> InputLag | None:
        """Note a batch's progress; returns the table's figures as of now (None when the source says nothing)."""
        behind = records_behind(progress)
        if behind is None:
            return None
        now = now_ms()
        started = batch_start_ms(progress) or now
        previous = self.latest.get(table)
        caught_up = started if behind == 0 or previous is None else previous.caught_up_ms
        offsets = source_offsets(progress.sources[0].endOffset) or {}
        lag = self.latest[table] = InputLag(behind, caught_up, now, offsets, now, self._falling(table, now, behind),
                                            self.switch_lag)
        with self._lock:
            self._pending[table] = lag
        self._wake.set()
        return lag

    def observe_positions(self, table: str, reached: dict[int, int], ends: dict[int, int], at_ms: int,
                          caught_up_ms: int | None = None) -> InputLag:
        """Note where a Real-time table's output says it is in its input (partition → next offset) against where the
        input ends (read at ``at_ms``), and when it last had everything there was (``caught_up_ms``, if known
        better than from these ends); returns the table's figures. Alive while its query runs."""
        now = now_ms()
        behind = sum(max(0, end - reached.get(p, 0)) for p, end in ends.items())
        previous = self.latest.get(table)
        caught_up = at_ms if behind == 0 else (previous.caught_up_ms if previous is not None else self.started_ms)
        if caught_up_ms is not None:
            caught_up = max(caught_up, caught_up_ms)
        alive = now if table in self._running else (previous.alive_ms if previous is not None else 0)
        lag = self.latest[table] = InputLag(behind, caught_up, now, dict(reached), alive,
                                            self._falling(table, now, behind), self.switch_lag)
        with self._lock:
            self._pending[table] = lag
        self._wake.set()
        return lag

    def _falling(self, table: str, now: int, behind: int) -> float | None:
        """The table's records behind noted as a sample; the rate they have been falling at (None: unknown)."""
        trend = self._trends.get(table)
        if trend is None:
            trend = self._trends[table] = LagTrend()
        trend.add(now, behind)
        return trend.falling_per_s()

    def running(self, tables: Iterable[str]) -> None:
        """The tables whose queries are running now (the supervising loop says so every round)."""
        self._running = tuple(tables)

    def _alive_again(self, now: int) -> None:
        """The figures of running tables not published for a while, published again as alive now."""
        with self._lock:
            for table in self._running:
                lag = self.latest.get(table)
                if lag is not None and table not in self._pending and now - lag.alive_ms >= ALIVE_EVERY_MS:
                    self.latest[table] = self._pending[table] = replace(lag, alive_ms=now)

    def run(self) -> None:
        healthy: bool | None = None
        while not self.stop_event.is_set():
            self._wake.wait(_WRITE_EVERY_S)
            self._wake.clear()
            self._alive_again(now_ms())
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

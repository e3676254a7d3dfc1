"""How far behind its changelog a replica is: in offsets, and in time.

Offset lag is ``end − applied`` where the end offset is the high watermark of the Fetch
responses the tailer reads anyway (no request of its own). Time staleness is how long ago
the replica last held every record the broker had: 0 while caught up, otherwise
``now − caught_up_at``. "Caught up" needs fresh evidence from the broker — an end offset the
broker reported recently — so staleness keeps growing while the broker is unreachable
instead of freezing at an optimistic value.

Each end offset the broker reports is remembered with the time it was seen; when the
applied offset passes it, the replica is known to have been complete as of that time. This
keeps staleness honest under a steady write load, where ``applied == end`` at one instant
may never be observed even though the replica trails by only milliseconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from freshroute.metadata import ReplicaLag, lag_offsets

Clock = Callable[[], int]  # milliseconds since the epoch


@dataclass(frozen=True, slots=True)
class LagSnapshot:
    """Applied and end offsets (end None: not reported yet), offset lag and staleness at one instant."""

    applied: int
    end: int | None
    staleness_ms: int
    caught_up: bool

    @property
    def lag_offsets(self) -> int | None:
        return lag_offsets(self.applied, self.end)

    def to_replica_lag(self) -> ReplicaLag:
        return ReplicaLag(self.applied, self.end, self.staleness_ms)


class LagTracker:
    """Applied offset against the broker's end offset, and the last time the replica was complete."""

    def __init__(self, applied: int, caught_up_at_ms: int, clock: Clock, evidence_window_ms: int,
                 max_pending: int = 64) -> None:
        self.applied = applied
        self.end: int | None = None
        # 0 means "never known to be complete": staleness is then the whole epoch, i.e. unbounded.
        self.caught_up_at_ms = caught_up_at_ms
        self.evidence_at_ms: int | None = None
        self._clock = clock
        self._window = evidence_window_ms
        self._pending: deque[list[int]] = deque()  # [end, seen_at_ms], end strictly increasing
        self._max_pending = max_pending

    def observe_end(self, end: int, seen_at_ms: int) -> None:
        """The broker reported ``end`` as the partition's end offset in a response at ``seen_at_ms``."""
        if self.end is not None and end < self.end:
            self._pending.clear()  # the partition shrank (recreated topic): older observations are void
        self.end = end
        if self.evidence_at_ms is None or seen_at_ms > self.evidence_at_ms:
            self.evidence_at_ms = seen_at_ms
        if self.applied >= end:
            self._complete_as_of(seen_at_ms)
            self._pending.clear()
            return
        if self._pending and self._pending[-1][0] == end:
            # Same end seen again later: once applied reaches it, the replica is complete as of
            # the later sighting.
            self._pending[-1][1] = max(self._pending[-1][1], seen_at_ms)
            return
        self._pending.append([end, seen_at_ms])
        if len(self._pending) > self._max_pending:
            self._pending.popleft()  # forgetting an old sighting only makes staleness more conservative

    def advance(self, applied: int) -> None:
        """The replica has applied everything below ``applied``."""
        self.applied = applied
        pending = self._pending
        while pending and pending[0][0] <= applied:
            self._complete_as_of(pending.popleft()[1])

    def caught_up_at_after(self, applied: int) -> int:
        """The caught-up time :meth:`advance` would record for ``applied`` (persisted with the batch)."""
        at = self.caught_up_at_ms
        for end, seen_at in self._pending:
            if end > applied:
                break
            at = max(at, seen_at)
        return at

    def _complete_as_of(self, at_ms: int) -> None:
        if at_ms > self.caught_up_at_ms:
            self.caught_up_at_ms = at_ms

    def reset(self) -> None:
        """Forget everything: the replica was wiped and restores from the start."""
        self.applied = 0
        self.end = None
        self.caught_up_at_ms = 0
        self.evidence_at_ms = None
        self._pending.clear()

    def evidence_fresh(self, now_ms: int) -> bool:
        return self.evidence_at_ms is not None and now_ms - self.evidence_at_ms <= self._window

    def within(self, threshold: int, now_ms: int | None = None) -> bool:
        """Within ``threshold`` offsets of an end offset the broker reported recently."""
        now = self._clock() if now_ms is None else now_ms
        return self.end is not None and self.end - self.applied <= threshold and self.evidence_fresh(now)

    def staleness_ms(self, now_ms: int | None = None) -> int:
        return self.figures(self._clock() if now_ms is None else now_ms)[2]

    def figures(self, now_ms: int) -> tuple[int, int | None, int]:
        """(applied, end, staleness_ms) at ``now_ms``: a snapshot's numbers without building one (a read's path)."""
        applied, end = self.applied, self.end
        if end is not None and end <= applied and self.evidence_fresh(now_ms):
            return applied, end, 0
        return applied, end, max(0, now_ms - self.caught_up_at_ms)

    def snapshot(self, now_ms: int | None = None) -> LagSnapshot:
        now = self._clock() if now_ms is None else now_ms
        applied, end, staleness = self.figures(now)
        return LagSnapshot(applied, end, staleness, self.within(0, now))

"""A replica's lag: offsets behind its changelog's end and milliseconds of staleness, and how routing ranks
replicas by them, freshest first and unknown last."""

from __future__ import annotations

import time
from dataclasses import dataclass


def now_ms() -> int:
    """Milliseconds since the epoch: the clock of every lag and heartbeat."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class ReplicaLag:
    """Applied offset (next offset to apply) against the partition's end offset; lag never negative.

    ``end`` None: the replica has not learnt its partition's end offset yet, so its offset lag is unknown.
    """

    applied: int
    end: int | None
    staleness_ms: int = 0

    @property
    def offsets(self) -> int | None:
        return lag_offsets(self.applied, self.end)


def lag_offsets(applied: int, end: int | None) -> int | None:
    """Offsets a replica at ``applied`` is behind ``end``: never negative, None while the end is unknown."""
    return None if end is None else max(0, end - applied)


UNKNOWN_LAG_RANK = 1 << 62  # an unknown offset lag sorts behind every known one: never preferred for it


def rank_lag(offsets: int | None) -> int:
    """An offset lag as a sort key, freshest first, unknown last."""
    return UNKNOWN_LAG_RANK if offsets is None else offsets


# A replica never caught up reports its staleness counted from the epoch, more than any replica that ever was caught
# up, so that routing ranks it last; an answer says its lag in ms is unknown (null), not decades.
NEVER_CAUGHT_UP_MS = 20 * 365 * 86_400_000


def known_staleness(staleness_ms: int | None) -> int | None:
    """A replica's staleness as answers show it: None (unknown) when it has never been caught up."""
    return None if staleness_ms is None or staleness_ms >= NEVER_CAUGHT_UP_MS else staleness_ms


def rank_staleness(staleness_ms: int | None) -> int:
    """A shown staleness as a sort key, freshest first, unknown last."""
    return NEVER_CAUGHT_UP_MS if staleness_ms is None else staleness_ms

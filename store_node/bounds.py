"""A caller's freshness bound, and the one check that decides whether a replica may answer.

A replica refuses a read it cannot answer within the bound, so a stale routing view can
never produce an out-of-bound answer. Unset limits mean "no limit".
"""

from __future__ import annotations

from dataclasses import dataclass

from store_node.lag import LagSnapshot


@dataclass(frozen=True, slots=True)
class ReadBound:
    """Offsets behind the end, ms since last caught up, and the minimum applied offset (position)."""

    max_lag: int | None = None
    max_staleness_ms: int | None = None
    min_offset: int = 0

    @classmethod
    def from_proto(cls, bound) -> "ReadBound":
        return cls(bound.max_lag if bound.HasField("max_lag") else None,
                   bound.max_staleness_ms if bound.HasField("max_staleness_ms") else None,
                   bound.min_offset)


UNBOUNDED = ReadBound()


def refusal(lag: LagSnapshot, max_lag: int | None, max_staleness_ms: int | None, min_offset: int) -> str | None:
    """Why a replica with ``lag`` must refuse a read under this bound, or None if it may answer."""
    if min_offset > lag.applied:
        return f"applied offset {lag.applied} is below the requested position {min_offset}"
    if max_lag is not None:
        if lag.end is None:
            return "the partition's end offset is not known yet"
        behind = lag.end - lag.applied
        if behind > max_lag:
            return f"replica is {behind} offsets behind, bound is {max_lag}"
    if max_staleness_ms is not None and lag.staleness_ms > max_staleness_ms:
        return f"replica is {lag.staleness_ms} ms stale, bound is {max_staleness_ms} ms"
    return None


def check(lag: LagSnapshot, bound: ReadBound) -> str | None:
    """:func:`refusal` for a :class:`ReadBound`."""
    return refusal(lag, bound.max_lag, bound.max_staleness_ms, bound.min_offset)

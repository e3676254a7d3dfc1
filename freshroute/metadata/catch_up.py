"""How far a table version building beside the served one has got (freshroute.metadata.table_versions), and when it
will have caught up with its input.

- **Progress** is the share of its input it has consumed, over what the broker holds: summed over the input's
  partitions, ``(position − log start) / (position − log start + records behind)``. The position is where the
  pipeline's last batch read to (:class:`~freshroute.metadata.progress.InputLag`), the log start what the broker
  still holds (:class:`~freshroute.metadata.progress.InputEnds`, read by the assignor lease holder), and the records
  behind the input lag (:func:`~freshroute.metadata.progress.input_lag_at`): with fresh ends, ``end − position``.
  A version computes its table from the input's beginning as the broker holds it, so this is the share of its work
  done; the input arriving meanwhile is counted as it arrives.
- **The estimate** (``caught_up_in_ms``) is when its input lag will be within ``switch_lag`` records — what a switch
  waits for — at the rate the lag has been falling: a least-squares line through the pipeline's samples of it over
  the last minute or so (:class:`LagTrend`, kept by the pipeline's input-lag publisher, which sees every batch and
  publishes the rate beside the lag). 0 once within ``switch_lag``.

Unknown is None, never 0: no progress without the log start or the pipeline's position; no estimate with too few
samples, a lag that is not falling (flat, or rising: the input arrives faster than the version reads it), or a
pipeline that has stopped speaking.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from freshroute.metadata.progress import InputEnds, InputLag, input_lag_at
from freshroute.metadata.table_versions import LIVE, VersionedTable, VersionState
from freshroute.metadata.tables import TableSpec

DEFAULT_SWITCH_LAG = 1_000  # records behind its input, and offsets behind its changelog, a version may switch at

MIN_SAMPLES = 3  # samples a rate is worked out from, at the least
MIN_SPAN_MS = 2_000  # and the time they span, at the least
SAMPLE_EVERY_MS = 1_000  # one sample a second is kept, however often the lag is observed
SAMPLES_KEPT = 60  # a minute of samples where the lag is seen every second
WINDOW_MS = 600_000  # and none older than this (a micro-batch's samples come once a batch)


def falling_rate(samples: Iterable[tuple[int, int]]) -> float | None:
    """Records a second by which a lag has been falling, from ``(at_ms, records)`` samples: minus the slope of their
    least-squares line; None with fewer than :data:`MIN_SAMPLES` over less than :data:`MIN_SPAN_MS`, or a lag that is
    not falling."""
    points = list(samples)
    if len(points) < MIN_SAMPLES or points[-1][0] - points[0][0] < MIN_SPAN_MS:
        return None
    t0 = points[0][0]
    n = len(points)
    mean_t = sum(t - t0 for t, _ in points) / n
    mean_r = sum(r for _, r in points) / n
    var = sum((t - t0 - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    slope_per_ms = sum((t - t0 - mean_t) * (r - mean_r) for t, r in points) / var
    return -slope_per_ms * 1000 if slope_per_ms < 0 else None


class LagTrend:
    """A table's recent input-lag samples, at most one a second, the last :data:`SAMPLES_KEPT` within
    :data:`WINDOW_MS`: the rate its lag is falling at (:func:`falling_rate`)."""

    def __init__(self) -> None:
        self._samples: deque[tuple[int, int]] = deque(maxlen=SAMPLES_KEPT)

    def add(self, at_ms: int, records: int) -> None:
        if self._samples and at_ms < self._samples[-1][0]:
            self._samples.clear()  # the clock went back: what came before says nothing of what comes now
        elif self._samples and at_ms - self._samples[-1][0] < SAMPLE_EVERY_MS:
            return
        self._samples.append((at_ms, records))
        while at_ms - self._samples[0][0] > WINDOW_MS:
            self._samples.popleft()

    def falling_per_s(self) -> float | None:
        rate = falling_rate(self._samples)
        return None if rate is None else round(rate, 3)

    def __len__(self) -> int:
        return len(self._samples)


def progress_of(offsets: Mapping[int, int], starts: Mapping[int, int], behind: int) -> float | None:
    """The share of its input a table has consumed: what it read past each partition's log start over that and the
    ``behind`` records it has yet to read; None without its position or a partition's log start."""
    if not offsets or not starts or any(p not in starts for p in offsets):
        return None
    consumed = sum(max(0, o - starts[p]) for p, o in offsets.items())
    held = consumed + max(0, behind)
    return 1.0 if held == 0 else round(consumed / held, 4)


def caught_up_in(records: int, falling_per_s: float | None, switch_lag: int) -> int | None:
    """Milliseconds until ``records`` behind is within ``switch_lag`` at ``falling_per_s``: 0 once it is; None when it
    is not falling."""
    if records <= switch_lag:
        return 0
    if falling_per_s is None or falling_per_s <= 0:
        return None
    return math.ceil((records - switch_lag) * 1000 / falling_per_s)


@dataclass(frozen=True)
class CatchUp:
    """A version's way to its input: its progress (0..1) and when it will have caught up (ms from now); None:
    unknown."""

    progress: float | None
    caught_up_in_ms: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"progress": self.progress, "caught_up_in_ms": self.caught_up_in_ms}


UNKNOWN = CatchUp(None, None)


def catch_up(lag: InputLag | None, ends: InputEnds | None, now: int, switch_lag: int | None = None) -> CatchUp:
    """Where a table stands at ``now`` from what the pipeline published of it (``lag``) and where its input ends
    (``ends``); ``switch_lag``: the records behind it counts as caught up at (default: the pipeline's, as it
    published it, else :data:`DEFAULT_SWITCH_LAG`)."""
    if lag is None:
        return UNKNOWN
    records, _ = input_lag_at(lag, ends, now)
    target = switch_lag if switch_lag is not None else lag.switch_lag if lag.switch_lag is not None else \
        DEFAULT_SWITCH_LAG
    # A pipeline that has stopped speaking is not catching up, whatever its last rate said.
    rate = lag.falling_per_s if lag.alive(now) else None
    return CatchUp(progress_of(lag.offsets, ends.starts if ends is not None else {}, records),
                   caught_up_in(records, rate, target))


def version_figures(record: VersionedTable, tables: Mapping[str, TableSpec], lags: Mapping[str, InputLag],
                    ends: Mapping[str, InputEnds], now: int, switch_lag: int | None = None
                    ) -> tuple[dict[int, tuple[int, int]], dict[int, CatchUp]]:
    """Each version's input lag at ``now`` (a building, serving or previous one placed on the store nodes: its table
    spec registered), and the building one's :class:`CatchUp` (against ``switch_lag``, default the pipeline's) —
    from the table specs, what the pipeline published of each table and where the input topics end, as the metadata
    store holds them (or a router's snapshot)."""
    input_lags: dict[int, tuple[int, int]] = {}
    ways: dict[int, CatchUp] = {}
    for v in record.listed():
        physical = record.physical(v.version)
        spec = tables.get(physical)
        topic_ends = ends.get(spec.input_topic) if spec is not None and spec.input_topic else None
        if v.state in LIVE and spec is not None:
            input_lags[v.version] = input_lag_at(lags.get(physical), topic_ends, now)
        if v.state is VersionState.BUILDING:
            # Its own spec says which input it reads: until it is registered, the pipeline's word and no progress.
            ways[v.version] = catch_up(lags.get(physical), topic_ends, now, switch_lag)
    return input_lags, ways

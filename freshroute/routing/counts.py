"""What the routing core counts of its lookups: by outcome and serving role, their latency, retries by reason.

Plain ints per routing thread (:class:`LookupCounts`), added up at a scrape by
:class:`freshroute.routing.lookup_metrics.LookupMetrics`; :class:`NoMetrics` counts nothing. Free of
prometheus_client, which the client install does not bring.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Protocol, cast, overload

from freshroute.errors import (FreshrouteError, InvalidArgument, LookupTimeout, NoReplicaWithinBound, NotYetVisible,
                               ReplicaUnavailable, TableNotFound, WriteRejected)
from freshroute.routing.answers import served_by
from freshroute.routing.results import LookupResult, WindowsResult
from freshroute.routing.selection import Candidate
from freshroute.wire import GroupResult


class Metrics(Protocol):
    """The metrics seam of the routing core: what it tells of each lookup and each extra attempt."""

    def lookup(self, outcome: str, role: str, seconds: float, count: int = 1) -> None: ...

    def retry(self, reason: str) -> None: ...


class NoMetrics:
    """The metrics seam of the routing core, counting nothing."""

    def lookup(self, outcome: str, role: str, seconds: float, count: int = 1) -> None:
        pass

    def retry(self, reason: str) -> None:
        pass


# What the lookup counters are labelled by.
OUTCOMES = ("ok", "not_found", "no_replica", "unavailable", "timeout", "invalid", "table_not_found", "not_yet_visible",
            "write_rejected", "error")
ROLES = ("active", "standby", "none")
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
RETRY_REASONS = ("unavailable", "too_stale", "not_hosted", "error", "slow", "hedge", "position", "not_yet_visible",
                 "after")


class LookupCounts:
    """The metrics seam counting: one routing thread's counts in plain ints (only that thread updates them), added up
    at a scrape by :class:`freshroute.routing.lookup_metrics.LookupMetrics`."""

    __slots__ = ("lookups", "buckets", "sum_s", "retries")

    def __init__(self) -> None:
        self.lookups = {(o, r): 0 for o in OUTCOMES for r in ROLES}
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.sum_s = 0.0
        self.retries = dict.fromkeys(RETRY_REASONS, 0)

    def lookup(self, outcome: str, role: str, seconds: float, count: int = 1) -> None:
        """``count`` lookups that ended alike (a batch group's keys) after ``seconds``."""
        self.lookups[(outcome, role)] += count
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += count
        self.sum_s += seconds * count

    def retry(self, reason: str) -> None:
        self.retries[reason] += 1


_OUTCOMES = ((NoReplicaWithinBound, "no_replica"), (LookupTimeout, "timeout"), (ReplicaUnavailable, "unavailable"),
             (InvalidArgument, "invalid"), (TableNotFound, "table_not_found"), (NotYetVisible, "not_yet_visible"),
             (WriteRejected, "write_rejected"))


def outcome_label(e: FreshrouteError) -> str:
    """A failed read's outcome, as metrics count it."""
    return next((label for cls, label in _OUTCOMES if isinstance(e, cls)), "error")


@overload
def count(metrics: Metrics, started: float, outcome: LookupResult) -> LookupResult: ...


@overload
def count(metrics: Metrics, started: float, outcome: WindowsResult) -> WindowsResult: ...


@overload
def count(metrics: Metrics, started: float, outcome: FreshrouteError) -> FreshrouteError: ...


def count(metrics: Metrics, started: float,
          outcome: LookupResult | WindowsResult | FreshrouteError) -> LookupResult | WindowsResult | FreshrouteError:
    """One key's read that ended in ``outcome`` (its result, or the error it raised) since ``started``
    (``time.perf_counter()``), counted by outcome and serving role; returns ``outcome``."""
    elapsed = time.perf_counter() - started
    if type(outcome) is LookupResult:  # the common case first: this runs on every lookup
        metrics.lookup("ok" if outcome.found else "not_found", outcome.role, elapsed)
    elif isinstance(outcome, WindowsResult):
        metrics.lookup("ok" if outcome.windows else "not_found", outcome.role, elapsed)
    else:  # an error (a LookupResult is always one exactly, never a subclass)
        metrics.lookup(outcome_label(cast(FreshrouteError, outcome)), "none", elapsed)
    return outcome


def count_group(metrics: Metrics, outcome: tuple[Candidate, GroupResult] | FreshrouteError, keys: int,
                elapsed: float) -> None:
    """One partition's group of ``keys`` keys: its ``(candidate, GroupResult)`` or the error no replica avoided."""
    if isinstance(outcome, FreshrouteError):
        metrics.lookup(outcome_label(outcome), "none", elapsed, keys)
        return
    cand, answer = outcome
    found = len(answer.values) - answer.values.count(b"")  # an absent key's value is empty
    role = served_by(cand, answer.replica)[1]
    if found:
        metrics.lookup("ok", role, elapsed, found)
    if found < keys:
        metrics.lookup("not_found", role, elapsed, keys - found)

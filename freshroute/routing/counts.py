"""What the routing core counts of its lookups: by outcome and serving role, their latency, retries by reason.

Plain ints per routing thread (:class:`LookupCounts`), added up at a scrape by
:class:`freshroute.routing.lookup_metrics.LookupMetrics`; :class:`NoMetrics` counts nothing. Free of
prometheus_client, which the client install does not bring.
"""

from __future__ import annotations

from bisect import bisect_left


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

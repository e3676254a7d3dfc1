"""Prometheus metrics of one router, in a registry of its own (no process-wide state)."""

from __future__ import annotations

from bisect import bisect_left
from typing import Callable, Iterable, Mapping, NamedTuple

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

OUTCOMES = ("ok", "not_found", "no_replica", "unavailable", "timeout", "invalid", "table_not_found", "error")
ROLES = ("active", "standby", "none")
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
RETRY_REASONS = ("unavailable", "too_stale", "not_hosted", "error", "slow", "hedge", "position")


class ReplicaGauge(NamedTuple):
    table: str
    partition: int
    node: str
    role: str
    alive: bool
    lag_offsets: int | None  # None: unknown, so no sample
    staleness_ms: int


class _ReplicaCollector(Collector):
    """Per-replica lag read from the current snapshot at scrape time, so it never goes stale."""

    def __init__(self, replicas: Callable[[], Iterable[ReplicaGauge]], metadata_age_s: Callable[[], float],
                 redis_up: Callable[[], bool], bad_heartbeats: Callable[[], Mapping[str, int]]) -> None:
        self._replicas = replicas
        self._metadata_age_s = metadata_age_s
        self._redis_up = redis_up
        self._bad_heartbeats = bad_heartbeats

    def collect(self):
        labels = ["table", "partition", "node", "role"]
        lag = GaugeMetricFamily("freshroute_router_replica_lag_offsets", "Replica lag behind the changelog end, as the router sees it", labels=labels)
        stale = GaugeMetricFamily("freshroute_router_replica_staleness_ms", "Time since the replica was caught up, as the router sees it", labels=labels)
        alive = GaugeMetricFamily("freshroute_router_replica_alive", "1 if the replica's node heartbeat is current", labels=labels)
        for r in self._replicas():
            values = [r.table, str(r.partition), r.node, r.role]
            if r.lag_offsets is not None:
                lag.add_metric(values, r.lag_offsets)
            stale.add_metric(values, r.staleness_ms)
            alive.add_metric(values, 1 if r.alive else 0)
        yield lag
        yield stale
        yield alive
        yield GaugeMetricFamily("freshroute_router_metadata_age_seconds", "Age of the routing snapshot", value=self._metadata_age_s())
        yield GaugeMetricFamily("freshroute_router_redis_up", "1 if the last metadata refresh reached Redis", value=1 if self._redis_up() else 0)
        bad = CounterMetricFamily("freshroute_router_bad_heartbeats", "Node reports skipped: malformed, "
                                  "unknown-version or oversized", labels=["reason"])
        for reason, count in sorted(self._bad_heartbeats().items()):
            bad.add_metric([reason], count)
        yield bad


class _LookupCollector(Collector):
    """Lookups by outcome and role, and their latency, counted in plain ints.

    prometheus_client's Counter and Histogram take a lock per update (three per lookup);
    the router counts on its event loop thread alone, so it keeps plain counts and turns
    them into metric families only when scraped.
    """

    def __init__(self) -> None:
        self.counts = {(o, r): 0 for o in OUTCOMES for r in ROLES}
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.sum_s = 0.0

    def collect(self):
        lookups = CounterMetricFamily("freshroute_router_lookups",
                                      "Key lookups by outcome and role of the replica that served",
                                      labels=["outcome", "role"])
        for (outcome, role), n in self.counts.items():
            lookups.add_metric([outcome, role], n)
        cumulative, running = [], 0
        for bound, n in zip((*(str(float(b)) for b in LATENCY_BUCKETS), "+Inf"), self.buckets):
            running += n
            cumulative.append((bound, running))
        latency = HistogramMetricFamily("freshroute_router_lookup_seconds", "Key lookup latency at the router")
        latency.add_metric([], cumulative, self.sum_s)
        yield lookups
        yield latency


class RouterMetrics:
    """Lookups by outcome and serving role, retries, hedges, latency; replica lag at scrape time."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lookups = _LookupCollector()
        self.registry.register(self._lookups)
        self._retries = Counter("freshroute_router_retries", "Extra replica attempts, by why they were made",
                                ["reason"], registry=self.registry)
        # Children resolved once: labels() takes a lock and a dict lookup on every call.
        self._retry_children = {r: self._retries.labels(r) for r in RETRY_REASONS}

    def lookup(self, outcome: str, role: str, seconds: float, count: int = 1) -> None:
        """``count`` lookups that ended alike (a batch group's keys) after ``seconds``."""
        lookups = self._lookups
        lookups.counts[(outcome, role)] += count
        lookups.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += count
        lookups.sum_s += seconds * count

    def retry(self, reason: str) -> None:
        self._retry_children[reason].inc()

    def watch(self, replicas: Callable[[], Iterable[ReplicaGauge]], metadata_age_s: Callable[[], float],
              redis_up: Callable[[], bool], bad_heartbeats: Callable[[], Mapping[str, int]] = dict) -> None:
        self.registry.register(_ReplicaCollector(replicas, metadata_age_s, redis_up, bad_heartbeats))

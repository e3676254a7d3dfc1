"""Prometheus metrics of one router, in a registry of its own (no process-wide state)."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, NamedTuple

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from freshroute.routing.lookup_metrics import LookupMetrics


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


class RouterMetrics:
    """Lookups by outcome and serving role, retries, hedges, latency; replica lag at scrape time."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        # The event loop is the router's one routing thread: one set of counts, its methods bound once.
        self.lookups = LookupMetrics("freshroute_router", self.registry)
        counts = self.lookups.counts()
        self.lookup = counts.lookup
        self.retry = counts.retry

    def watch(self, replicas: Callable[[], Iterable[ReplicaGauge]], metadata_age_s: Callable[[], float],
              redis_up: Callable[[], bool], bad_heartbeats: Callable[[], Mapping[str, int]] = dict) -> None:
        self.registry.register(_ReplicaCollector(replicas, metadata_age_s, redis_up, bad_heartbeats))

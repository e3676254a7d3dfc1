"""Lookup counters for Prometheus, under the counting process's prefix (``freshroute_router``,
``freshroute_client``): lookups by outcome and serving role, their latency, retries by reason.

prometheus_client's Counter and Histogram take a lock per update (three per lookup). Each routing thread counts
in plain ints of its own instead (:class:`~freshroute.routing.counts.LookupCounts`, from
:meth:`LookupMetrics.counts`) and a scrape adds them up: the router's event loop is one such thread, each thread
of the synchronous client another. Imported only where metrics are asked for: prometheus_client is not a
dependency of the client install.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from freshroute.routing.counts import LATENCY_BUCKETS, RETRY_REASONS, LookupCounts


class LookupMetrics(Collector):
    """Every routing thread's :class:`LookupCounts`, exposed as ``{prefix}_lookups``, ``{prefix}_lookup_seconds``
    and ``{prefix}_retries``."""

    def __init__(self, prefix: str, registry: CollectorRegistry) -> None:
        self.prefix = prefix
        self._threads: list[LookupCounts] = []
        self._fills: list[tuple[LookupCounts, Callable[[LookupCounts], None]]] = []
        self._lock = threading.Lock()
        registry.register(self)

    def counts(self, fill: Callable[[LookupCounts], None] | None = None) -> LookupCounts:
        """Counts for one more routing thread; ``fill`` brings them up to date at each scrape, for counts kept
        elsewhere (the compiled lookup path's)."""
        counts = LookupCounts()
        with self._lock:
            self._threads.append(counts)
            if fill is not None:
                self._fills.append((counts, fill))
        return counts

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            threads = list(self._threads)
            fills = list(self._fills)
        for counts, fill in fills:
            fill(counts)
        p = self.prefix
        lookups = CounterMetricFamily(f"{p}_lookups", "Key lookups by outcome and role of the replica that served",
                                      labels=["outcome", "role"])
        for key in threads[0].lookups if threads else ():
            lookups.add_metric(list(key), sum(t.lookups[key] for t in threads))
        cumulative, running = [], 0
        for i, bound in enumerate((*(str(float(b)) for b in LATENCY_BUCKETS), "+Inf")):
            running += sum(t.buckets[i] for t in threads)
            cumulative.append((bound, running))
        latency = HistogramMetricFamily(f"{p}_lookup_seconds", "Key lookup latency")
        latency.add_metric([], cumulative, sum(t.sum_s for t in threads))
        retries = CounterMetricFamily(f"{p}_retries", "Extra replica attempts, by why they were made",
                                      labels=["reason"])
        for reason in RETRY_REASONS:
            retries.add_metric([reason], sum(t.retries[reason] for t in threads))
        yield lookups
        yield latency
        yield retries

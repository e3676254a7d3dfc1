"""The client's Prometheus counters, when the caller asks for them (``Client(..., metrics=registry)``):
``freshroute_client_lookups_total`` by outcome and serving role, ``freshroute_client_lookup_seconds``,
``freshroute_client_retries_total`` by reason (hedges included) and ``freshroute_client_router_fallbacks_total``
by operation — reads the router answered because the client could not read the store nodes itself."""

from __future__ import annotations

from typing import Any

from freshroute.errors import ConfigError
from freshroute.routing.counts import LookupCounts


class ClientMetrics:
    def __init__(self, registry: Any) -> None:
        try:
            from prometheus_client import Counter

            from freshroute.routing.lookup_metrics import LookupMetrics
        except ImportError:
            raise ConfigError("the client's metrics need prometheus_client: pip install prometheus-client",
                              setting="metrics") from None
        self.registry = registry
        self._lookups = LookupMetrics("freshroute_client", registry)
        self._fallbacks = Counter("freshroute_client_router_fallbacks", "Reads the router answered because no "
                                  "store node could be read, or no metadata was loaded", ["operation"],
                                  registry=registry)

    def counts(self) -> LookupCounts:
        """Lookup counts for one more routing thread (what a :class:`RoutingCore` counts into)."""
        return self._lookups.counts()

    def fell_back(self, operation: str) -> None:
        self._fallbacks.labels(operation).inc()

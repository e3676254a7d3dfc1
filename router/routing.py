"""The router's routing: the shared :class:`RoutingCore` plus what only a server needs (readiness, draining, metrics).

REST and gRPC are thin adapters over :class:`Router`; the reads themselves are the core's.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from freshroute.errors import InvalidArgument
from freshroute.lag import now_ms
from freshroute.routing.core import RoutingCore
from freshroute.routing.policy import RoutingPolicy
from freshroute.routing.selection import ReplicaSelector
from freshroute.routing.snapshot import Snapshot, SnapshotSource
from freshroute.routing.store import StoreClient

from router.metrics import ReplicaGauge, RouterMetrics
from router.settings import RouterSettings

T = TypeVar("T")


class Router(RoutingCore):
    """Routes reads for REST and gRPC alike, over a metadata snapshot and a store client."""

    def __init__(self, settings: RouterSettings, metadata: SnapshotSource, store: StoreClient, *,
                 selector: ReplicaSelector | None = None, metrics: RouterMetrics | None = None,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        metrics = metrics if metrics is not None else RouterMetrics()
        super().__init__(RoutingPolicy.from_settings(settings), metadata, store, selector=selector, metrics=metrics,
                         clock_ms=clock_ms)
        self.settings = settings
        self._ready_listeners: list[Callable[[bool], None]] = []
        self._ready = False
        self._stopping = False
        feed = getattr(metadata, "feed", None)
        metrics.watch(self._replica_gauges, self._metadata_age_s,
                      lambda: bool(getattr(self.metadata, "redis_ok", self.metadata.current.loaded)),
                      (lambda: feed.rejections.counts) if feed is not None else dict)

    def parsed(self, parse: Callable[..., T], *args: Any) -> T:
        """``parse(*args)`` of a request's bound or range; a malformed one is counted as an invalid lookup before it
        is raised, on every protocol alike."""
        try:
            return parse(*args)
        except InvalidArgument:
            self.metrics.lookup("invalid", "none", 0.0)
            raise

    @property
    def ready(self) -> bool:
        """Ready once a snapshot with tables exists, until the process starts stopping."""
        snap = self.metadata.current
        return snap.loaded and bool(snap.tables) and not self._stopping

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop_serving(self) -> None:
        """Report not ready (readyz, gRPC health) so load balancers drain this router first."""
        self._stopping = True
        self._notify_ready()

    def add_ready_listener(self, listener: Callable[[bool], None]) -> None:
        self._ready_listeners.append(listener)
        listener(self.ready)

    def on_snapshot(self, snap: Snapshot) -> None:
        super().on_snapshot(snap)
        self._notify_ready()

    def _notify_ready(self) -> None:
        ready = self.ready
        if ready != self._ready:
            self._ready = ready
            for listener in self._ready_listeners:
                listener(ready)

    def _replica_gauges(self) -> list[ReplicaGauge]:
        snap = self.metadata.current
        now = self.clock_ms()
        out = []
        for replicas in snap.replicas.values():
            for r in replicas:
                if r.reported:
                    c = self.views.estimate(r, now)
                    out.append(ReplicaGauge(r.table, r.partition, r.node, r.role.value, r.alive,
                                            c.lag_offsets, c.staleness_ms))
        return out

    def _metadata_age_s(self) -> float:
        snap = self.metadata.current
        return max(0, self.clock_ms() - snap.built_ms) / 1000 if snap.loaded else float("nan")

"""Where a client's read goes: to the store nodes while its metadata lists tables (or it has no router to ask
instead), else — or when they could not answer it — to the router, counted, with why kept for the caller."""

from __future__ import annotations

from typing import Awaitable, Callable, TypeVar

from freshroute.routing.core import RoutingCore

from freshroute.client.metrics import ClientMetrics
from freshroute.client.router import FALL_BACK, RouterHttp

R = TypeVar("R")


class Fallback:
    """A started client's choice between its store nodes and its router, one read at a time."""

    def __init__(self, core: RoutingCore, router: RouterHttp | None, metrics: ClientMetrics | None) -> None:
        self.core = core
        self.router = router
        self.metrics = metrics
        self.cause: str | None = None  # why the latest read that went to the router did not read the nodes

    def direct(self) -> bool:
        """Whether to read the store nodes (else the router): a snapshot with tables is loaded."""
        snap = self.core.metadata.current
        return snap.loaded and bool(snap.tables) or self.router is None

    def via(self, operation: str, cause: BaseException | None = None) -> RouterHttp:
        """The router, for a read the store nodes did not answer (``cause``) or with no metadata to find them,
        counted; why is kept in :attr:`cause`."""
        assert self.router is not None, "direct() is True without a router"
        if self.metrics is not None:
            self.metrics.fell_back(operation)
        if cause is not None:
            self.cause = str(cause)
        else:
            self.cause = "the metadata store lists no tables" if self.core.metadata.current.loaded \
                else self.core.not_loaded()
        return self.router

    async def read(self, operation: str, direct: Callable[[], Awaitable[R]],
                   routed: Callable[[RouterHttp], Awaitable[R]]) -> R:
        """A read from the store nodes (``direct``), or through the router when they cannot answer or are unknown.
        The caller notes what it answered as seen, where it has a position."""
        cause = None
        if self.direct():
            try:
                return await direct()
            except FALL_BACK as e:
                if self.router is None:
                    raise
                cause = e
        return await routed(self.via(operation, cause))

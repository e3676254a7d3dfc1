"""What one router process holds: a Redis client, the metadata refresher, the store client and the :class:`Router`."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from freshroute.routing.refresher import MetadataRefresher
from freshroute.routing.snapshot import Snapshot
from freshroute.routing.store import StoreClient, StoreNodeClient
from router.routing import Router
from router.settings import RouterSettings


class RouterRuntime:
    """Redis client, metadata refresher, store client and :class:`Router` of one process."""

    def __init__(self, settings: RouterSettings, *, store: StoreClient | None = None, redis_client: Any = None) -> None:
        self.settings = settings
        self.redis = redis_client if redis_client is not None else _redis(settings)
        self.store = store if store is not None else StoreNodeClient(access=settings.node_access())
        self.refresher = MetadataRefresher(self.redis, settings.namespace, settings.refresh_ms, settings.node_expiry_ms,
                                           settings.redis_timeout_ms, settings.redis_reset_grace_ms,
                                           on_swap=self._on_swap)
        self.router = Router(settings, self.refresher, self.store)
        self.snapshot_listeners: list[Callable[[Snapshot], None]] = []  # told of every snapshot after the router
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _on_swap(self, snap: Snapshot) -> None:
        self.router.on_snapshot(snap)
        for listener in self.snapshot_listeners:
            listener(snap)

    async def start(self) -> None:
        """Load a first snapshot (if Redis answers) and keep refreshing in the background."""
        await self.refresher.refresh_once()
        self._task = asyncio.create_task(self.refresher.run(self._stop), name="metadata-refresh")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        await self.store.close()
        await self.redis.aclose()


def _redis(settings: RouterSettings) -> Any:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    timeout_s = settings.redis_timeout_ms / 1000
    # No client-side retries: a failed refresh is simply retried at the next tick, and
    # retries with backoff would only stretch one refresh across several.
    return settings.redis().async_client(timeout_s, retry=Retry(NoBackoff(), 0))

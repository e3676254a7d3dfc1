"""Where a client learns the cluster from: the metadata store (Redis, or Redis Sentinel) or, without one, a router —
kept fresh in the background, and the first snapshot waited for by reads, up to ``connect_timeout_s``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

from redis.connection import parse_url

from freshroute.errors import ConfigError
from freshroute.redis_location import RedisLocation, parse_sentinels
from freshroute.routing.refresher import MetadataRefresher
from freshroute.routing.snapshot import Snapshot, SnapshotSource

from freshroute.client.router import RouterHttp, RouterMetadata


def metadata_store(url: str | None, sentinels: str | None, master_name: str | None) -> RedisLocation:
    """Where the metadata store is; an address that can never work fails now, naming the argument."""
    try:
        where = RedisLocation(url or RedisLocation.url, parse_sentinels(sentinels or ""), master_name or "")
    except ValueError as e:  # a malformed address, or sentinels without a master name (or the reverse)
        raise ConfigError(f"redis_sentinels: {e}", setting="redis_sentinels") from None
    try:
        parse_url(where.url)
    except ValueError as e:
        raise ConfigError(f"redis_url: {where.url!r}: {e}", setting="redis_url") from None
    return where


class MetadataFeed:
    """The client's routing metadata: read from ``redis`` (else from ``router``) every ``refresh_ms`` once started.

    Reads wait for the first snapshot up to ``connect_timeout_s`` from the start; with a router only for the first
    attempt, since the router answers meanwhile. The events are threading ones: the synchronous client waits on them
    from its callers' threads."""

    def __init__(self, redis: RedisLocation | None, namespace: str, refresh_ms: int, node_expiry_ms: int,
                 connect_timeout_s: float) -> None:
        self.redis = redis
        self._namespace = namespace
        self._refresh_ms = refresh_ms
        self._node_expiry_ms = node_expiry_ms
        self._connect_timeout_s = connect_timeout_s
        self._redis_client: Any = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loaded = threading.Event()  # the first snapshot is in
        self._attempted = threading.Event()  # the first attempt to read one is over, whatever its outcome
        self._wait_until = 0.0  # time.monotonic() until which a read waits for the first snapshot
        self._router = False

    def start(self, router: RouterHttp | None, on_swap: Callable[[Snapshot], None]) -> SnapshotSource:
        """Start keeping the metadata fresh in the background (from Redis, else ``router``); returns the source."""
        self._router = router is not None
        source: MetadataRefresher | RouterMetadata
        if self.redis is not None:
            self._redis_client = self.redis.async_client(0.5)
            source = MetadataRefresher(self._redis_client, self._namespace, self._refresh_ms, self._node_expiry_ms,
                                       on_swap=lambda snap: self._swapped(snap, on_swap),
                                       source=f"the metadata store (Redis, {self.redis})")
        else:
            assert router is not None
            source = RouterMetadata(router, max(self._refresh_ms, 250),
                                    on_swap=lambda snap: self._swapped(snap, on_swap))
        self._wait_until = time.monotonic() + self._connect_timeout_s
        self._task = asyncio.create_task(self._keep_fresh(source), name="freshroute-client-metadata")
        return source

    def _swapped(self, snap: Snapshot, on_swap: Callable[[Snapshot], None]) -> None:
        self._loaded.set()
        on_swap(snap)

    async def _keep_fresh(self, source: MetadataRefresher | RouterMetadata) -> None:
        try:
            await source.refresh_once()
        finally:
            self._attempted.set()
        await source.run(self._stop)

    def awaited(self) -> threading.Event | None:
        """What a read waits for before it starts (None: nothing, or the wait is over)."""
        if self._loaded.is_set() or time.monotonic() >= self._wait_until:
            return None
        awaited = self._attempted if self._router else self._loaded
        return None if awaited.is_set() else awaited

    def wait(self) -> None:
        """Block until the first snapshot, or until waiting for it is over."""
        awaited = self.awaited()
        if awaited is not None:
            awaited.wait(max(0.0, self._wait_until - time.monotonic()))

    async def ready(self) -> None:
        """Until the first snapshot is in, or waiting for it is over (on the client's loop)."""
        while self.awaited() is not None:
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self._redis_client is not None:
            await self._redis_client.aclose()

"""``AsyncClient``: reads straight from the store nodes' read ports through the routing core, on asyncio."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import replace
from typing import Any, AsyncIterator, Unpack, overload

import httpx

from freshroute.cluster_access import NodeAccess
from freshroute.errors import ClientClosed, ConfigError, FreshrouteError
from freshroute.bound import Bound, BoundArgs
from freshroute.routing.core import RoutingCore
from freshroute.routing.history import time_ms
from freshroute.routing.policy import RoutingPolicy
from freshroute.routing.results import ClusterView, KeyLocation, TableInfo
from freshroute.routing.snapshot import SnapshotSource
from freshroute.routing.store import StoreNodeClient
from freshroute.tls import ClientTLS

from freshroute.client.arguments import ScanRange, batch_keys
from freshroute.client.history import VersionedReads
from freshroute.client.compiled import CompiledReads, compiled_reads
from freshroute.client.fallback import Fallback
from freshroute.client.lookup import AsOfLookup, Lookup, Windows, scanned
from freshroute.client.metrics import ClientMetrics
from freshroute.client.metadata_feed import MetadataFeed, metadata_store
from freshroute.client.positions import Positions
from freshroute.client.router import FALL_BACK, RouterHttp, snapshot_from_router, table_infos



class AsyncClient(VersionedReads):
    """Reads a freshroute cluster's tables from its store nodes: one network hop, the freshest replica within the bound.

    Bootstrapped from the metadata store (``redis_url``, or ``redis_sentinels`` with
    ``redis_master_name`` for Redis Sentinel) or from a router (``router``); with both, metadata
    comes from Redis and the router answers when no store node can. A router with an auth file
    or TLS takes ``token``, ``ca`` (the CA to trust) and ``cert``/``key`` (mTLS); the same TLS settings reach
    the store nodes, and ``cluster_secret`` is presented to nodes that require it. ``metrics``, a
    prometheus_client ``CollectorRegistry``, gets the client's counters (:mod:`freshroute.client.metrics`).
    ``compiled`` (default True): key reads and batches take the compiled path where it is built
    (:mod:`freshroute.client.compiled`); False reads by the Python path alone.
    Use as ``async with AsyncClient(...) as client`` (or call :meth:`start` and :meth:`close`).
    """

    def __init__(self, redis_url: str | None = None, *, router: str | None = None, namespace: str = "freshroute",
                 redis_sentinels: str | None = None, redis_master_name: str | None = None,
                 token: str | None = None, ca: str | None = None, cert: str | None = None, key: str | None = None,
                 cluster_secret: str | None = None, policy: RoutingPolicy | None = None, refresh_ms: int = 150,
                 connect_timeout_s: float = 5.0, metrics: Any = None, monotonic: bool = True,
                 compiled: bool = True) -> None:
        if not redis_url and not redis_sentinels and not router:
            raise ConfigError("give redis_url or redis_sentinels (the metadata store) or router (a router's REST "
                              "address), or both", setting="redis_url")
        redis = metadata_store(redis_url, redis_sentinels, redis_master_name) if redis_url or redis_sentinels else None
        if router:
            url = httpx.URL(router)
            if url.scheme not in ("http", "https") or not url.host:
                raise ConfigError(f"router: {router!r} is not a router's address (http://HOST:PORT or https://…)",
                                  setting="router")
        self.policy = policy if policy is not None else RoutingPolicy()
        self._router_url = router
        self._token = token
        # Built here: a bad certificate file fails at construction, naming the argument. The same TLS
        # context serves the router.
        self.access = NodeAccess(cluster_secret or "", ClientTLS(ca, cert, key))
        self._feed = MetadataFeed(redis, namespace, refresh_ms, self.policy.node_expiry_ms, connect_timeout_s)
        self.metrics: ClientMetrics | None = ClientMetrics(metrics) if metrics is not None else None
        self.router: RouterHttp | None = None
        self.core: RoutingCore | None = None
        self._closed = False
        # Monotonic reads: the highest position read of each table-partition, sent with every later read.
        self.read_positions = Positions(keep=monotonic)
        self._fallback: Fallback | None = None
        self._compiled: CompiledReads | None = None
        self._use_compiled = compiled

    # ---- life ---------------------------------------------------------------------------

    async def start(self) -> "AsyncClient":
        """Start reading the metadata in the background and keep it fresh; returns at once.

        The first read waits for the first snapshot, up to ``connect_timeout_s`` from here (with a router, only for
        the first attempt: the router answers meanwhile); then reads fail as unavailable, naming the metadata store
        and why it did not answer, until it does."""
        if self._closed:
            raise ClientClosed("this client is closed: make a new one")
        if self.core is not None:
            return self
        if self._router_url:
            self.router = RouterHttp(self._router_url, self.policy.request_timeout_ms / 1000 + 1, self._token,
                                     self.access.ssl_context)
        metadata = self._feed.start(self.router, self._on_swap)
        self.core = RoutingCore(self.direct_policy, metadata, StoreNodeClient(access=self.access),
                                metrics=self.metrics.counts() if self.metrics is not None else None)
        self._fallback = Fallback(self.core, self.router, self.metrics)
        if self._use_compiled:
            self._compiled = compiled_reads(self.direct_policy, self.access,
                                            self.metrics.counts() if self.metrics is not None else None)
        if metadata.current.loaded and self._compiled is not None:
            self._compiled.update(metadata.current)
        return self

    def _on_swap(self, snap: Any) -> None:
        if self.core is not None:
            self.core.on_snapshot(snap)
        if self._compiled is not None:
            self._compiled.update(snap)

    async def _ready(self) -> RoutingCore:
        """The routing core, once the first snapshot is in or waiting for it is over."""
        core = self._core()
        await self._feed.ready()
        return core

    @property
    def metadata(self) -> SnapshotSource:
        return self._core().metadata

    async def close(self) -> None:
        """Stop refreshing and close every connection; the client refuses reads afterwards."""
        if self._closed:
            return
        self._closed = True
        await self._feed.close()
        if self._compiled is not None:
            self._compiled.close()
        if self.core is not None:
            await self.core.store.close()
        if self.router is not None:
            await self.router.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def wait_for_metadata(self) -> None:
        """Block until the first snapshot (see :meth:`start`): for callers on threads other than the client's loop."""
        self._feed.wait()

    def _core(self) -> RoutingCore:
        if self._closed:
            raise ClientClosed("this client is closed")
        if self.core is None:
            raise ClientClosed("this client is not started: use 'async with AsyncClient(...)' or await start()")
        return self.core

    @property
    def fallback(self) -> Fallback:
        """Where the next read goes (the client started: refused alike when not started or closed)."""
        self._core()
        assert self._fallback is not None
        return self._fallback

    @property
    def fallback_cause(self) -> str | None:
        """Why the latest read that went to the router did not read the store nodes."""
        return self._fallback.cause if self._fallback is not None else None

    @property
    def direct_policy(self) -> RoutingPolicy:
        """The policy of reads of the store nodes: with a router to fall back on, half the request timeout, so that
        the router has the other half when they do not answer."""
        if self._router_url is None:
            return self.policy
        return replace(self.policy, request_timeout_ms=max(1, self.policy.request_timeout_ms // 2))

    def deadline(self, bound: Bound, since: float | None = None) -> float:
        """When a read that starts now (or began ``since``) must have its answer, the router's included
        (``time.monotonic()``): the request timeout, or the caller's ``wait_ms`` for its events or position."""
        start = time.monotonic() if since is None else since
        return start + (bound.wait_ms or self.policy.request_timeout_ms) / 1000

    # ---- reads --------------------------------------------------------------------------

    @overload
    async def get(self, table: str, key: str, *, bound: Bound | None = None, as_of: None = None,
                  **limits: Unpack[BoundArgs]) -> Lookup: ...
    @overload
    async def get(self, table: str, key: str, *, bound: Bound | None = None, as_of: int | str | dt.datetime,
                  **limits: Unpack[BoundArgs]) -> AsOfLookup: ...
    @overload
    async def get(self, table: str, key: str, *, bound: Bound | None = None,
                  as_of: int | str | dt.datetime | None = None, **limits: Unpack[BoundArgs]) -> Lookup | AsOfLookup: ...

    async def get(self, table: str, key: str, *, bound: Bound | None = None,
            as_of: int | str | dt.datetime | None = None, **limits: Unpack[BoundArgs]) -> Lookup | AsOfLookup:
        """One key from the freshest replica within the bound; ``found`` False when the table has no such key.

        ``as_of`` (a versioned table; ms since the epoch, RFC 3339 text or an aware datetime): the key's value at that
        time, as an :class:`AsOfLookup` saying when it became and stopped being the key's, and whether it is final."""
        core = await self._ready()
        bound = self.read_positions.bound(table, bound, limits)
        name, table = table, core.resolved(table, bound)  # the version read: its input lag and format label the answer
        compiled, since = self._compiled, time.monotonic()  # a compiled attempt and what follows it share one budget
        if as_of is None and compiled is not None and self.fallback.direct():
            pending = compiled.get(name, table, key, bound)
            if pending is not None and (answer := await pending) is not None:
                return self.read_positions.seen(answer)
        deadline = self.deadline(bound, since)
        if as_of is not None:
            return await self._as_of(core, table, key, time_ms("as_of", as_of), bound, deadline)
        cause = None
        if self.fallback.direct():
            try:
                result = Lookup.of(await core.get(table, key, bound, since), core.input_lag(table),
                                   core.value_format(table))
            except FALL_BACK as e:
                if self.router is None:
                    raise
                cause = e
            else:
                return self.read_positions.seen(result)
        return self.read_positions.seen(await self.fallback.via("get", cause).get(table, key, bound, deadline))

    async def get_many(self, table: str, keys: list[str], *, bound: Bound | None = None,
                       as_of: int | str | dt.datetime | None = None, **limits: Unpack[BoundArgs]) -> list[Any]:
        """Many keys, one group per partition in parallel; in request order, a key that could not be read as its error.

        ``as_of`` (a versioned table): each key's value at that time, an :class:`AsOfLookup` (see :meth:`get`)."""
        core = await self._ready()
        bound = self.read_positions.bound(table, bound, limits)
        name, table = table, core.resolved(table, bound)
        keys = batch_keys(keys)
        compiled, since = self._compiled, time.monotonic()
        if as_of is None and compiled is not None and self.fallback.direct():
            batch = compiled.get_many(name, table, keys, bound)
            if batch is not None and (answers := await batch) is not None:
                return self.read_positions.seen_all(answers)
        deadline = self.deadline(bound, since)
        if as_of is not None:
            return self.read_positions.seen_all(await self._many_as_of(core, table, keys, time_ms("as_of", as_of), bound, deadline))
        cause = None
        if self.fallback.direct():
            lag, fmt = core.input_lag(table), core.value_format(table)
            results = await core.batch_get(table, keys, bound, Lookup.group if not lag[0] and fmt == "json" else
                                           lambda t, k, p, c, a: Lookup.group(t, k, p, c, a, lag, fmt), since)
            cause = next((r for r in results if isinstance(r, FALL_BACK)), None)
            if self.router is None or cause is None:
                return self.read_positions.seen_all(results)
        return self.read_positions.seen_all(await self.fallback.via("get_many", cause).get_many(table, keys, bound, deadline))

    async def windows(self, table: str, key: str, *, from_ms: int, to_ms: int, bound: Bound | None = None,
                **limits: Unpack[BoundArgs]) -> Windows:
        """A windowed table's windows of ``key`` whose start is in ``[from_ms, to_ms)``, from one replica within the
        bound."""
        core = await self._ready()
        bound = self.read_positions.bound(table, bound, limits)
        table = core.resolved(table, bound)
        deadline = self.deadline(bound)

        async def direct() -> Windows:
            return Windows.of(await core.windows(table, key, from_ms, to_ms, bound), core.input_lag(table))

        return self.read_positions.seen(await self.fallback.read("windows", direct,
                                          lambda router: router.windows(table, key, from_ms, to_ms, bound, deadline)))

    async def scan(self, table: str, *, prefix: str | None = None, start: str | None = None, end: str | None = None,
                   limit: int | None = None, page_size: int | None = None, bound: Bound | None = None,
                   as_of: int | str | dt.datetime | None = None, **limits: Unpack[BoundArgs]) -> AsyncIterator[Any]:
        """Rows in ascending key order (at most ``limit``), fetched a page at a time as the iteration needs them.

        ``as_of`` (a versioned table): the keys present at that time, each an :class:`AsOfLookup` (see :meth:`get`)."""
        bound = self.read_positions.bound(table, bound, limits)
        as_of_ms = None if as_of is None else time_ms("as_of", as_of)
        r = ScanRange.of(prefix, start, end, limit, page_size, self.policy.scan_max_limit)
        token: str | None = None
        sent = 0
        while (size := r.next_page(sent)) is not None:
            items, token = await self.scan_page(table, r.prefix, r.start, r.end, size, token, bound, as_of_ms)
            self.read_positions.seen_all(items)
            for item in items:
                yield item
            sent += len(items)
            if token is None:
                return

    async def scan_page(self, table: str, prefix: str, start: str, end: str, limit: int | None, page_token: str | None,
                        bound: Bound, as_of_ms: int | None = None) -> tuple[list[Lookup | AsOfLookup], str | None]:
        """One page of a scan (as of a time: of a versioned table), and the token of the next (None: the last page)."""
        core = await self._ready()
        table = core.resolved(table, bound)

        async def direct() -> tuple[list[Lookup | AsOfLookup], str | None]:
            page = await core.scans.rows(table, prefix, start, end, limit, page_token, bound, as_of_ms)
            return scanned(page, core.input_lag(table), core.value_format(table)), page.next_page_token

        return await self.fallback.read("scan", direct, lambda router: router.scan_page(
            table, prefix, start, end, limit, page_token, bound, as_of_ms))

    # ---- metadata -----------------------------------------------------------------------

    async def key_metadata(self, table: str, key: str) -> KeyLocation:
        """The key's partition, its active replica and its standbys, each with lag."""
        core = await self._ready()
        if self.fallback.direct():
            return core.views.key_metadata(table, key)
        assert self.router is not None
        return await self.router.key_metadata(table, key)

    async def tables(self) -> list[TableInfo]:
        core = await self._ready()
        if self.fallback.direct():
            return core.views.list_tables()
        assert self.router is not None
        body = await self.router.ok("GET", "/v1/tables")
        return table_infos(snapshot_from_router(body, {"nodes": []}, 0), body)

    async def cluster(self) -> ClusterView:
        core = await self._ready()
        if self.fallback.direct():
            return core.views.cluster()
        assert self.router is not None
        return ClusterView.from_dict(await self.router.ok("GET", "/v1/cluster"))

    def session(self) -> "AsyncSession":
        """Reads that never go backwards: each sends the highest position this session has seen as ``min_position``."""
        return AsyncSession(self)


class AsyncSession:
    """Monotonic reads over an :class:`AsyncClient`: per table-partition, never older than what it has seen."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.positions = Positions()

    async def get(self, table: str, key: str, *, bound: Bound | None = None, **limits: Unpack[BoundArgs]) -> Lookup:
        r = await self.client.get(table, key, bound=self.positions.bound(table, bound, limits))
        self.positions.saw([r])
        return r

    async def get_many(self, table: str, keys: list[str], *, bound: Bound | None = None,
                       **limits: Unpack[BoundArgs]) -> list[Any]:
        out = await self.client.get_many(table, keys, bound=self.positions.bound(table, bound, limits))
        self.positions.saw([r for r in out if not isinstance(r, FreshrouteError)])
        return out

    async def windows(self, table: str, key: str, *, from_ms: int, to_ms: int, bound: Bound | None = None,
                      **limits: Unpack[BoundArgs]) -> Windows:
        r = await self.client.windows(table, key, from_ms=from_ms, to_ms=to_ms, bound=self.positions.bound(table, bound, limits))
        self.positions.saw([r])
        return r

    async def scan(self, table: str, *, prefix: str | None = None, start: str | None = None, end: str | None = None,
                   limit: int | None = None, page_size: int | None = None, bound: Bound | None = None,
                   **limits: Unpack[BoundArgs]) -> AsyncIterator[Lookup]:
        async for r in self.client.scan(table, prefix=prefix, start=start, end=end, limit=limit, page_size=page_size,
                                         bound=self.positions.bound(table, bound, limits)):
            self.positions.saw([r])
            yield r


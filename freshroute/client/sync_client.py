"""``Client``: the synchronous, thread-safe client.

Gets, batches and window lookups run on the calling thread — the attempt engine driven over blocking
sockets, no thread hop — each thread with routing state of its own (load, latency, lag
seen), so nothing mutable is shared between threads but the immutable metadata snapshot.
A background thread runs an :class:`AsyncClient` for what is not on the hot path: keeping
the snapshot fresh, scans, and the router fallback.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from concurrent.futures import Future
from typing import Any, Coroutine, Iterator, TypeVar, Unpack, overload

from freshroute.errors import ClientClosed, FreshrouteError
from freshroute.bound import Bound, BoundArgs
from freshroute.routing.answers import lookup_result
from freshroute.routing.attempts import AttemptPlan
from freshroute.routing.core import RoutingCore
from freshroute.routing.counts import count, count_group
from freshroute.routing.history import time_ms
from freshroute.routing.policy import RoutingPolicy
from freshroute.routing.results import ClusterView, KeyLocation, TableInfo
from freshroute.routing.selection import Candidate

from freshroute.client.arguments import ScanRange, batch_keys
from freshroute.client.async_client import AsyncClient
from freshroute.client.blocking import R, BlockingStore, Request, run_blocking
from freshroute.client.compiled_blocking import BlockingCompiledReads, blocking_compiled_reads
from freshroute.client.lookup import AsOfLookup, KeyVersions, Lookup, Windows
from freshroute.client.positions import Positions
from freshroute.client.router import FALL_BACK

T = TypeVar("T")


def _read_one(store: BlockingStore, plan: AttemptPlan, request: Request[R]) -> tuple[Candidate, R]:
    """One read on the calling thread: the replica's answer, or its typed error raised."""
    answer = run_blocking(store, [(plan, request)])[0]
    if isinstance(answer, FreshrouteError):
        raise answer
    return answer


class Client:
    """Reads a freshroute cluster's tables from its store nodes (see :class:`AsyncClient`), from any number of threads.

    ``with Client(redis_url="redis://…") as client: client.get("table", "key")``

    ``compiled`` (default True): key reads and batches take the compiled path where it is built, on the calling
    thread (:mod:`freshroute.client.compiled_blocking`); False reads by the Python path alone.
    """

    def __init__(self, redis_url: str | None = None, *, router: str | None = None, namespace: str = "freshroute",
                 redis_sentinels: str | None = None, redis_master_name: str | None = None,
                 token: str | None = None, ca: str | None = None, cert: str | None = None, key: str | None = None,
                 cluster_secret: str | None = None, policy: RoutingPolicy | None = None, refresh_ms: int = 150,
                 connect_timeout_s: float = 5.0, metrics: Any = None, monotonic: bool = True,
                 compiled: bool = True) -> None:
        self._async = AsyncClient(redis_url, router=router, namespace=namespace, redis_sentinels=redis_sentinels,
                                  redis_master_name=redis_master_name, token=token, ca=ca, cert=cert, key=key,
                                  cluster_secret=cluster_secret, policy=policy, refresh_ms=refresh_ms,
                                  connect_timeout_s=connect_timeout_s, metrics=metrics, monotonic=monotonic,
                                  compiled=False)  # this client reads on the calling thread, by its own drivers
        self.policy = self._async.policy
        self._positions = self._async.read_positions  # the async client's: one client, one memory of what it read
        self._local = threading.local()
        self._stores: list[BlockingStore | BlockingCompiledReads] = []
        self._use_compiled, self._connect_timeout_s = compiled, connect_timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="freshroute-client", daemon=True)
        self._thread.start()
        try:
            self._call(self._async.start())
        except BaseException:
            self.close()
            raise

    # ---- life ---------------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the background loop and wait for it."""
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result()

    def close(self) -> None:
        """Stop the background thread and close every connection; the client refuses reads afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            stores, self._stores = self._stores, []
        if self._thread.is_alive():
            try:
                self._call(self._async.close())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)
        self._loop.close()
        for store in stores:
            store.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def fallback_cause(self) -> str | None:
        """Why the latest read that the router answered did not read the store nodes (None: none did)."""
        return self._async.fallback_cause

    def _thread_core(self) -> tuple[RoutingCore, BlockingStore, BlockingCompiledReads | None]:
        if self._closed:
            raise ClientClosed("this client is closed")
        self._async.wait_for_metadata()
        mine = getattr(self._local, "core", None)
        if mine is None:
            metadata = self._async.metadata
            store = BlockingStore(metadata, self._async.access)
            # The core's own (asyncio) store is never used on this thread: reads go through ``store``.
            metrics = self._async.metrics.counts() if self._async.metrics is not None else None
            assert self._async.core is not None  # started: the client's constructor started it
            compiled = blocking_compiled_reads(self._async.direct_policy, self._async.access, metadata, metrics,
                                               self._connect_timeout_s) if self._use_compiled else None
            mine = self._local.core = (RoutingCore(self._async.direct_policy, metadata, self._async.core.store,
                                                   metrics=metrics),
                                       store, compiled)
            with self._lock:
                self._stores.append(store)
                if compiled is not None:
                    self._stores.append(compiled)
        return mine

    # ---- reads --------------------------------------------------------------------------

    @overload
    def get(self, table: str, key: str, *, bound: Bound | None = None, as_of: None = None,
            **limits: Unpack[BoundArgs]) -> Lookup: ...
    @overload
    def get(self, table: str, key: str, *, bound: Bound | None = None, as_of: int | str | dt.datetime,
            **limits: Unpack[BoundArgs]) -> AsOfLookup: ...
    @overload
    def get(self, table: str, key: str, *, bound: Bound | None = None, as_of: int | str | dt.datetime | None = None,
            **limits: Unpack[BoundArgs]) -> Lookup | AsOfLookup: ...

    def get(self, table: str, key: str, *, bound: Bound | None = None,
            as_of: int | str | dt.datetime | None = None, **limits: Unpack[BoundArgs]) -> Lookup | AsOfLookup:
        """One key from the freshest replica within the bound; ``found`` False when the table has no such key.

        ``as_of`` (a versioned table): the key's value at that time, an :class:`AsOfLookup` (see
        :meth:`AsyncClient.get`)."""
        if as_of is not None:
            return self._call(self._async.get(table, key, bound=bound, as_of=as_of, **limits))
        core, store, compiled = self._thread_core()
        bound = self._positions.bound(table, bound, limits)
        name, table = table, core.resolved(table, bound)  # the version read: its input lag and format label the answer
        since = time.monotonic()  # a compiled attempt and what follows it share one budget
        if compiled is not None and self._async.fallback.direct() and \
                (lookup := compiled.get(name, table, key, bound)) is not None:
            return self._positions.seen(lookup)
        deadline = self._async.deadline(bound, since)
        cause = None
        if self._async.fallback.direct():
            started = time.perf_counter()
            try:
                spec, raw_key, plan = core.plan_get(table, key, bound, time.monotonic(), since)
                answer = _read_one(store, plan, Request.get(table, plan.partition, raw_key, plan.bound))
            except FreshrouteError as e:
                count(core.metrics, started, e)
                if self._async.router is None or not isinstance(e, FALL_BACK):
                    raise
                cause = e
            else:
                cand, read = answer
                result = count(core.metrics, started, lookup_result(table, key, plan.partition, cand, read))
                return self._positions.seen(Lookup.of(result, core.input_lag(table), core.value_format(table)))
        # The store nodes were tried once, here: straight to the router, not through the async client's own attempt.
        router = self._async.fallback.via("get", cause)
        return self._positions.seen(self._call(router.get(table, key, bound, deadline)))

    def get_many(self, table: str, keys: list[str], *, bound: Bound | None = None,
                 as_of: int | str | dt.datetime | None = None, **limits: Unpack[BoundArgs]) -> list[Any]:
        """Many keys, one group per partition at once; in request order, a key that could not be read as its error.

        ``as_of`` (a versioned table): each key's value at that time, an :class:`AsOfLookup` (see
        :meth:`AsyncClient.get`)."""
        if as_of is not None:
            return self._call(self._async.get_many(table, keys, bound=bound, as_of=as_of, **limits))
        core, store, compiled = self._thread_core()
        bound = self._positions.bound(table, bound, limits)
        name, table = table, core.resolved(table, bound)
        keys = batch_keys(keys)
        since = time.monotonic()
        if compiled is not None and self._async.fallback.direct() and \
                (read := compiled.get_many(name, table, keys, bound)) is not None:
            return self._positions.seen_all(read)
        deadline = self._async.deadline(bound, since)
        cause = None
        if self._async.fallback.direct():
            started = time.perf_counter()
            spec, resolved, groups, raw_keys = core.group_keys(table, keys, bound)
            now = time.monotonic()
            direct_deadline = core.deadline(now, since)
            jobs = [(core.plan_group(table, p, resolved, now, direct_deadline),
                     Request.group(table, p, [raw_keys[i] for i in idx], resolved)) for p, idx in groups.items()]
            out: list[Lookup | FreshrouteError | None] = [None] * len(keys)
            lag, fmt = core.input_lag(table), core.value_format(table)
            answers = run_blocking(store, jobs)
            elapsed = time.perf_counter() - started
            for (p, idx), answer in zip(groups.items(), answers):
                count_group(core.metrics, answer, len(idx), elapsed)
                if isinstance(answer, FreshrouteError):
                    for i in idx:
                        out[i] = answer
                else:
                    cand, group = answer
                    for i, r in zip(idx, Lookup.group(table, [keys[i] for i in idx], p, cand, group, lag, fmt)):
                        out[i] = r
            cause = next((r for r in out if isinstance(r, FALL_BACK)), None)
            if self._async.router is None or cause is None:
                return self._positions.seen_all(out)
        router = self._async.fallback.via("get_many", cause)
        return self._positions.seen_all(self._call(router.get_many(table, keys, bound, deadline)))

    def scan(self, table: str, *, prefix: str | None = None, start: str | None = None, end: str | None = None,
             limit: int | None = None, page_size: int | None = None, bound: Bound | None = None,
             as_of: int | str | dt.datetime | None = None, **limits: Unpack[BoundArgs]) -> Iterator[Any]:
        """Rows in ascending key order (at most ``limit``), fetched a page at a time as the iteration needs them.

        ``as_of`` (a versioned table): the keys present at that time, each an :class:`AsOfLookup`."""
        self._thread_core()
        bound = self._positions.bound(table, bound, limits)
        as_of_ms = None if as_of is None else time_ms("as_of", as_of)
        r = ScanRange.of(prefix, start, end, limit, page_size, self.policy.scan_max_limit)
        token: str | None = None
        sent = 0
        while (size := r.next_page(sent)) is not None:
            items, token = self._call(self._async.scan_page(table, r.prefix, r.start, r.end, size, token, bound,
                                                            as_of_ms))
            yield from self._positions.seen_all(items)
            sent += len(items)
            if token is None:
                return

    def versions(self, table: str, key: str, **kw: Any) -> KeyVersions:
        """A page of a versioned table's versions of ``key``, newest first (see :meth:`AsyncClient.versions`)."""
        return self._call(self._async.versions(table, key, **kw))

    def windows(self, table: str, key: str, *, from_ms: int, to_ms: int, bound: Bound | None = None,
                **limits: Unpack[BoundArgs]) -> Windows:
        """A windowed table's windows of ``key`` whose start is in ``[from_ms, to_ms)``, from one replica within the
        bound."""
        core, store, _ = self._thread_core()
        bound = self._positions.bound(table, bound, limits)
        table = core.resolved(table, bound)
        deadline = self._async.deadline(bound)
        cause = None
        if self._async.fallback.direct():
            started = time.perf_counter()
            try:
                r = core.plan_windows(table, key, from_ms, to_ms, bound, time.monotonic())
                plan = r.plan
                answer = _read_one(store, plan, Request.range(table, plan.partition, r.lo, r.hi, r.limit, r.live,
                                                              plan.bound))
            except FreshrouteError as e:
                count(core.metrics, started, e)
                if self._async.router is None or not isinstance(e, FALL_BACK):
                    raise
                cause = e
            else:
                result = count(core.metrics, started, r.result(*answer))
                return self._positions.seen(Windows.of(result, core.input_lag(table)))
        router = self._async.fallback.via("windows", cause)
        return self._positions.seen(self._call(router.windows(table, key, from_ms, to_ms, bound, deadline)))

    # ---- metadata -----------------------------------------------------------------------

    def key_metadata(self, table: str, key: str) -> KeyLocation:
        """The key's partition, its active replica and its standbys, each with lag."""
        self._thread_core()
        return self._call(self._async.key_metadata(table, key))

    def tables(self) -> list[TableInfo]:
        self._thread_core()
        return self._call(self._async.tables())

    def cluster(self) -> ClusterView:
        self._thread_core()
        return self._call(self._async.cluster())

    def session(self) -> "Session":
        """Reads that never go backwards: each sends the highest position this session has seen as ``min_position``."""
        return Session(self)


class Session:
    """Monotonic reads over a :class:`Client`: per table-partition, never older than what it has seen (thread-safe)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.positions = Positions()

    def get(self, table: str, key: str, *, bound: Bound | None = None, **limits: Unpack[BoundArgs]) -> Lookup:
        r = self.client.get(table, key, bound=self.positions.bound(table, bound, limits))
        self.positions.saw([r])
        return r

    def get_many(self, table: str, keys: list[str], *, bound: Bound | None = None,
                 **limits: Unpack[BoundArgs]) -> list[Any]:
        out = self.client.get_many(table, keys, bound=self.positions.bound(table, bound, limits))
        self.positions.saw([r for r in out if not isinstance(r, FreshrouteError)])
        return out

    def windows(self, table: str, key: str, *, from_ms: int, to_ms: int, bound: Bound | None = None,
                **limits: Unpack[BoundArgs]) -> Windows:
        r = self.client.windows(table, key, from_ms=from_ms, to_ms=to_ms, bound=self.positions.bound(table, bound, limits))
        self.positions.saw([r])
        return r

    def scan(self, table: str, *, prefix: str | None = None, start: str | None = None, end: str | None = None,
             limit: int | None = None, page_size: int | None = None, bound: Bound | None = None,
             **limits: Unpack[BoundArgs]) -> Iterator[Lookup]:
        for r in self.client.scan(table, prefix=prefix, start=start, end=end, limit=limit, page_size=page_size,
                                   bound=self.positions.bound(table, bound, limits)):
            self.positions.saw([r])
            yield r


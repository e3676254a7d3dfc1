"""Routing of reads: key → partition → ordered replicas → attempts with failover and hedging.

REST and gRPC are thin adapters over :class:`Router`; everything they serve is decided here,
so both speak the same semantics and raise the same errors.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from functools import lru_cache
from itertools import islice
from typing import Any, Callable, Iterator

from freshroute.errors import (FreshrouteError, InvalidArgument, LookupTimeout, NoReplicaWithinBound,
                               ReplicaUnavailable, TableNotFound)
from freshroute.keys import deserialize_key, partition_for, serialize_key
from freshroute.metadata import Role, TableSpec, now_ms

from router.bounds import NO_BOUND, Bound
from router.metrics import ReplicaGauge, RouterMetrics
from router.results import (KeyLocation, LookupResult, ReplicaInfo, ScanPage, TableInfo, decode_page_token,
                            encode_page_token)
from router.selection import Candidate, FreshestFirst, LoadTracker, ReplicaSelector, Selection
from router.settings import RouterSettings
from router.snapshot import LagOverlay, ReplicaView, Snapshot, SnapshotSource
from router.store_client import ReadResult, ReadStatus, ReplicaStatus, StoreBound, StoreClient


class LatencyWindow:
    """Recent attempt latencies, for the hedging threshold (a quantile recomputed every few samples)."""

    def __init__(self, quantile: float, size: int = 512, every: int = 64, min_samples: int = 32) -> None:
        self._q = quantile
        self._buf = [0.0] * size
        self._n = 0
        self._every = every
        self._min = min_samples
        self.value_ms: float | None = None

    def record(self, ms: float) -> None:
        self._buf[self._n % len(self._buf)] = ms
        self._n += 1
        if self._n >= self._min and self._n % self._every == 0:
            filled = sorted(self._buf[: min(self._n, len(self._buf))])
            self.value_ms = filled[min(len(filled) - 1, int(self._q * len(filled)))]


# Event-loop timers may fire a hair early; a wake-up this close to its time counts as on time.
_TIMER_SLACK_S = 0.0005


def _outcome(e: FreshrouteError) -> str:
    if isinstance(e, NoReplicaWithinBound):
        return "no_replica"
    if isinstance(e, LookupTimeout):
        return "timeout"
    if isinstance(e, ReplicaUnavailable):
        return "unavailable"
    if isinstance(e, InvalidArgument):
        return "invalid"
    if isinstance(e, TableNotFound):
        return "table_not_found"
    return "error"


async def _first_done(loop: asyncio.AbstractEventLoop, futs: dict[asyncio.Future[ReadResult], Any],
                      timeout_s: float) -> list[asyncio.Future[ReadResult]]:
    """Futures done after at most ``timeout_s``; returns at once if any already is.

    A lean ``asyncio.wait(FIRST_COMPLETED)``: that one costs about as much as the rest of a lookup.
    """
    done = [f for f in futs if f.done()]
    if done or timeout_s <= 0:
        return done
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(timeout_s, wake)
    for f in futs:
        f.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        for f in futs:
            f.remove_done_callback(wake)
    return [f for f in futs if f.done()]


@lru_cache(maxsize=65536)
def _locate(key: str, partitions: int) -> tuple[bytes, int]:
    # murmur2 in Python costs more than the rest of the key handling: hot keys are hashed once.
    raw = serialize_key(key)
    return raw, partition_for(raw, partitions)


_UNBOUNDED = StoreBound()


def _store_bound(bound: Bound, min_offset: int) -> StoreBound:
    if bound.max_lag is None and bound.max_staleness_ms is None and not min_offset:
        return _UNBOUNDED
    return StoreBound(bound.max_lag, bound.max_staleness_ms, min_offset)


_RETRY_REASON = {ReadStatus.TOO_STALE: "too_stale", ReadStatus.NOT_HOSTED: "not_hosted", ReadStatus.ERROR: "error"}


def _attempt_order(selection: Selection, tried: "_Attempts") -> Iterator[Candidate]:
    """The candidates, then — if every one failed without saying it was too stale — the fallback."""
    yield from selection.candidates
    if selection.candidates and not tried.stale:
        yield from selection.fallback


class _Attempts:
    """What went wrong with one read so far, for the error the caller gets if nothing succeeds."""

    __slots__ = ("stale", "failures", "last_reason")

    def __init__(self) -> None:
        self.stale: list[ReplicaStatus] = []
        self.failures: list[dict[str, str]] = []
        self.last_reason = "unavailable"


class Router:
    """Routes reads for REST and gRPC alike, over a metadata snapshot and a store client."""

    def __init__(self, settings: RouterSettings, metadata: SnapshotSource, store: StoreClient, *,
                 selector: ReplicaSelector | None = None, metrics: RouterMetrics | None = None,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        self.settings = settings
        self.metadata = metadata
        self.store = store
        self.metrics = metrics if metrics is not None else RouterMetrics()
        self.overlay = LagOverlay()
        self.load = LoadTracker(settings.failure_backoff_ms, clock_ms=clock_ms)
        self._freshest = FreshestFirst(self.load, self.overlay, settings.freshness_tolerance_offsets,
                                       settings.freshness_tolerance_ms, settings.view_trust_ms, clock_ms)
        self.selector: ReplicaSelector = selector if selector is not None else self._freshest
        self._clock_ms = clock_ms
        self._timeout_s = settings.request_timeout_ms / 1000
        self._attempt_s = settings.attempt_timeout_ms / 1000
        self._hedge = settings.hedge
        self._hedge_budget = settings.hedge_budget
        self._latency = LatencyWindow(settings.hedge_quantile)
        self._hedge_tokens = 0.0
        self._ready_listeners: list[Callable[[bool], None]] = []
        self._ready = False
        self._stopping = False
        self.metrics.watch(self._replica_gauges, self._metadata_age_s,
                           lambda: bool(getattr(self.metadata, "redis_ok", self.metadata.current.loaded)))

    # ---- metadata ----------------------------------------------------------------------

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
        """Called after each swap: drop what the new snapshot no longer names."""
        self.store.track({n.address: n.read_address for n in snap.nodes.values()})
        # Heartbeats published since then carry newer lag than these responses did.
        self.overlay.prune(snap.built_ms - 2 * self.settings.node_expiry_ms)
        self._notify_ready()

    def _notify_ready(self) -> None:
        ready = self.ready
        if ready != self._ready:
            self._ready = ready
            for listener in self._ready_listeners:
                listener(ready)

    def table(self, name: str) -> TableSpec:
        snap = self.metadata.current
        spec = snap.tables.get(name)
        if spec is None:
            if not snap.loaded:
                raise ReplicaUnavailable("routing metadata has not been loaded from Redis yet", table=name)
            raise TableNotFound(f"no table {name!r}", table=name)
        return spec

    def bound_for(self, spec: TableSpec, bound: Bound) -> Bound:
        """The caller's bound with the table's defaults (router settings over the table spec) filled in."""
        override = self.settings.table_bounds.get(spec.name)
        if override is not None:
            return bound.with_defaults(override.max_lag, override.max_staleness_ms)
        return bound.with_defaults(spec.default_max_lag, spec.default_max_staleness_ms)

    def partition_of(self, spec: TableSpec, key: str) -> int:
        return _locate(key, spec.partitions)[1]

    # ---- single key --------------------------------------------------------------------

    async def get(self, table: str, key: str, bound: Bound = NO_BOUND) -> LookupResult:
        """Read one key from the freshest live replica within the bound; ``found`` False if absent."""
        started = time.perf_counter()
        try:
            spec = self.table(table)
            raw_key, partition = _locate(key, spec.partitions)
            result = await self._read_key(spec, key, raw_key, partition, self.bound_for(spec, bound))
        except FreshrouteError as e:
            self.metrics.lookup(_outcome(e), "none", time.perf_counter() - started)
            raise
        self.metrics.lookup("ok" if result.found else "not_found", result.role, time.perf_counter() - started)
        return result

    async def _read_key(self, spec: TableSpec, key: str, raw_key: bytes, partition: int, bound: Bound) -> LookupResult:
        table = spec.name
        min_offset = bound.min_offset(partition)
        selection = self.selector.select(self.metadata.current.replicas_of(table, partition), bound, min_offset)
        cands = selection.candidates
        if not cands:
            raise self._no_replica(table, partition, bound, selection, [])
        store_bound = _store_bound(bound, min_offset)
        self._hedge_tokens = min(10.0, self._hedge_tokens + self._hedge_budget)
        first = cands[0]
        fut = self._start_read(first, table, partition, raw_key, store_bound)
        # The future's loop, not asyncio.get_running_loop(): on Python 3.11 that one makes a
        # getpid() system call on every lookup.
        loop = fut.get_loop()
        started = loop.time()
        inflight: dict[asyncio.Future[ReadResult], tuple[Candidate, float]] = {fut: (first, started)}
        tried = _Attempts()
        try:
            # The usual case, kept lean because it is most of the router's work per lookup: the
            # first replica answers before a retry or a hedge is due.
            if not fut.done():
                wait = self._timeout_s
                if len(cands) > 1:
                    wait = self._attempt_s
                    if self._hedge and self._hedge_tokens >= 1.0:
                        wait = min(wait, self._hedge_delay_s())
                # Until the answer or the wait is over (inline: this runs for every lookup).
                waiter = loop.create_future()

                def wake(_: object = None) -> None:
                    if not waiter.done():
                        waiter.set_result(None)

                timer = loop.call_later(wait, wake)
                fut.add_done_callback(wake)
                try:
                    await waiter
                finally:
                    timer.cancel()
                    fut.remove_done_callback(wake)
            if fut.done():
                del inflight[fut]
                result = self._settle(fut, first, (loop.time() - started) * 1000, tried)
                if result is not None:
                    return self._lookup_result(spec, key, partition, first, result)
            return await self._keep_trying(spec, key, raw_key, partition, bound, selection, store_bound, started,
                                           inflight, tried)
        finally:
            for pending, (cand, _) in inflight.items():
                if not pending.done():
                    pending.cancel()
                elif not pending.cancelled():
                    pending.exception()  # a loser's failure is expected; retrieving it keeps asyncio quiet
                self.load.finished(cand.replica.node, None)

    async def _keep_trying(self, spec: TableSpec, key: str, raw_key: bytes, partition: int, bound: Bound,
                           selection: Selection, store_bound: StoreBound, started: float,
                           inflight: dict[asyncio.Future[ReadResult], tuple[Candidate, float]],
                           tried: _Attempts) -> LookupResult:
        """After the first attempt: retries, hedges and the fallback, until an answer or the deadline.

        ``inflight`` holds the first attempt if it is still running; attempts left in it when
        this returns or raises are the caller's to cancel.
        """
        table = spec.name
        cands = selection.candidates
        loop = asyncio.get_running_loop()
        deadline = started + self._timeout_s
        hedge_after = self._hedge_delay_s()
        launched = 1
        last_launch = started
        hedged = False

        def launch(reason: str) -> None:
            nonlocal launched, last_launch
            cand = cands[launched]
            launched += 1
            last_launch = loop.time()
            self.metrics.retry(reason)
            inflight[self._start_read(cand, table, partition, raw_key, store_bound)] = (cand, last_launch)

        # Bounded: each pass launches an attempt, settles one, or ends at the deadline.
        for _ in range(4 * (len(cands) + len(selection.fallback)) + 8):
            now = loop.time()
            if now >= deadline:
                break
            if not inflight:
                if launched == len(cands):
                    if tried.stale or len(cands) > len(selection.candidates) or not selection.fallback:
                        raise self._exhausted(table, partition, bound, selection, tried)
                    cands = [*cands, *selection.fallback]
                launch(tried.last_reason)
                continue
            wake = deadline
            can_hedge = False
            if launched < len(cands):
                wake = min(wake, last_launch + self._attempt_s)
                can_hedge = self._hedge and not hedged and len(inflight) == 1 and self._hedge_tokens >= 1.0
                if can_hedge:
                    wake = min(wake, last_launch + hedge_after)
            done = await _first_done(loop, inflight, wake - now)
            if not done:
                now = loop.time() + _TIMER_SLACK_S
                if launched < len(cands) and now < deadline:
                    # A slow attempt keeps running: whichever replica answers first wins.
                    if now >= last_launch + self._attempt_s:
                        launch("slow")
                    elif can_hedge and now >= last_launch + hedge_after:
                        hedged = True
                        self._hedge_tokens -= 1.0
                        launch("hedge")
                continue
            for fut in done:
                cand, t0 = inflight.pop(fut)
                result = self._settle(fut, cand, (loop.time() - t0) * 1000, tried)
                if result is not None:
                    return self._lookup_result(spec, key, partition, cand, result)
        raise LookupTimeout(f"no replica of {table}/{partition} answered within {self.settings.request_timeout_ms} ms",
                            table=table, partition=partition,
                            attempts=[c.replica.node for c, _ in inflight.values()] + [f["node"] for f in tried.failures])

    def _start_read(self, cand: Candidate, table: str, partition: int, raw_key: bytes,
                    store_bound: StoreBound) -> asyncio.Future[ReadResult]:
        """Send one attempt to ``cand``'s node, counted in its load until settled."""
        self.load.started(cand.replica.node)
        fut = self.store.read(cand.replica.address, table, partition, raw_key, store_bound)
        return fut if isinstance(fut, asyncio.Future) else asyncio.ensure_future(fut)

    def _settle(self, fut: asyncio.Future[ReadResult], cand: Candidate, latency_ms: float,
                tried: _Attempts) -> ReadResult | None:
        """Account for one finished attempt; the result if it answers the read, else None."""
        node = cand.replica.node
        try:
            result = fut.result()
        except ReplicaUnavailable as e:
            self.load.finished(node, None)
            self.load.failed(node)
            tried.failures.append({"node": node, "reason": e.message})
            tried.last_reason = "unavailable"
            return None
        except Exception as e:  # noqa: BLE001 — a store client bug must not fail the whole read
            self.load.finished(node, None)
            self.load.failed(node)
            tried.failures.append({"node": node, "reason": f"{type(e).__name__}: {e}"})
            tried.last_reason = "error"
            return None
        self.load.finished(node, latency_ms)
        rep = result.replica
        if rep is not None:
            self.overlay.observe(node, cand.replica.table, cand.replica.partition, rep.applied, rep.end,
                                 rep.staleness_ms, self._clock_ms(), rep.state)
        status = result.status
        if status is ReadStatus.OK or status is ReadStatus.NOT_FOUND:
            self._latency.record(latency_ms)
            return result
        if status is ReadStatus.TOO_STALE and rep is not None:
            tried.stale.append(rep)
        else:
            tried.failures.append({"node": node, "reason": f"{status.name}: {result.message}"})
        tried.last_reason = _RETRY_REASON.get(status, "error")
        return None

    @staticmethod
    def _lookup_result(spec: TableSpec, key: str, partition: int, cand: Candidate, result: ReadResult) -> LookupResult:
        rep = result.replica
        found = result.status is ReadStatus.OK
        if rep is None:
            r = cand.replica
            return LookupResult(spec.name, key, partition, found, result.value, r.node, r.role.value,
                                cand.lag_offsets, cand.staleness_ms, cand.applied)
        return LookupResult(spec.name, key, partition, found, result.value, rep.node or cand.replica.node,
                            rep.role.value, rep.lag_offsets, rep.staleness_ms, rep.applied)

    def _hedge_delay_s(self) -> float:
        if not self.settings.hedge or self._latency.value_ms is None:
            return self._attempt_s
        ms = max(self.settings.hedge_min_ms, self._latency.value_ms)
        return min(ms / 1000, self._attempt_s)

    def _no_replica(self, table: str, partition: int, bound: Bound, selection: Selection,
                    stale: list[ReplicaStatus]) -> NoReplicaWithinBound:
        # What the replicas just answered is newer than the view they were selected by.
        if stale:
            views = [(s.lag_offsets, s.staleness_ms, s.node, s.role.value) for s in stale]
        else:
            views = [(c.lag_offsets, c.staleness_ms, c.replica.node, c.replica.role.value)
                     for c in ([selection.freshest] if selection.freshest else [])]
        freshest = None
        if views:
            lag, ms, node, role = min(views)
            freshest = {"offsets": lag, "ms": ms, "node": node, "role": role}
        return NoReplicaWithinBound(
            f"no live replica of {table}/{partition} is within the bound", table=table, partition=partition,
            bound=bound.to_dict(), freshest_lag=freshest, live_replicas=selection.live)

    def _exhausted(self, table: str, partition: int, bound: Bound, selection: Selection,
                   tried: _Attempts) -> FreshrouteError:
        if tried.stale:
            return self._no_replica(table, partition, bound, selection, tried.stale)
        return ReplicaUnavailable(f"no replica of {table}/{partition} could answer", table=table,
                                  partition=partition, attempts=tried.failures)

    # ---- many keys ---------------------------------------------------------------------

    async def batch_get(self, table: str, keys: list[str], bound: Bound = NO_BOUND) -> list[LookupResult | FreshrouteError]:
        """Read many keys, one group per partition in parallel; per-key results in request order."""
        spec = self.table(table)
        if len(keys) > self.settings.batch_max_keys:
            raise InvalidArgument(f"at most {self.settings.batch_max_keys} keys per batch", field="keys")
        bound = self.bound_for(spec, bound)
        groups: dict[int, list[int]] = {}
        raw_keys = [serialize_key(k) for k in keys]
        for i, raw in enumerate(raw_keys):
            groups.setdefault(partition_for(raw, spec.partitions), []).append(i)
        results: list[LookupResult | FreshrouteError | None] = [None] * len(keys)
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        await asyncio.gather(*(self._read_partition(spec, p, idx, keys, raw_keys, bound, deadline, results)
                               for p, idx in groups.items()))
        return results  # type: ignore[return-value] — every slot is filled by _read_partition

    async def _read_partition(self, spec: TableSpec, partition: int, indices: list[int], keys: list[str],
                              raw_keys: list[bytes], bound: Bound, deadline: float,
                              results: list[LookupResult | FreshrouteError | None]) -> None:
        started = time.perf_counter()
        table = spec.name
        loop = asyncio.get_running_loop()
        min_offset = bound.min_offset(partition)
        selection = self.selector.select(self.metadata.current.replicas_of(table, partition), bound, min_offset)
        store_bound = _store_bound(bound, min_offset)
        tried = _Attempts()
        remaining = list(indices)
        timed_out = False
        for i, cand in enumerate(_attempt_order(selection, tried)):
            if not remaining:
                break
            if loop.time() >= deadline:
                timed_out = True
                break
            if i:
                self.metrics.retry(tried.last_reason)
            node = cand.replica.node
            futs = {}
            for idx in remaining:
                self.load.started(node)
                futs[asyncio.ensure_future(self.store.read(cand.replica.address, table, partition, raw_keys[idx],
                                                           store_bound))] = idx
            t0 = loop.time()
            done, pending = await asyncio.wait(futs, timeout=max(0.0, min(deadline, t0 + self._attempt_s) - t0))
            for fut in pending:
                fut.cancel()
                self.load.finished(node, None)
            if pending:
                tried.failures.append({"node": node, "reason": "slow"})
                tried.last_reason = "slow"
            still: list[int] = [futs[f] for f in pending]
            latency_ms = (loop.time() - t0) * 1000
            for fut in done:
                idx = futs[fut]
                result = self._settle(fut, cand, latency_ms, tried)
                if result is None:
                    still.append(idx)
                else:
                    results[idx] = self._lookup_result(spec, keys[idx], partition, cand, result)
            remaining = sorted(still)
        error: FreshrouteError | None = None
        if remaining:
            if not selection.candidates:
                error = self._no_replica(table, partition, bound, selection, [])
            elif timed_out:
                error = LookupTimeout(f"no replica of {table}/{partition} answered in time", table=table,
                                      partition=partition)
            else:
                error = self._exhausted(table, partition, bound, selection, tried)
        elapsed = time.perf_counter() - started
        for idx in indices:
            r = results[idx]
            if r is None:
                results[idx] = error
                self.metrics.lookup(_outcome(error) if error else "error", "none", elapsed)
            elif isinstance(r, LookupResult):
                self.metrics.lookup("ok" if r.found else "not_found", r.role, elapsed)

    # ---- scans -------------------------------------------------------------------------

    async def scan(self, table: str, prefix: str = "", start: str = "", end: str = "", limit: int | None = None,
                   page_token: str | None = None, bound: Bound = NO_BOUND) -> ScanPage:
        """Keys in ascending byte order across all partitions, one page at a time."""
        spec = self.table(table)
        limit = self.settings.scan_default_limit if limit is None or limit == 0 else limit
        if limit > self.settings.scan_max_limit:
            raise InvalidArgument(f"limit must be at most {self.settings.scan_max_limit}", field="limit")
        bound = self.bound_for(spec, bound)
        lo = serialize_key(start)
        if page_token:
            # The smallest key after the last one returned.
            lo = max(lo, decode_page_token(table, page_token) + b"\x00")
        pre, hi = serialize_key(prefix), serialize_key(end)
        try:
            async with asyncio.timeout(self.settings.scan_timeout_ms / 1000):
                # One more than the page from each partition tells whether another page exists.
                parts = await asyncio.gather(*(self._scan_partition(spec, p, pre, lo, hi, limit + 1, bound)
                                               for p in range(spec.partitions)))
        except TimeoutError:
            raise LookupTimeout(f"scan of {table} did not finish within {self.settings.scan_timeout_ms} ms",
                                table=table) from None
        streams = [[(k, v, p) for k, v in entries] for p, (entries, _) in enumerate(parts)]
        merged = list(islice(heapq.merge(*streams, key=lambda e: e[0]), limit + 1))
        more = len(merged) > limit
        page = merged[:limit]
        items = [(deserialize_key(k), v, p) for k, v, p in page]
        token = encode_page_token(table, page[-1][0]) if more and page else None
        return ScanPage(table, items, token, {p: who for p, (_, who) in enumerate(parts)})

    async def _scan_partition(self, spec: TableSpec, partition: int, prefix: bytes, start: bytes, end: bytes,
                              limit: int, bound: Bound) -> tuple[list[tuple[bytes, bytes]], LookupResult]:
        table = spec.name
        min_offset = bound.min_offset(partition)
        selection = self.selector.select(self.metadata.current.replicas_of(table, partition), bound, min_offset)
        store_bound = _store_bound(bound, min_offset)
        tried = _Attempts()
        timeout_s = self.settings.scan_timeout_ms / 1000
        for i, cand in enumerate(selection.candidates):
            if i:
                self.metrics.retry(tried.last_reason)
            node = cand.replica.node
            try:
                result = await self.store.scan(cand.replica.address, table, partition, prefix, start, end, limit,
                                               store_bound, timeout_s)
            except ReplicaUnavailable as e:
                self.load.failed(node)
                tried.failures.append({"node": node, "reason": e.message})
                tried.last_reason = "unavailable"
                continue
            rep = result.replica
            if rep is not None:
                self.overlay.observe(node, table, partition, rep.applied, rep.end, rep.staleness_ms,
                                     self._clock_ms(), rep.state)
            if result.status is ReadStatus.OK:
                who = self._lookup_result(spec, "", partition, cand, ReadResult(ReadStatus.NOT_FOUND, b"", rep))
                return sorted(result.entries), who
            if result.status is ReadStatus.TOO_STALE and rep is not None:
                tried.stale.append(rep)
            else:
                tried.failures.append({"node": node, "reason": f"{result.status.name}: {result.message}"})
            tried.last_reason = _RETRY_REASON.get(result.status, "error")
        if not selection.candidates:
            raise self._no_replica(table, partition, bound, selection, [])
        raise self._exhausted(table, partition, bound, selection, tried)

    # ---- metadata views ----------------------------------------------------------------

    def _info(self, r: ReplicaView, now: int) -> ReplicaInfo:
        if r.reported:
            c, _ = self._freshest.estimate(r, now)
            lag, ms, applied = c.lag_offsets, c.staleness_ms, c.applied
            o = self.overlay.get(r.node, r.table, r.partition)
            end = o.end if o is not None and o.observed_ms >= r.observed_ms else r.end
        else:
            lag, ms, applied, end = 0, 0, 0, 0
        return ReplicaInfo(r.node, r.address, r.role.value, r.state.value if r.state else None, r.alive,
                           lag, ms, applied, end)

    def key_metadata(self, table: str, key: str) -> KeyLocation:
        """The key's partition, its active replica and its standbys, each with lag."""
        spec = self.table(table)
        partition = self.partition_of(spec, key)
        now = self._clock_ms()
        replicas = self.metadata.current.replicas_of(table, partition)
        infos = [self._info(r, now) for r in replicas]
        active = next((i for i in infos if i.role == Role.ACTIVE.value), None)
        return KeyLocation(table, key, partition, active, [i for i in infos if i is not active])

    def list_tables(self) -> list[TableInfo]:
        snap = self.metadata.current
        if not snap.loaded:
            raise ReplicaUnavailable("routing metadata has not been loaded from Redis yet")
        out = []
        for name in sorted(snap.tables):
            b = self.bound_for(snap.tables[name], NO_BOUND)
            out.append(TableInfo(snap.tables[name], b.max_lag, b.max_staleness_ms))
        return out

    def cluster(self) -> dict[str, Any]:
        """Nodes with liveness and per-replica lag, the assignment, and how old this view is."""
        snap = self.metadata.current
        now = self._clock_ms()
        by_node: dict[str, list[dict[str, Any]]] = {}
        for (table, partition), replicas in sorted(snap.replicas.items()):
            for r in replicas:
                by_node.setdefault(r.node, []).append({"table": table, "partition": partition,
                                                       **self._info(r, now).to_dict()})
        nodes = []
        for node_id in sorted(set(snap.nodes) | set(by_node)):
            n = snap.nodes.get(node_id)
            nodes.append({"node": node_id, "address": n.address if n else "", "alive": bool(n and n.alive),
                          "heartbeat_age_ms": n.heartbeat_age_ms if n else None,
                          "draining": bool(n and n.draining), "replicas": by_node.get(node_id, [])})
        assignment = None
        if snap.assignment is not None:
            assignment = [{"table": t, "partition": p, "nodes": list(ns)}
                          for (t, p), ns in sorted(snap.assignment.replicas.items())]
        return {"nodes": nodes, "assignment_generation": snap.generation, "assignment": assignment,
                "metadata": {"loaded": snap.loaded, "age_ms": max(0, now - snap.built_ms) if snap.loaded else None,
                             "redis_ok": bool(getattr(self.metadata, "redis_ok", snap.loaded))}}

    def _replica_gauges(self) -> list[ReplicaGauge]:
        snap = self.metadata.current
        now = self._clock_ms()
        out = []
        for replicas in snap.replicas.values():
            for r in replicas:
                if r.reported:
                    c, _ = self._freshest.estimate(r, now)
                    out.append(ReplicaGauge(r.table, r.partition, r.node, r.role.value, r.alive,
                                            c.lag_offsets, c.staleness_ms))
        return out

    def _metadata_age_s(self) -> float:
        snap = self.metadata.current
        return max(0, self._clock_ms() - snap.built_ms) / 1000 if snap.loaded else float("nan")


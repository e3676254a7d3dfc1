"""Scans: a read of every partition of a table, merged in key order a page at a time — its rows (a versioned
table's as of a time) or a windowed table's windows across keys.

Each partition answers one more entry than the page holds, which tells whether another page exists; a page token is
the last key returned (and the query it pages), so the next page starts just after it.
"""

from __future__ import annotations

import heapq
import time
from itertools import islice
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

from freshroute.errors import FreshrouteError, InvalidArgument, LookupTimeout
from freshroute.formats import bound_to_bytes, key_from_bytes
from freshroute.bound import NO_BOUND, Bound
from freshroute.keys import deserialize_key, scan_range
from freshroute.metadata.tables import TableSpec
from freshroute.routing.answers import lookup_result, served_by
from freshroute.routing.attempts import AttemptPlan, LatencyWindow
from freshroute.routing.history import HistoryReads
from freshroute.routing.drivers import run_many
from freshroute.routing.results import (ScanPage, WindowPage, WindowsResult, decode_page_token, encode_page_token)
from freshroute.routing.selection import Candidate
from freshroute.windows import Window, WindowSpec, split_window_key
from freshroute.wire import ReadResult, ReadStatus, RowsAsOf, WindowFilter

if TYPE_CHECKING:
    from freshroute.routing.policy import RoutingPolicy
    from freshroute.routing.store import StoreClient


class ScanCore(Protocol):
    """What a scan asks of the routing core (:class:`~freshroute.routing.core.RoutingCore`)."""

    policy: "RoutingPolicy"
    store: "StoreClient"
    history: HistoryReads
    clock_ms: Callable[[], int]

    def resolved(self, name: str, bound: Bound) -> str: ...

    def keyed(self, name: str) -> TableSpec: ...

    def windowed(self, name: str, from_ms: int, to_ms: int) -> tuple[TableSpec, WindowSpec]: ...

    def bound_for(self, spec: TableSpec, bound: Bound) -> Bound: ...

    def plan(self, table: str, partition: int, bound: Bound, latency: LatencyWindow, timeout_s: float,
             now: float) -> AttemptPlan: ...


class Scans:
    """A table's scans through the routing core: its tables, bounds, plans, and the merge of its partitions."""

    def __init__(self, core: ScanCore, latency: LatencyWindow, timeout_s: float) -> None:
        """``core``: the routing core these reads go through."""
        self._core = core
        self._latency = latency
        self._timeout_s = timeout_s

    def _limit(self, limit: int | None) -> int:
        policy = self._core.policy
        limit = policy.scan_default_limit if limit is None or limit == 0 else limit
        if limit > policy.scan_max_limit:
            raise InvalidArgument(f"limit must be at most {policy.scan_max_limit}", field="limit")
        return limit

    async def _every_partition(self, spec: TableSpec, bound: Bound, read: Callable[[int, Candidate], Awaitable[Any]],
                               what: str) -> list[tuple[Candidate, Any]]:
        """Each partition's (replica, answer) of ``read``; the first partition that failed fails it all."""
        core, now = self._core, time.monotonic()
        plans = [core.plan(spec.name, p, bound, self._latency, self._timeout_s, now) for p in range(spec.partitions)]
        out = []
        for p, outcome in enumerate(await run_many(plans, read)):
            if isinstance(outcome, LookupTimeout):
                raise LookupTimeout(f"{what} did not finish within {core.policy.scan_timeout_ms} ms", table=spec.name,
                                    partition=p)
            if isinstance(outcome, FreshrouteError):
                raise outcome
            out.append(outcome)
        return out

    async def rows(self, table: str, prefix: str = "", start: str = "", end: str = "", limit: int | None = None,
                   page_token: str | None = None, bound: Bound = NO_BOUND, as_of_ms: int | None = None) -> ScanPage:
        """Keys in ascending byte order across all partitions, one page at a time; with ``as_of_ms``, a versioned
        table's keys as of that time, each with its version's interval."""
        core = self._core
        history = core.history
        table = core.resolved(table, bound)
        if as_of_ms is None:
            spec = core.keyed(table)
        else:
            spec = history.versioned(table, bound)
            history.retained(spec, as_of_ms, core.clock_ms())
        limit = self._limit(limit)
        bound = core.bound_for(spec, bound)
        fmt = spec.key_format
        query = "" if as_of_ms is None else f"as_of={as_of_ms}"
        lo = bound_to_bytes(fmt, start, "start")
        if page_token:
            lo = max(lo, decode_page_token(table, page_token, query) + b"\x00")  # the smallest key after the last
        lower, upper = scan_range(bound_to_bytes(fmt, prefix, "prefix"), lo, bound_to_bytes(fmt, end, "end"))
        read_range = core.store.read_range
        rows = None if as_of_ms is None else RowsAsOf(as_of_ms)
        answers = await self._every_partition(
            spec, bound, lambda p, c: read_range(c.replica.address, table, p, lower, upper or b"", limit + 1, rows,
                                                 bound), f"scan of {table}")
        streams = [sorted((k, v, p, version) for (k, v), version in
                          zip(answer.entries, answer.versions or [None] * len(answer.entries)))
                   for p, (_, answer) in enumerate(answers)]
        merged = list(islice(heapq.merge(*streams, key=lambda e: e[0]), limit + 1))
        page = merged[:limit]
        token = encode_page_token(table, page[-1][0], query) if len(merged) > limit and page else None
        served = {p: lookup_result(table, "", p, cand, ReadResult(ReadStatus.NOT_FOUND, b"", answer.replica))
                  for p, (cand, answer) in enumerate(answers)}
        items = [(key_from_bytes(fmt, k), v, p) for k, v, p, _ in page]
        if as_of_ms is None:
            return ScanPage(table, items, token, served)
        final = all(history.final(spec, as_of_ms, answer) for _, answer in answers)
        return ScanPage(table, items, token, served, tuple(version for *_, version in page), as_of_ms, final)

    async def windows(self, table: str, from_ms: int, to_ms: int, limit: int | None = None,
                      page_token: str | None = None, bound: Bound = NO_BOUND) -> WindowPage:
        """Windows starting in ``[from_ms, to_ms)`` across keys, ordered by (key bytes, start), one page at a time."""
        core = self._core
        table = core.resolved(table, bound)
        spec, w = core.windowed(table, from_ms, to_ms)
        limit = self._limit(limit)
        bound = core.bound_for(spec, bound)
        query = f"{from_ms}-{to_ms}"
        lo = decode_page_token(table, page_token, query) + b"\x00" if page_token else b""
        live = WindowFilter(from_ms, to_ms, w.size_ms + w.retention_ms)
        read_range = core.store.read_range
        answers = await self._every_partition(
            spec, bound, lambda p, c: read_range(c.replica.address, table, p, lo, b"", limit + 1, live, bound),
            f"windows scan of {table}")
        streams, served = [], {}
        for p, (cand, answer) in enumerate(answers):
            served[p] = WindowsResult(table, "", [], p, *served_by(cand, answer.replica), answer.watermark_ms)
            streams.append([(k, v, p, answer.watermark_ms) for k, v in answer.entries])
        merged = list(islice(heapq.merge(*streams, key=lambda e: e[0]), limit + 1))
        page = merged[:limit]
        items = []
        for raw, value, p, watermark in page:
            split = split_window_key(raw)
            if split is None:
                continue
            key, start = split
            final = watermark is not None and w.final(start, watermark)
            items.append((deserialize_key(key), Window(start, start + w.size_ms, value, final), p))
        token = encode_page_token(table, page[-1][0], query) if len(merged) > limit and page else None
        return WindowPage(table, items, token, served)

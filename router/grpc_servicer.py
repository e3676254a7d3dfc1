"""The public Router service as a grpc.aio servicer: each method admits its caller, asks the router and answers
with the router's results as messages; every error leaves through :func:`router.grpc_errors.answers_errors`.

Paged reads (Scan, ScanWindows) are server streams: a stream reads page after page until the caller has what it
asked for, and closes with a summary of who answered each partition.
"""

from __future__ import annotations

import hmac
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from freshroute.bound import Bound
from freshroute.lag import rank_lag, rank_staleness
from freshroute.metadata.table_versions import logical_of
from freshroute.routing.history import AsOf, parse_time
from freshroute.routing.results import LookupResult
from proto import router_pb2, router_pb2_grpc
from router.auth import Guard
from router.grpc_errors import answers_errors
from router.grpc_get import answer_get, parse_request_bound
from router.grpc_messages import (Served, as_of_response, cluster_response, get_response, input_lag_message,
                                  key_error, replica_info, scan_summary, table_info, typed_value, value_json_of,
                                  versions_response, window_message, windows_response)
from router.routing import Router
from router.transports.grpc_calls import CLIENT_SUBJECT, RELAY_KEY

# Every page of a gRPC Scan stream is one router scan; a stream ends after this many pages
# even if the client asked for everything (it can resume from the last key it received).
_MAX_SCAN_PAGES = 10_000


def _staler(a: Served | None, b: Served) -> Served:
    """The less fresh of two answers for one partition: the stream reports what holds for all its pages."""
    if a is None or (rank_staleness(b.lag_ms), rank_lag(b.lag_offsets)) > (rank_staleness(a.lag_ms),
                                                                          rank_lag(a.lag_offsets)):
        return b
    return a


class _Pages:
    """A server stream's pages of a paged read: until the caller has what it asked for (None: all) or the range ends,
    remembering per partition the stalest answer and the token to resume from, for the closing summary."""

    def __init__(self, wanted: int | None, page_size: int, token: str | None) -> None:
        self.wanted, self.page_size, self.token = wanted, page_size, token
        self.served: dict[int, Served] = {}

    async def read(self, fetch: Callable[[int, str | None], Awaitable[Any]]) -> AsyncIterator[Any]:
        sent = 0
        for _ in range(_MAX_SCAN_PAGES):
            size = self.page_size if self.wanted is None else min(self.page_size, self.wanted - sent)
            page = await fetch(size, self.token)
            yield page
            for partition, who in page.served_by.items():
                self.served[partition] = _staler(self.served.get(partition), who)
            sent += len(page.items)
            self.token = page.next_page_token
            if self.token is None or (self.wanted is not None and sent >= self.wanted):
                return

    def summary(self, table: str, input_lag: router_pb2.InputLag | None) -> router_pb2.ScanSummary:
        return scan_summary(self.served, self.token, input_lag, logical_of(table)[1])


class RouterServicer(router_pb2_grpc.RouterServicer):
    """The public Router service over :class:`Router`."""

    def __init__(self, router: Router, guard: Guard | None = None, relay_key: str | None = None) -> None:
        self._router = router
        self._guard = guard
        self._relay_key = relay_key  # what the gRPC front's relayed calls carry, vouching for their subject

    def _caller(self, context: grpc.aio.ServicerContext) -> tuple[str | None, str | None]:
        """(authorization, client certificate subject) of a call; the subject only from the front's relay."""
        metadata = dict(context.invocation_metadata() or ())
        subject = None
        if self._relay_key is not None and hmac.compare_digest(metadata.get(RELAY_KEY, ""), self._relay_key):
            subject = metadata.get(CLIENT_SUBJECT)
        return metadata.get("authorization"), subject

    async def _table(self, context: grpc.aio.ServicerContext, table: str) -> None:
        if self._guard is not None:
            authorization, subject = self._caller(context)
            await self._guard.table(authorization, table, subject)

    async def _cluster(self, context: grpc.aio.ServicerContext) -> None:
        if self._guard is not None:
            await self._guard.cluster(*self._caller(context))

    def _parse_bound(self, request: Any) -> Bound:
        return parse_request_bound(self._router, request)

    @answers_errors
    async def Get(self, request: router_pb2.GetRequest, context: grpc.aio.ServicerContext) -> router_pb2.GetResponse:
        await self._table(context, request.table)
        return await answer_get(self._router, request)

    @answers_errors
    async def BatchGet(self, request: router_pb2.BatchGetRequest,
                       context: grpc.aio.ServicerContext) -> router_pb2.BatchGetResponse:
        await self._table(context, request.table)
        keys = list(request.keys)
        bound = self._parse_bound(request)
        table = self._router.resolved(request.table, bound)  # the version read: its answers, input lag and format
        fmt = self._router.value_format(table)
        lag, version = input_lag_message(self._router, table), logical_of(table)[1]
        if request.bound.HasField("as_of"):
            as_of = self._router.parsed(parse_time, "as_of", request.bound.as_of)
            answers = await self._router.history.batch_as_of(table, keys, as_of, bound)
            return router_pb2.BatchGetResponse(input_lag=lag, table_version=version, results=[
                as_of_response(a, request.typed_values, fmt) if isinstance(a, AsOf)
                else key_error(table, key, a) for key, a in zip(keys, answers)])
        results = await self._router.batch_get(table, keys, bound)
        return router_pb2.BatchGetResponse(input_lag=lag, table_version=version, results=[
            get_response(r, request.typed_values, fmt) if isinstance(r, LookupResult)
            else key_error(table, key, r)
            for key, r in zip(keys, results)])

    @answers_errors
    async def Scan(self, request: router_pb2.ScanRequest,
                   context: grpc.aio.ServicerContext) -> AsyncIterator[router_pb2.ScanItem]:
        await self._table(context, request.table)
        bound = self._parse_bound(request)
        table = self._router.resolved(request.table, bound)
        fmt = self._router.value_format(table)
        typed = request.typed_values and fmt == "json"
        as_of = self._router.parsed(parse_time, "as_of", request.bound.as_of) if request.bound.HasField("as_of") \
            else None
        pages = _Pages(request.limit or None, self._router.settings.scan_max_limit, request.page_token or None)
        final = True
        async for page in pages.read(lambda size, token: self._router.scans.rows(
                table, request.prefix, request.start, request.end, size, token, bound, as_of)):
            final = final and page.final
            for (key, value, partition), version in page.items_with_versions():
                item = router_pb2.ScanItem(key=key, value_json=value_json_of(fmt, value), partition=partition,
                                           value_bytes=value if fmt == "bytes" else b"",
                                           value=typed_value(value) if typed else None)
                if version is not None:
                    item.valid_from = version.valid_from_ms
                    if version.valid_to_ms is not None:
                        item.valid_to = version.valid_to_ms
                yield item
        summary = pages.summary(table, input_lag_message(self._router, table))
        summary.final = as_of is not None and final
        yield router_pb2.ScanItem(summary=summary)

    @answers_errors
    async def GetWindows(self, request: router_pb2.WindowsRequest,
                         context: grpc.aio.ServicerContext) -> router_pb2.WindowsResponse:
        await self._table(context, request.table)
        bound = self._parse_bound(request)
        table = self._router.resolved(request.table, bound)
        result = await self._router.windows(table, request.key, request.from_ms, request.to_ms, bound)
        return windows_response(result, request.typed_values, input_lag_message(self._router, table))

    @answers_errors
    async def GetVersions(self, request: router_pb2.VersionsRequest,
                          context: grpc.aio.ServicerContext) -> router_pb2.VersionsResponse:
        await self._table(context, request.table)
        bound = self._parse_bound(request)
        table = self._router.resolved(request.table, bound)
        page = await self._router.history.versions(
            table, request.key, request.from_ms if request.HasField("from_ms") else None,
            request.to_ms if request.HasField("to_ms") else None, request.limit or None, request.page_token or None,
            bound)
        return versions_response(page, request.typed_values, self._router.value_format(table),
                                  input_lag_message(self._router, table))

    @answers_errors
    async def ScanWindows(self, request: router_pb2.ScanWindowsRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[router_pb2.WindowItem]:
        await self._table(context, request.table)
        bound = self._parse_bound(request)
        table = self._router.resolved(request.table, bound)
        fmt = self._router.value_format(table)
        typed = request.typed_values and fmt == "json"
        pages = _Pages(request.limit or None, self._router.settings.scan_max_limit, request.page_token or None)
        async for page in pages.read(lambda size, token: self._router.scans.windows(
                table, request.from_ms, request.to_ms, size, token, bound)):
            for key, w, partition in page.items:
                yield router_pb2.WindowItem(key=key, window=window_message(w, typed), partition=partition)
        yield router_pb2.WindowItem(summary=pages.summary(table, input_lag_message(self._router, table)))

    @answers_errors
    async def KeyMetadata(self, request: router_pb2.KeyMetadataRequest,
                          context: grpc.aio.ServicerContext) -> router_pb2.KeyMetadataResponse:
        await self._cluster(context)
        loc = self._router.views.key_metadata(request.table, request.key)
        return router_pb2.KeyMetadataResponse(
            table=loc.table, key=loc.key, partition=loc.partition,
            active=replica_info(loc.active) if loc.active else None,
            standbys=[replica_info(s) for s in loc.standbys])

    @answers_errors
    async def ListTables(self, request: router_pb2.ListTablesRequest,
                         context: grpc.aio.ServicerContext) -> router_pb2.ListTablesResponse:
        principal = await self._guard.principal(*self._caller(context)) if self._guard is not None else None
        return router_pb2.ListTablesResponse(tables=[table_info(t) for t in self._router.views.list_tables()
                                                     if principal is None or principal.may_read(t.spec.name)])

    @answers_errors
    async def Cluster(self, request: router_pb2.ClusterRequest,
                      context: grpc.aio.ServicerContext) -> router_pb2.ClusterResponse:
        await self._cluster(context)
        return cluster_response(self._router.views.cluster())

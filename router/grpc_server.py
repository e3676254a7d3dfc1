"""gRPC surface of the router (grpc.aio): the Router service, health, and server reflection.

Errors leave through :func:`abort` only: the status code comes from the error class, and
the trailing metadata ``freshroute-error`` carries the same JSON body REST returns.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import inspect
import json
import logging
import secrets
from typing import Any, AsyncIterator, Awaitable, Callable, NoReturn

import grpc
import orjson
from google.protobuf.struct_pb2 import Struct
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from freshroute.errors import ConfigError, FreshrouteError
from freshroute.bound import NO_BOUND, Bound
from router.bound_message import bound_of_message
from freshroute.lag import rank_lag, rank_staleness
from freshroute.metadata.tables import TableSpec
from freshroute.routing.history import AsOf, Versions, parse_time
from freshroute.routing.results import (ClusterView, LookupResult, ReplicaInfo, WindowsResult, key_not_found,
                                        pipeline_doc)
from freshroute.tls import ServerTLS
from freshroute.windows import Window
from proto import router_pb2, router_pb2_grpc
from router.auth import Guard
from router.routing import Router
from router.settings import RouterSettings
from router.transports.grpc_calls import CLIENT_SUBJECT, RELAY_KEY
from router.transports.grpc_front import GrpcFront

log = logging.getLogger("freshroute.router.grpc")

ERROR_TRAILER = "freshroute-error"
SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name

# Every page of a gRPC Scan stream is one router scan; a stream ends after this many pages
# even if the client asked for everything (it can resume from the last key it received).
_MAX_SCAN_PAGES = 10_000


def grpc_status(exc: FreshrouteError) -> grpc.StatusCode:
    """The gRPC status an error travels with (its class names it)."""
    return grpc.StatusCode[exc.grpc_status]


def error_status(exc: BaseException) -> tuple[grpc.StatusCode, str, str]:
    """The single translation of errors to gRPC: (status from the error class, message, JSON body for the trailer)."""
    if not isinstance(exc, FreshrouteError):
        log.error("unexpected error serving a gRPC call", exc_info=exc)
        exc = FreshrouteError("internal error")
    # Metadata values must be ASCII; the JSON body escapes anything else.
    body = json.dumps(exc.to_body(), ensure_ascii=True, separators=(",", ":"), default=str)
    return grpc_status(exc), exc.message, body


def answers_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """A Router method whose every error leaves through :func:`abort` (a unary one or a stream)."""
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except Exception as e:  # noqa: BLE001 — every error leaves through abort()
                await abort(context, e)
        return stream

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except Exception as e:  # noqa: BLE001 — every error leaves through abort()
            await abort(context, e)
    return unary


async def abort(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """Ends a grpc.aio call with ``exc`` as :func:`error_status` translates it."""
    status, message, body = error_status(exc)
    await context.abort(status, message, trailing_metadata=((ERROR_TRAILER, body),))
    raise AssertionError("context.abort returned")  # pragma: no cover — abort always raises


def _typed(value: bytes) -> Struct | None:
    """A JSON object value as a Struct (numbers become doubles, as Struct holds them); None for any other JSON."""
    parsed = orjson.loads(value)
    if not isinstance(parsed, dict):
        return None
    struct = Struct()
    struct.update(parsed)
    return struct


def _value_json(value_format: str, raw: bytes) -> str:
    """A found value as ``value_json`` carries it; empty for bytes (``value_bytes`` carries them)."""
    if value_format == "json":
        return raw.decode("utf-8")
    if value_format == "string":
        return orjson.dumps(raw.decode("utf-8")).decode("utf-8")
    return ""


def _get_response(r: LookupResult, typed: bool = False, value_format: str = "json") -> router_pb2.GetResponse:
    if value_format == "json":
        value_json, value_bytes = r.value.decode("utf-8") if r.found else "", b""
    else:
        value_json, value_bytes = (_value_json(value_format, r.value), r.value if value_format == "bytes" else b"") \
            if r.found else ("", b"")
    return router_pb2.GetResponse(
        table=r.table, key=r.key, value_json=value_json, value_bytes=value_bytes, partition=r.partition,
        served_by=router_pb2.ServedBy(node=r.node, role=r.role),
        lag=router_pb2.Lag(offsets=r.lag_offsets, ms=r.lag_ms), position=r.position, found=r.found,
        value=_typed(r.value) if typed and r.found and value_format == "json" else None)


# Who answered a partition of a scan: a key scan's or a windows scan's (both carry node, role, lag and position).
Served = LookupResult | WindowsResult


def _scan_summary(served: dict[int, Served], next_page_token: str | None,
                  input_lag: router_pb2.InputLag | None) -> router_pb2.ScanSummary:
    return router_pb2.ScanSummary(input_lag=input_lag,
        partitions=[router_pb2.ScanPartition(partition=p, served_by=router_pb2.ServedBy(node=r.node, role=r.role),
                                             lag=router_pb2.Lag(offsets=r.lag_offsets, ms=r.lag_ms),
                                             position=r.position)
                    for p, r in sorted(served.items())],
        next_page_token=next_page_token or "")


def _window(w: Window, typed: bool) -> router_pb2.Window:
    return router_pb2.Window(start_ms=w.start, end_ms=w.end, value_json=w.value.decode("utf-8"), final=w.final,
                             value=_typed(w.value) if typed else None)


def _windows_response(r: WindowsResult, typed: bool,
                      input_lag: router_pb2.InputLag | None) -> router_pb2.WindowsResponse:
    return router_pb2.WindowsResponse(input_lag=input_lag,
        table=r.table, key=r.key, windows=[_window(w, typed) for w in r.windows], partition=r.partition,
        served_by=router_pb2.ServedBy(node=r.node, role=r.role),
        lag=router_pb2.Lag(offsets=r.lag_offsets, ms=r.lag_ms), position=r.position, watermark_ms=r.watermark_ms)


def _table_window(spec: TableSpec) -> router_pb2.TableWindow | None:
    w = spec.window
    return None if w is None else router_pb2.TableWindow(size_ms=w.size_ms, slide_ms=w.slide_ms, grace_ms=w.grace_ms,
                                                         retention_ms=w.retention_ms)


def _input_lag(router: Router, table: str) -> router_pb2.InputLag | None:
    """The table's input lag as the responses carry it: unset while the pipeline is caught up (it reads as zero)."""
    records, ms = router.input_lag(table)
    return router_pb2.InputLag(records=records, ms=ms) if records else None


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

    def summary(self, input_lag: router_pb2.InputLag | None) -> router_pb2.ScanSummary:
        return _scan_summary(self.served, self.token, input_lag)


def _key_error(table: str, key: str, err: FreshrouteError) -> router_pb2.GetResponse:
    """A BatchGet result for a key that could not be read: the error a Get of it alone would carry."""
    body = orjson.dumps(err.to_body(), default=str).decode()
    return router_pb2.GetResponse(
        table=table, key=key, partition=int(err.details.get("partition") or 0), found=False,
        error=router_pb2.KeyError(code=err.code, message=err.message, status=grpc_status(err).value[0],
                                  body_json=body))


def _replica_info(i: ReplicaInfo) -> router_pb2.ReplicaInfo:
    return router_pb2.ReplicaInfo(node=i.node, address=i.address, role=i.role, state=i.state or "", alive=i.alive,
                                  lag=router_pb2.Lag(offsets=i.lag_offsets, ms=i.lag_ms), applied_offset=i.applied,
                                  end_offset=i.end, failure=i.failure or "")


def parse_request_bound(router: Router, request: Any) -> Bound:
    """The request's bound (counted as an invalid lookup if malformed, as on REST)."""
    return router.parsed(bound_of_message, request.bound) if request.HasField("bound") else NO_BOUND


async def answer_get(router: Router, request: router_pb2.GetRequest) -> router_pb2.GetResponse:
    """``Router.Get``, whichever server carries it; errors are raised, for the caller to translate."""
    if request.bound.HasField("as_of"):
        return await _answer_as_of(router, request)
    result = await router.get(request.table, request.key, parse_request_bound(router, request))
    if not result.found:
        raise key_not_found(result, router.input_lag(request.table))
    response = _get_response(result, request.typed_values, router.value_format(request.table))
    lag = _input_lag(router, request.table)
    if lag is not None:
        response.input_lag.CopyFrom(lag)
    return response


async def _answer_as_of(router: Router, request: router_pb2.GetRequest) -> router_pb2.GetResponse:
    """A Get with ``Bound.as_of``: the version valid then (a versioned table's)."""
    as_of = router.parsed(parse_time, "as_of", request.bound.as_of)
    answer = await router.history.as_of(request.table, request.key, as_of, parse_request_bound(router, request))
    if answer.version is None or not answer.lookup.found:
        raise answer.not_found(router.input_lag(request.table))
    response = _as_of_response(answer, request.typed_values, router.value_format(request.table))
    lag = _input_lag(router, request.table)
    if lag is not None:
        response.input_lag.CopyFrom(lag)
    return response


def _as_of_response(answer: AsOf, typed: bool, value_format: str) -> router_pb2.GetResponse:
    """A key as of a time: a get's answer with the version's interval (unset: no version then) and ``final``."""
    response = _get_response(answer.lookup, typed, value_format)
    version = answer.version
    if version is not None:
        response.valid_from = version.valid_from_ms
        if version.valid_to_ms is not None:
            response.valid_to = version.valid_to_ms
    response.final = answer.final
    return response


def _versions_response(page: Versions, typed: bool, value_format: str,
                       input_lag: router_pb2.InputLag | None) -> router_pb2.VersionsResponse:
    r = page.lookup
    versions = [router_pb2.Version(
        value_json=_value_json(value_format, v.value) if v.value is not None else "",
        value_bytes=v.value if value_format == "bytes" and v.value is not None else b"",
        valid_from=v.valid_from_ms, valid_to=v.valid_to_ms, deleted=v.value is None,
        value=_typed(v.value) if typed and v.value is not None and value_format == "json" else None)
        for v in page.versions]
    return router_pb2.VersionsResponse(
        table=r.table, key=r.key, versions=versions,
        next_page_token="" if page.next_to_ms is None else str(page.next_to_ms), complete_to=page.complete_ms,
        partition=r.partition, served_by=router_pb2.ServedBy(node=r.node, role=r.role),
        lag=router_pb2.Lag(offsets=r.lag_offsets, ms=r.lag_ms), position=r.position, input_lag=input_lag)


def cluster_response(view: ClusterView) -> router_pb2.ClusterResponse:
    return router_pb2.ClusterResponse(
        nodes=[router_pb2.NodeInfo(
            node=n.node, address=n.address, alive=n.alive, heartbeat_age_ms=n.heartbeat_age_ms or 0,
            read_address=n.read_address or "", draining=n.draining,
            replicas=[router_pb2.PartitionReplica(table=r.table, partition=r.partition, replica=_replica_info(r.info))
                      for r in n.replicas]) for n in view.nodes],
        assignment_generation=view.assignment_generation or 0,
        assignment=[router_pb2.AssignedPartition(table=t, partition=p, nodes=ns) for t, p, ns in view.assignment or ()],
        metadata=router_pb2.MetadataHealth(loaded=view.metadata.loaded, age_ms=view.metadata.age_ms,
                                           redis_ok=view.metadata.redis_ok),
        pipelines=[router_pb2.TablePipeline(
            table=t.table, pipeline=router_pb2.Pipeline(alive=t.alive, last_progress_ms=t.last_progress_ms),
            input_lag=router_pb2.InputLag(records=t.input_lag[0], ms=t.input_lag[1])) for t in view.pipelines])


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
        fmt = self._router.value_format(request.table)
        if request.bound.HasField("as_of"):
            as_of = self._router.parsed(parse_time, "as_of", request.bound.as_of)
            answers = await self._router.history.batch_as_of(request.table, keys, as_of, self._parse_bound(request))
            return router_pb2.BatchGetResponse(input_lag=_input_lag(self._router, request.table), results=[
                _as_of_response(a, request.typed_values, fmt) if isinstance(a, AsOf)
                else _key_error(request.table, key, a) for key, a in zip(keys, answers)])
        results = await self._router.batch_get(request.table, keys, self._parse_bound(request))
        return router_pb2.BatchGetResponse(input_lag=_input_lag(self._router, request.table), results=[
            _get_response(r, request.typed_values, fmt) if isinstance(r, LookupResult)
            else _key_error(request.table, key, r)
            for key, r in zip(keys, results)])

    @answers_errors
    async def Scan(self, request: router_pb2.ScanRequest,
                   context: grpc.aio.ServicerContext) -> AsyncIterator[router_pb2.ScanItem]:
        await self._table(context, request.table)
        bound = self._parse_bound(request)
        fmt = self._router.value_format(request.table)
        typed = request.typed_values and fmt == "json"
        as_of = self._router.parsed(parse_time, "as_of", request.bound.as_of) if request.bound.HasField("as_of") \
            else None
        pages = _Pages(request.limit or None, self._router.settings.scan_max_limit, request.page_token or None)
        final = True
        async for page in pages.read(lambda size, token: self._router.scans.rows(
                request.table, request.prefix, request.start, request.end, size, token, bound, as_of)):
            final = final and page.final
            for (key, value, partition), version in page.items_with_versions():
                item = router_pb2.ScanItem(key=key, value_json=_value_json(fmt, value), partition=partition,
                                           value_bytes=value if fmt == "bytes" else b"",
                                           value=_typed(value) if typed else None)
                if version is not None:
                    item.valid_from = version.valid_from_ms
                    if version.valid_to_ms is not None:
                        item.valid_to = version.valid_to_ms
                yield item
        summary = pages.summary(_input_lag(self._router, request.table))
        summary.final = as_of is not None and final
        yield router_pb2.ScanItem(summary=summary)

    @answers_errors
    async def GetWindows(self, request: router_pb2.WindowsRequest,
                         context: grpc.aio.ServicerContext) -> router_pb2.WindowsResponse:
        await self._table(context, request.table)
        result = await self._router.windows(request.table, request.key, request.from_ms, request.to_ms,
                                            self._parse_bound(request))
        return _windows_response(result, request.typed_values, _input_lag(self._router, request.table))

    @answers_errors
    async def GetVersions(self, request: router_pb2.VersionsRequest,
                          context: grpc.aio.ServicerContext) -> router_pb2.VersionsResponse:
        await self._table(context, request.table)
        page = await self._router.history.versions(
            request.table, request.key, request.from_ms if request.HasField("from_ms") else None,
            request.to_ms if request.HasField("to_ms") else None, request.limit or None, request.page_token or None,
            self._parse_bound(request))
        return _versions_response(page, request.typed_values, self._router.value_format(request.table),
                                  _input_lag(self._router, request.table))

    @answers_errors
    async def ScanWindows(self, request: router_pb2.ScanWindowsRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[router_pb2.WindowItem]:
        await self._table(context, request.table)
        bound = self._parse_bound(request)
        fmt = self._router.value_format(request.table)
        typed = request.typed_values and fmt == "json"
        pages = _Pages(request.limit or None, self._router.settings.scan_max_limit, request.page_token or None)
        async for page in pages.read(lambda size, token: self._router.scans.windows(
                request.table, request.from_ms, request.to_ms, size, token, bound)):
            for key, w, partition in page.items:
                yield router_pb2.WindowItem(key=key, window=_window(w, typed), partition=partition)
        yield router_pb2.WindowItem(summary=pages.summary(_input_lag(self._router, request.table)))

    @answers_errors
    async def KeyMetadata(self, request: router_pb2.KeyMetadataRequest,
                          context: grpc.aio.ServicerContext) -> router_pb2.KeyMetadataResponse:
        await self._cluster(context)
        loc = self._router.views.key_metadata(request.table, request.key)
        return router_pb2.KeyMetadataResponse(
            table=loc.table, key=loc.key, partition=loc.partition,
            active=_replica_info(loc.active) if loc.active else None,
            standbys=[_replica_info(s) for s in loc.standbys])

    @answers_errors
    async def ListTables(self, request: router_pb2.ListTablesRequest,
                         context: grpc.aio.ServicerContext) -> router_pb2.ListTablesResponse:
        principal = await self._guard.principal(*self._caller(context)) if self._guard is not None else None
        return router_pb2.ListTablesResponse(tables=[
            router_pb2.TableInfo(name=t.spec.name, topic=t.spec.topic, partitions=t.spec.partitions,
                                 standby_replicas=t.spec.standby_replicas, key_column=t.spec.key_column,
                                 schema=dict(t.spec.value_schema), window=_table_window(t.spec),
                                 input_lag=router_pb2.InputLag(records=t.input_lag[0], ms=t.input_lag[1]),
                                 pipeline=router_pb2.Pipeline(**pipeline_doc(t.pipeline)),
                                 key_format=t.spec.key_format, value_format=t.spec.value_format,
                                 origin=t.spec.origin, pipeline_mode=t.spec.pipeline_mode or "", query=t.spec.query or "",
                                 history_retention_ms=t.spec.history_retention_ms)
            for t in self._router.views.list_tables() if principal is None or principal.may_read(t.spec.name)])

    @answers_errors
    async def Cluster(self, request: router_pb2.ClusterRequest,
                      context: grpc.aio.ServicerContext) -> router_pb2.ClusterResponse:
        await self._cluster(context)
        return cluster_response(self._router.views.cluster())


def create_grpc_server(settings: RouterSettings, router: Router, guard: Guard | None = None,
                       relay_key: str | None = None) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server (not started) with Router, health and reflection, bound to ``settings.grpc_port``.

    Call from a running event loop. Returns the bound port, so ``grpc_port=0`` lets the OS pick.
    """
    loop = asyncio.get_running_loop()
    # Without reuse_port, a second router on the same port fails to start rather than
    # silently sharing it.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1 if settings.reuse_port else 0)])
    router_pb2_grpc.add_RouterServicer_to_server(RouterServicer(router, guard, relay_key), server)

    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    pending: set[asyncio.Task[None]] = set()

    def on_ready(ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            task = loop.create_task(health.set(name, status))
            pending.add(task)
            task.add_done_callback(pending.discard)

    router.add_ready_listener(on_ready)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{settings.host}:{settings.grpc_port}")
    if not port:
        raise RuntimeError(f"cannot bind gRPC to {settings.host}:{settings.grpc_port}")
    return server, port


class RouterGetCalls:
    """``Router.Get`` for the gRPC front: the servicer's answer and error translation, without grpc.aio."""

    def __init__(self, router: Router, guard: Guard | None = None) -> None:
        self._router = router
        self._guard = guard

    async def get(self, request: router_pb2.GetRequest, authorization: bytes | None,
                  subject: str | None = None) -> router_pb2.GetResponse:
        if self._guard is not None:
            await self._guard.table(authorization, request.table, subject)
        return await answer_get(self._router, request)

    def status(self, exc: BaseException) -> tuple[grpc.StatusCode, str, tuple[tuple[bytes, bytes], ...]]:
        code, message, body = error_status(exc)
        return code, message, ((ERROR_TRAILER.encode(), body.encode()),)


class PublicGrpc:
    """The router's public gRPC port as the settings ask: the front (``Router.Get`` in place, every other
    call relayed to a grpc.aio server on a port only this process knows of), or grpc.aio alone."""

    def __init__(self, settings: RouterSettings, router: Router, guard: Guard | None = None,
                 tls: ServerTLS | None = None) -> None:
        self.front: GrpcFront | None = None
        if tls is not None and not settings.grpc_front:
            raise ConfigError("TLS on the gRPC port needs grpc_front (the default): set grpc_front true",
                              setting="grpc_front")
        if settings.grpc_front:
            inner = settings.model_copy(update={"host": "127.0.0.1", "grpc_port": 0, "reuse_port": False})
            # Relayed calls carry their authorization metadata, and the client certificate's subject vouched
            # for by a key only this process knows: the inner servicer checks them.
            relay_key = secrets.token_urlsafe(24)
            self._server, inner_port = create_grpc_server(inner, router, guard, relay_key)
            self.front = GrpcFront(RouterGetCalls(router, guard), f"127.0.0.1:{inner_port}", settings.host,
                                   settings.grpc_port, settings.reuse_port, tls.context if tls else None, relay_key)
        else:
            self._server, self.port = create_grpc_server(settings, router, guard)

    @property
    def connections(self) -> set[Any]:
        """The front's open connections (none without the front)."""
        return self.front.connections if self.front is not None else set()

    async def start(self) -> int:
        """Start serving; returns the public port."""
        await self._server.start()
        if self.front is not None:
            self.port = await self.front.start()
        return self.port

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; calls in flight get ``grace`` seconds."""
        if self.front is not None:
            await self.front.stop(grace)
            await self._server.stop(None)
        else:
            await self._server.stop(grace)

"""REST surface of the router (FastAPI), documented in OpenAPI, with a lean key-lookup path.

Every route is a FastAPI route, so ``/docs`` and ``/openapi.json`` describe them all. The
two key routes (lookup and key metadata) are also answered by a raw ASGI layer in front
of FastAPI (see :class:`RouterApp`), with the same handler functions: it skips
per-request dependency solving and model validation, and it splits the *raw* path, so
keys containing ``/`` (sent as ``%2F``) work.
"""

from __future__ import annotations

import logging
import re
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator
from urllib.parse import parse_qsl, unquote_to_bytes

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from freshroute.errors import FreshrouteError, InvalidArgument, RateLimited, Unauthenticated, foreign
from freshroute.routing.bound import (MAX_LIMIT, NO_BOUND, Bound, parse_bound, parse_limit, parse_millis,
                                     parse_query_bound)
from freshroute.routing.results import BatchResult, LookupResult, key_not_found
from router.auth import WWW_AUTHENTICATE, Guard, Principal
from router.console import HEADERS as CONSOLE_HEADERS, assets as console_assets
from router.console.views import GRID_DEFAULT_LIMIT, GRID_MAX_LIMIT, ClusterViews
from router.openapi import (ERROR_RESPONSES, HTTP_REFUSALS, BatchGetRequest, BatchGetResponse, ErrorBody, KeyValue,
                            ScanResponse, WindowScanResponse, WindowsResponse, bound_parameters, page_parameters,
                            window_range_parameters)
from router.rate_limit import SharedRates
from router.routing import Router
from router.runtime import RouterRuntime
from router.settings import RouterSettings

log = logging.getLogger("freshroute.router.rest")

_JSON = "application/json"
_JSON_HEADERS = [(b"content-type", b"application/json")]


# ---- the one translation of errors to HTTP ------------------------------------------------

def as_freshroute_error(exc: BaseException) -> FreshrouteError:
    """Any exception as the project's error: ours as is, framework ones mapped, the rest INTERNAL."""
    if isinstance(exc, FreshrouteError):
        return exc
    if isinstance(exc, RequestValidationError):
        return InvalidArgument("invalid request", errors=[
            {"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", "")} for e in exc.errors()])
    if isinstance(exc, StarletteHTTPException):
        return foreign({404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR"),
                            exc.status_code, str(exc.detail))
    log.error("unexpected error serving a request", exc_info=exc)
    return FreshrouteError("internal error")


def error_response(exc: BaseException) -> tuple[int, bytes]:
    err = as_freshroute_error(exc)
    return err.http_status, orjson.dumps(err.to_body())


def error_headers(exc: BaseException) -> dict[str, str]:
    """Headers an error's status calls for: how to authenticate (401), when to come back (429)."""
    if isinstance(exc, Unauthenticated):
        return {"www-authenticate": WWW_AUTHENTICATE}
    if isinstance(exc, RateLimited):
        return {"retry-after": str(exc.details.get("retry_after_s", 1))}
    return {}


async def handle_error(request: Request, exc: Exception) -> Response:
    """The single exception handler of the app (every error class is routed here)."""
    status, body = error_response(exc)
    # A 405 says which methods the resource has (RFC 9110 §15.5.6); Starlette names them in Allow.
    headers = exc.headers if isinstance(exc, StarletteHTTPException) else error_headers(exc)
    return Response(body, status, headers=headers or None, media_type=_JSON)


def _query(raw: bytes) -> dict[str, str]:
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True)) if raw else {}


# The key routes: /v1/tables/{table}/keys/{key}[/metadata|/windows]
LOOKUP, METADATA, WINDOWS = b"", b"metadata", b"windows"


class KeyHandlers:
    """The three key routes as plain functions of (table, key, query) → (status, body); the
    :class:`router.transports.KeyRoutes` of the HTTP/1.1 path."""

    def __init__(self, router: Router, guard: Guard | None = None) -> None:
        self.router = router
        self.guard = guard

    @staticmethod
    def match(raw_path: bytes) -> tuple[bytes, bytes, bytes] | None:
        return match_key_path(raw_path)

    async def answer(self, match: tuple[bytes, bytes, bytes], query: bytes, authorization: bytes | None = None,
                     subject: str | None = None) -> tuple[int, bytes, dict[str, str]]:
        """(status, JSON body, extra headers) of a GET on a key route, as :func:`match_key_path` split it."""
        table_raw, key_raw, route = match
        try:
            table, key = _segment(table_raw), _segment(key_raw)
            if self.guard is not None:
                await key_route_access(self.guard, route, table, authorization, subject)
            if route is METADATA:
                return (*self.metadata(table, key), {})
            if route is WINDOWS:
                return (*await self.windows(table, key, query), {})
            return (*await self.lookup(table, key, query), {})
        except Exception as e:  # noqa: BLE001 — the same translation as every other route
            return (*error_response(e), error_headers(e))

    async def lookup(self, table: str, key: str, query: bytes) -> tuple[int, bytes]:
        try:
            try:
                bound = parse_query_bound(_query(query)) if query else NO_BOUND
            except InvalidArgument:
                self.router.metrics.lookup("invalid", "none", 0.0)
                raise
            result = await self.router.get(table, key, bound)
            if not result.found:
                raise key_not_found(result, self.router.input_lag(table))
            return 200, orjson.dumps(result.to_dict(self.router.input_lag(table), self.router.value_format(table)))
        except FreshrouteError as e:
            return error_response(e)

    async def windows(self, table: str, key: str, query: bytes) -> tuple[int, bytes]:
        try:
            q = _query(query)
            try:
                from_ms, to_ms = parse_millis("from", q.get("from")), parse_millis("to", q.get("to"))
                bound = parse_query_bound(q)
            except InvalidArgument:
                self.router.metrics.lookup("invalid", "none", 0.0)
                raise
            result = await self.router.windows(table, key, from_ms, to_ms, bound)
            return 200, orjson.dumps(result.to_dict(self.router.input_lag(table)))
        except FreshrouteError as e:
            return error_response(e)

    def metadata(self, table: str, key: str) -> tuple[int, bytes]:
        try:
            return 200, orjson.dumps(self.router.key_metadata(table, key).to_dict())
        except FreshrouteError as e:
            return error_response(e)


_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def _segment(raw: bytes) -> str:
    if b"%" in raw:
        if _BAD_ESCAPE.search(raw):
            raise InvalidArgument("a path segment has a '%' not followed by two hex digits (percent-encode '%' as %25)")
        raw = unquote_to_bytes(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument("path segments must be UTF-8") from None


_PREFIX = b"/v1/tables/"


def match_key_path(raw_path: bytes) -> tuple[bytes, bytes, bytes] | None:
    """``/v1/tables/{table}/keys/{key}[/metadata|/windows]`` split on the raw (still encoded) path: (table, key,
    route)."""
    if not raw_path.startswith(_PREFIX):
        return None
    parts = raw_path[len(_PREFIX):].split(b"/")
    if len(parts) == 3 and parts[1] == b"keys" and parts[0] and parts[2]:
        return parts[0], parts[2], LOOKUP
    if len(parts) == 4 and parts[1] == b"keys" and parts[0] and parts[2]:
        route = METADATA if parts[3] == METADATA else WINDOWS if parts[3] == WINDOWS else None
        if route is not None:
            return parts[0], parts[2], route
    return None


async def serve_key_route(handlers: KeyHandlers, scope: Scope, send: Send) -> bool:
    """Answer a GET on a key route straight from the raw ASGI scope; False if ``scope`` is not one."""
    if scope["type"] != "http" or scope["method"] != "GET":
        return False
    match = match_key_path(scope.get("raw_path") or scope["path"].encode())
    if match is None:
        return False
    await _send_json(send, *await handlers.answer(match, scope.get("query_string", b""), _authorization(scope),
                                                   _subject(scope)))
    return True


async def _send_json(send: Send, status: int, body: bytes, extra: dict[str, str]) -> None:
    """A JSON answer straight on the raw ASGI channel."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode()),
                            *((k.encode(), v.encode()) for k, v in extra.items())]})
    await send({"type": "http.response.body", "body": body})


def _authorization(scope: Scope) -> bytes | None:
    return next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)


def _subject(scope: Scope) -> str | None:
    """The client certificate's subject, as the ASGI TLS extension carries it."""
    return ((scope.get("extensions") or {}).get("tls") or {}).get("client_cert_name")


# Open to anyone: a load balancer's health checks carry no token, and the console's files hold no data (the page
# asks for a token and sends it with every read of the API).
_OPEN = frozenset((b"/healthz", b"/readyz", b"/console"))


async def key_route_access(guard: Guard, route: bytes, table: str, authorization: bytes | None,
                     subject: str | None) -> Principal:
    """A key route's rule, on either REST path: its metadata needs the cluster, its lookup and windows the table."""
    if route is METADATA:
        return await guard.cluster(authorization, subject)
    return await guard.table(authorization, table, subject)


async def check_access(guard: Guard, scope: Scope) -> Principal | None:
    """What a REST request needs, checked once per request (a batch or a scan is one read of its table):
    reads of ``/v1/tables/{table}/…`` need the table; the list of tables, a principal (it lists what it may
    read); everything else — cluster, key metadata, metrics, docs — a principal allowed to see the cluster."""
    raw = scope.get("raw_path") or scope["path"].encode()
    path = raw.partition(b"?")[0]
    if path in _OPEN or path.startswith(b"/console/"):
        return None
    authorization, subject = _authorization(scope), _subject(scope)
    if path.rstrip(b"/") == b"/v1/tables":
        return await guard.principal(authorization, subject)
    key = match_key_path(path)
    if key is not None:
        return await key_route_access(guard, key[2], _segment(key[0]), authorization, subject)
    if path.startswith(_PREFIX):
        rest = path[len(_PREFIX):]
        table, _, tail = rest.partition(b"/")
        if table and (tail in (b"scan", b"keys:batchGet", b"windows")):
            return await guard.table(authorization, _segment(table), subject)
    return await guard.cluster(authorization, subject)


class RouterApp(FastAPI):
    """FastAPI, with the key routes answered before FastAPI's own per-request machinery.

    Measured under load, FastAPI's entry (telemetry checks reading the environment) and
    Starlette's middleware and routing cost about as much as the whole lookup. The key
    routes are still declared as FastAPI routes below, so they are documented, and they
    run the same handlers either way.
    """

    key_handlers: KeyHandlers | None = None
    guard: Guard | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handlers = self.key_handlers
        if handlers is not None and await serve_key_route(handlers, scope, send):
            return  # checked by the handlers, as on the HTTP/1.1 path
        guard = self.guard
        if guard is not None and scope["type"] == "http":
            try:
                scope.setdefault("state", {})["principal"] = await check_access(guard, scope)
            except Exception as e:  # noqa: BLE001 — the same translation as every other route
                await _send_json(send, *error_response(e), error_headers(e))
                return
        await super().__call__(scope, receive, send)


# ---- the app ------------------------------------------------------------------------------

def create_app(settings: RouterSettings, router: Router | None = None, *, fast_key_routes: bool = True,
               guard: Guard | None = None) -> FastAPI:
    """The REST app over ``router``; without one, the app builds and runs its own (Redis, gRPC store client)."""
    runtime = None
    if router is None:
        runtime = RouterRuntime(settings)
        router = runtime.router

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if runtime is not None:
            await runtime.start()
        try:
            yield
        finally:
            if runtime is not None:
                await runtime.stop()

    app = RouterApp(title="freshroute router", version="1.0", responses=HTTP_REFUSALS,
                  description="Key lookups on stream-materialized tables, served by the freshest replica "
                              "within the caller's staleness bound.", lifespan=lifespan)
    for exc_class in (FreshrouteError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_class, handle_error)
    if guard is None and settings.auth_file is not None:
        guard = Guard(settings.auth_file, SharedRates(runtime.redis, settings.namespace) if runtime else None)
    handlers = KeyHandlers(router, guard)
    if fast_key_routes:
        app.key_handlers = handlers
    app.guard = guard
    app.state.router = router
    views = ClusterViews(router)
    console_files = console_assets()

    def json(body: Any, status: int = 200) -> Response:
        return Response(orjson.dumps(body), status, media_type=_JSON)

    @app.get("/v1/tables", tags=["tables"], summary="Tables with partition count, replicas and schema")
    async def list_tables(request: Request) -> Response:
        principal = request.scope.get("state", {}).get("principal")
        return json({"tables": [t.to_dict() for t in router.list_tables()
                                if principal is None or principal.may_read(t.spec.name)]})

    @app.get("/v1/tables/{table}/keys/{key}", tags=["lookups"], summary="Look up one key",
             responses={200: {"model": KeyValue}, **ERROR_RESPONSES},
             openapi_extra={"parameters": bound_parameters()})
    async def get_key(table: str, key: str, request: Request) -> Response:
        status, body = await handlers.lookup(table, key, request.scope.get("query_string", b""))
        return Response(body, status, media_type=_JSON)

    @app.get("/v1/tables/{table}/keys/{key}/metadata", tags=["lookups"],
             summary="Where a key lives: partition, active and standbys with lag",
             responses={404: {"model": ErrorBody}})
    async def key_metadata(table: str, key: str) -> Response:
        status, body = handlers.metadata(table, key)
        return Response(body, status, media_type=_JSON)

    @app.get("/v1/tables/{table}/keys/{key}/windows", tags=["lookups"],
             summary="A key's windows whose start is in [from, to), each saying whether it is final",
             responses={200: {"model": WindowsResponse}, **ERROR_RESPONSES},
             openapi_extra={"parameters": [*window_range_parameters(settings.max_windows), *bound_parameters()]})
    async def key_windows(table: str, key: str, request: Request) -> Response:
        status, body = await handlers.windows(table, key, request.scope.get("query_string", b""))
        return Response(body, status, media_type=_JSON)

    @app.get("/v1/tables/{table}/windows", tags=["lookups"],
             summary="Windows whose start is in [from, to) across keys, in key order, paged",
             responses={200: {"model": WindowScanResponse}, **ERROR_RESPONSES},
             openapi_extra={"parameters": [
                 *window_range_parameters(settings.max_windows),
                 *page_parameters(settings.scan_default_limit, settings.scan_max_limit, "this query"),
                 *bound_parameters()]})
    async def scan_windows(table: str, request: Request) -> Response:
        q = _query(request.scope.get("query_string", b""))
        from_ms, to_ms = parse_millis("from", q.get("from")), parse_millis("to", q.get("to"))
        page = await router.scan_windows(table, from_ms, to_ms, parse_limit("limit", q.get("limit")),
                                         q.get("page_token") or None, parse_query_bound(q))
        return json(page.to_dict(router.input_lag(table)))

    @app.post("/v1/tables/{table}/keys:batchGet", tags=["lookups"], summary="Look up many keys",
              responses={200: {"model": BatchGetResponse}, **ERROR_RESPONSES},
              openapi_extra={"requestBody": {"required": True, "content": {_JSON: {
                  "schema": BatchGetRequest.model_json_schema()}}}})
    async def batch_get(table: str, request: Request) -> Response:
        return json(await _batch_get(router, table, await request.body()))

    @app.get("/v1/tables/{table}/scan", tags=["lookups"], summary="Keys in order across partitions, paged",
             responses={200: {"model": ScanResponse}, **ERROR_RESPONSES},
             openapi_extra={"parameters": [
                 *({"name": n, "in": "query", "required": False, "schema": {"type": "string"}, "description": d}
                   for n, d in (("prefix", "keys starting with this"), ("start", "first key (inclusive)"),
                                ("end", "last key (exclusive)"))),
                 *page_parameters(settings.scan_default_limit, settings.scan_max_limit, "this table's scan"),
                 *bound_parameters()]})
    async def scan(table: str, request: Request) -> Response:
        q = _query(request.scope.get("query_string", b""))
        limit = parse_limit("limit", q.get("limit"))
        page = await router.scan(table, q.get("prefix", ""), q.get("start", ""), q.get("end", ""), limit,
                                 q.get("page_token") or None, parse_query_bound(q))
        return json(page.to_dict(router.input_lag(table), router.value_format(table)))

    @app.get("/v1/cluster", tags=["cluster"], summary="Nodes, liveness, assignment and per-replica lag")
    async def cluster() -> Response:
        return json(router.cluster().to_dict())

    @app.get("/v1/cluster/summary", tags=["cluster"],
             summary="The cluster per node and per table: replica counts by kind, worst lag, restores in progress")
    async def cluster_summary() -> Response:
        return Response(await views.summary(), media_type=_JSON)

    @app.get("/v1/cluster/tables/{table}", tags=["cluster"],
             summary="One table's partitions, each with every replica's role, state and lag, a page at a time",
             responses={404: {"model": ErrorBody}, 400: {"model": ErrorBody}},
             openapi_extra={"parameters": [
                 {"name": "from", "in": "query", "required": False,
                  "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
                  "description": "first partition (default 0)"},
                 {"name": "limit", "in": "query", "required": False,
                  "schema": {"type": "integer", "minimum": 0, "maximum": GRID_MAX_LIMIT},
                  "description": f"partitions in the page (0 or absent: {GRID_DEFAULT_LIMIT})"}]})
    async def cluster_table(table: str, request: Request) -> Response:
        return json(views.table_replicas(table, _query(request.scope.get("query_string", b""))))

    @app.get("/console", include_in_schema=False)
    @app.get("/console/{name}", include_in_schema=False)
    async def console(name: str = "") -> Response:
        asset = console_files.get(name)
        if asset is None:
            raise StarletteHTTPException(404, f"no console file {name!r}")
        return Response(asset[0], media_type=asset[1], headers=CONSOLE_HEADERS)

    @app.get("/healthz", tags=["ops"], summary="The process is up")
    async def healthz() -> Response:
        return json({"status": "ok"})

    @app.get("/readyz", tags=["ops"], summary="Ready once routing metadata with tables is loaded")
    async def readyz() -> Response:
        snap = router.metadata.current
        if router.ready:
            return json({"status": "ready", "tables": len(snap.tables), "nodes": len(snap.nodes)})
        reason = ("stopping" if router.stopping else "no routing metadata loaded yet" if not snap.loaded
                  else "no tables registered yet")
        return json({"status": "not ready", "reason": reason}, 503)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics", response_class=Response,
             responses={200: {"description": "the Prometheus text exposition format",
                              "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}})
    async def metrics() -> Response:
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def _batch_get(router: Router, table: str, raw_body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw_body or b"{}")
    except orjson.JSONDecodeError:
        raise InvalidArgument("the body must be a JSON object") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("the body must be a JSON object")
    keys = doc.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise InvalidArgument("keys must be a list of strings", field="keys")
    min_position = doc.get("min_position")
    if min_position is not None and not isinstance(min_position, str):
        raise InvalidArgument("min_position must be a position token", field="min_position")
    bound: Bound = parse_bound(doc.get("max_lag"), doc.get("max_staleness_ms"), min_position,
                               doc.get("max_input_lag_ms"))
    results = await router.batch_get(table, keys, bound)
    return BatchResult(table, keys, [r if isinstance(r, LookupResult) else as_freshroute_error(r) for r in results]) \
        .to_dict(router.input_lag(table), router.value_format(table))

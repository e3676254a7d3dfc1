"""REST surface of the router (FastAPI), documented in OpenAPI.

Every route is a FastAPI route, so ``/docs`` and ``/openapi.json`` describe them all. Each
request is admitted once, by :class:`Admission`, from the route :mod:`router.rest_routes`
parses from its raw path; the key routes are answered by its :class:`~router.rest_routes.KeyHandlers`,
as on the HTTP/1.1 path, from that same parsed route (so keys holding ``/``, sent as ``%2F``,
work). Results become bodies by their own ``to_dict`` (:mod:`freshroute.routing.results`),
errors by :mod:`router.http_errors`.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from freshroute.errors import FreshrouteError, InvalidArgument
from freshroute.bound import MAX_LIMIT, Bound, parse_bound, parse_limit, parse_millis, parse_query_bound
from freshroute.routing.history import batch_doc, parse_time
from freshroute.routing.results import BatchResult, LookupResult
from router.auth import Guard
from router.console import HEADERS as CONSOLE_HEADERS, assets as console_assets
from router.console.views import GRID_DEFAULT_LIMIT, GRID_MAX_LIMIT, ClusterViews
from router.http_errors import as_freshroute_error, error_headers, error_response
from router.openapi import (ERROR_RESPONSES, HTTP_REFUSALS, BatchGetRequest, BatchGetResponse, ErrorBody, KeyValue,
                            ScanResponse, VersionsResponse, WindowScanResponse, WindowsResponse, as_of_parameter,
                            bound_parameters, page_parameters, version_range_parameters, window_range_parameters)
from router.rest_routes import KeyHandlers, admit, query_of, route_of
from router.routing import Router
from router.settings import RouterSettings

_JSON = "application/json"


async def handle_error(request: Request, exc: Exception) -> Response:
    """The single exception handler of the app (every error class is routed here)."""
    status, body = error_response(exc)
    # A 405 says which methods the resource has (RFC 9110 §15.5.6); Starlette names them in Allow.
    headers = exc.headers if isinstance(exc, StarletteHTTPException) else error_headers(exc)
    return Response(body, status, headers=headers or None, media_type=_JSON)


class Admission:
    """ASGI middleware: parses each request's raw path once into its route (kept in ``scope["state"]["route"]``)
    and, with a guard, admits the caller for it — its principal in ``scope["state"]["principal"]`` — or answers
    the refusal."""

    def __init__(self, app: ASGIApp, guard: Guard | None) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            route = route_of(scope.get("raw_path") or scope["path"].encode())
            state = scope.setdefault("state", {})
            state["route"] = route
            if self.guard is not None:
                headers = scope.get("headers", ())
                authorization = next((v for k, v in headers if k == b"authorization"), None)
                # The client certificate's subject, as the ASGI TLS extension carries it.
                subject = ((scope.get("extensions") or {}).get("tls") or {}).get("client_cert_name")
                try:
                    state["principal"] = await admit(self.guard, route, authorization, subject)
                except Exception as e:  # noqa: BLE001 — the same translation as every other route
                    status, body = error_response(e)
                    await send({"type": "http.response.start", "status": status, "headers": [
                        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                        *((k.encode(), v.encode()) for k, v in error_headers(e).items())]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)


# ---- the app ------------------------------------------------------------------------------

def create_app(settings: RouterSettings, router: Router, *, guard: Guard | None = None) -> FastAPI:
    """The REST app over ``router``, which its process has wired and runs (``router.main``)."""
    app = FastAPI(title="freshroute router", version="1.0", responses=HTTP_REFUSALS,
                  description="Key lookups on stream-materialized tables, served by the freshest replica "
                              "within the caller's staleness bound.")
    for exc_class in (FreshrouteError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_class, handle_error)
    if guard is None and settings.auth_file is not None:
        guard = Guard(settings.auth_file)
    app.add_middleware(Admission, guard=guard)
    handlers = KeyHandlers(router)  # the caller was admitted by Admission
    app.state.router = router
    views = ClusterViews(router)
    console_files = console_assets()

    def json(body: Any, status: int = 200) -> Response:
        return Response(orjson.dumps(body), status, media_type=_JSON)

    @app.get("/v1/tables", tags=["tables"], summary="Tables with partition count, replicas and schema")
    async def list_tables(request: Request) -> Response:
        principal = request.scope["state"].get("principal")
        return json({"tables": [t.to_dict() for t in router.views.list_tables()
                                if principal is None or principal.may_read(t.spec.name)]})

    async def key_route(request: Request) -> Response:
        # The route as parsed from the raw path: a key holding "/" is one segment, whichever route FastAPI matched.
        status, body = await handlers.respond(request.scope["state"]["route"], request.scope.get("query_string", b""))
        return Response(body, status, media_type=_JSON)

    @app.get("/v1/tables/{table}/keys/{key}", tags=["lookups"], summary="Look up one key",
             responses={200: {"model": KeyValue}, **ERROR_RESPONSES},
             openapi_extra={"parameters": [as_of_parameter(), *bound_parameters()]})
    async def get_key(table: str, key: str, request: Request) -> Response:
        return await key_route(request)

    @app.get("/v1/tables/{table}/keys/{key}/versions", tags=["lookups"],
             summary="A versioned table's key: its versions valid in [from, to), newest first, paged",
             responses={200: {"model": VersionsResponse}, **ERROR_RESPONSES},
             openapi_extra={"parameters": [*version_range_parameters(settings.scan_max_limit), *bound_parameters()]})
    async def key_versions(table: str, key: str, request: Request) -> Response:
        return await key_route(request)

    @app.get("/v1/tables/{table}/keys/{key}/metadata", tags=["lookups"],
             summary="Where a key lives: partition, active and standbys with lag",
             responses={404: {"model": ErrorBody}})
    async def key_metadata(table: str, key: str, request: Request) -> Response:
        return await key_route(request)

    @app.get("/v1/tables/{table}/keys/{key}/windows", tags=["lookups"],
             summary="A key's windows whose start is in [from, to), each saying whether it is final",
             responses={200: {"model": WindowsResponse}, **ERROR_RESPONSES},
             openapi_extra={"parameters": [*window_range_parameters(settings.max_windows), *bound_parameters()]})
    async def key_windows(table: str, key: str, request: Request) -> Response:
        return await key_route(request)

    # A key holding "/" (sent as %2F) reaches FastAPI's routing decoded, as more segments than a key route has.
    @app.get("/v1/tables/{table}/keys/{rest:path}", include_in_schema=False)
    async def key_with_slash(table: str, rest: str, request: Request) -> Response:
        return await key_route(request)

    @app.get("/v1/tables/{table}/windows", tags=["lookups"],
             summary="Windows whose start is in [from, to) across keys, in key order, paged",
             responses={200: {"model": WindowScanResponse}, **ERROR_RESPONSES},
             openapi_extra={"parameters": [
                 *window_range_parameters(settings.max_windows),
                 *page_parameters(settings.scan_default_limit, settings.scan_max_limit, "this query"),
                 *bound_parameters()]})
    async def scan_windows(table: str, request: Request) -> Response:
        q = query_of(request.scope.get("query_string", b""))
        from_ms, to_ms = parse_millis("from", q.get("from")), parse_millis("to", q.get("to"))
        page = await router.scans.windows(table, from_ms, to_ms, parse_limit("limit", q.get("limit")),
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
                 as_of_parameter("each key's value"), *bound_parameters()]})
    async def scan(table: str, request: Request) -> Response:
        q = query_of(request.scope.get("query_string", b""))
        limit = parse_limit("limit", q.get("limit"))
        as_of = parse_time("as_of", q["as_of"]) if "as_of" in q else None
        page = await router.scans.rows(table, q.get("prefix", ""), q.get("start", ""), q.get("end", ""), limit,
                                       q.get("page_token") or None, parse_query_bound(q), as_of)
        return json(page.to_dict(router.input_lag(table), router.value_format(table)))

    @app.get("/v1/cluster", tags=["cluster"], summary="Nodes, liveness, assignment and per-replica lag")
    async def cluster() -> Response:
        return json(router.views.cluster().to_dict())

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
        return json(views.table_replicas(table, query_of(request.scope.get("query_string", b""))))

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
    after = doc.get("after")
    if after is not None and not isinstance(after, str):
        raise InvalidArgument("after must be a write token", field="after")
    bound: Bound = parse_bound(doc.get("max_lag"), doc.get("max_staleness_ms"), min_position,
                               doc.get("max_input_lag_ms"), after, doc.get("wait_ms"))
    if doc.get("as_of") is not None:
        as_of = parse_time("as_of", doc["as_of"])
        answers = await router.history.batch_as_of(table, keys, as_of, bound)
        return batch_doc(table, keys, answers, as_of, router.input_lag(table), router.value_format(table))
    results = await router.batch_get(table, keys, bound)
    return BatchResult(table, keys, [r if isinstance(r, LookupResult) else as_freshroute_error(r) for r in results]) \
        .to_dict(router.input_lag(table), router.value_format(table))

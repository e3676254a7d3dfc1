"""A table's keys: one key's lookup (now or as of a time), its versions, windows and whereabouts, and many keys at
once. The key routes are answered from the route parsed from the raw path (:class:`~router.rest.routes.KeyHandlers`,
as on the HTTP/1.1 path), so a key holding ``/``, sent as ``%2F``, is one key whichever route FastAPI matched."""

from __future__ import annotations

from functools import partial
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from freshroute.bound import Bound
from freshroute.errors import InvalidArgument
from freshroute.routing.history import batch_doc, parse_time
from freshroute.routing.results import BatchResult, LookupResult
from router.http_errors import as_freshroute_error
from router.openapi import (ERROR_RESPONSES, BatchGetRequest, BatchGetResponse, ErrorBody, KeyValue, VersionsResponse,
                            WindowsResponse, as_of_parameter, bound_parameters, version_range_parameters,
                            window_range_parameters)
from router.rest.routes import JSON, KeyHandlers, json_response
from router.routing import Router
from router.settings import RouterSettings


def routes(app: FastAPI, settings: RouterSettings, handlers: KeyHandlers) -> None:
    get = partial(app.get, tags=["lookups"])
    post = partial(app.post, tags=["lookups"])

    async def key_route(request: Request) -> Response:
        # The caller was admitted by the app's Admission, for the route parsed from the raw path.
        status, body = await handlers.respond(request.scope["state"]["route"], request.scope.get("query_string", b""))
        return Response(body, status, media_type=JSON)

    @get("/v1/tables/{table}/keys/{key}", summary="Look up one key",
         responses={200: {"model": KeyValue}, **ERROR_RESPONSES},
         openapi_extra={"parameters": [as_of_parameter(), *bound_parameters()]})
    async def get_key(table: str, key: str, request: Request) -> Response:
        return await key_route(request)

    @get("/v1/tables/{table}/keys/{key}/versions",
         summary="A versioned table's key: its versions valid in [from, to), newest first, paged",
         responses={200: {"model": VersionsResponse}, **ERROR_RESPONSES},
         openapi_extra={"parameters": [*version_range_parameters(settings.scan_max_limit), *bound_parameters()]})
    async def key_versions(table: str, key: str, request: Request) -> Response:
        return await key_route(request)

    @get("/v1/tables/{table}/keys/{key}/metadata",
         summary="Where a key lives: partition, active and standbys with lag", responses={404: {"model": ErrorBody}})
    async def key_metadata(table: str, key: str, request: Request) -> Response:
        return await key_route(request)

    @get("/v1/tables/{table}/keys/{key}/windows",
         summary="A key's windows whose start is in [from, to), each saying whether it is final",
         responses={200: {"model": WindowsResponse}, **ERROR_RESPONSES},
         openapi_extra={"parameters": [*window_range_parameters(settings.max_windows), *bound_parameters()]})
    async def key_windows(table: str, key: str, request: Request) -> Response:
        return await key_route(request)

    # A key holding "/" (sent as %2F) reaches FastAPI's routing decoded, as more segments than a key route has.
    @get("/v1/tables/{table}/keys/{rest:path}", include_in_schema=False)
    async def key_with_slash(table: str, rest: str, request: Request) -> Response:
        return await key_route(request)

    @post("/v1/tables/{table}/keys:batchGet", summary="Look up many keys",
          responses={200: {"model": BatchGetResponse}, **ERROR_RESPONSES},
          openapi_extra={"requestBody": {"required": True, "content": {JSON: {
              "schema": BatchGetRequest.model_json_schema()}}}})
    async def batch_get(table: str, request: Request) -> Response:
        return json_response(await _batch_get(handlers.router, table, await request.body()))


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
    bound = Bound.parse(doc)
    table = router.resolved(table, bound)  # the version read: its answers, input lag and format
    if doc.get("as_of") is not None:
        as_of = parse_time("as_of", doc["as_of"])
        answers = await router.history.batch_as_of(table, keys, as_of, bound)
        return batch_doc(table, keys, answers, as_of, router.input_lag(table), router.value_format(table))
    results = await router.batch_get(table, keys, bound)
    return BatchResult(table, keys, [r if isinstance(r, LookupResult) else as_freshroute_error(r) for r in results]) \
        .to_dict(router.input_lag(table), router.value_format(table))

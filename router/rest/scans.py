"""Reads in key order across partitions, a page at a time: a table's keys, and a windowed table's windows."""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI, Request
from fastapi.responses import Response

from freshroute.bound import Bound, parse_limit, parse_millis
from freshroute.routing.history import parse_time
from router.openapi import (ERROR_RESPONSES, ScanResponse, WindowScanResponse, as_of_parameter, bound_parameters,
                            page_parameters, window_range_parameters)
from router.rest.routes import json_response, query_of
from router.routing import Router
from router.settings import RouterSettings


def routes(app: FastAPI, settings: RouterSettings, router: Router) -> None:
    get = partial(app.get, tags=["lookups"])

    @get("/v1/tables/{table}/windows",
         summary="Windows whose start is in [from, to) across keys, in key order, paged",
         responses={200: {"model": WindowScanResponse}, **ERROR_RESPONSES},
         openapi_extra={"parameters": [
             *window_range_parameters(settings.max_windows),
             *page_parameters(settings.scan_default_limit, settings.scan_max_limit, "this query"),
             *bound_parameters()]})
    async def scan_windows(table: str, request: Request) -> Response:
        q = query_of(request.scope.get("query_string", b""))
        from_ms, to_ms = parse_millis("from", q.get("from")), parse_millis("to", q.get("to"))
        bound = Bound.parse(q)
        table = router.resolved(table, bound)  # the version read: its answer and input lag
        page = await router.scans.windows(table, from_ms, to_ms, parse_limit("limit", q.get("limit")),
                                          q.get("page_token") or None, bound)
        return json_response(page.to_dict(router.input_lag(table)))

    @get("/v1/tables/{table}/scan", summary="Keys in order across partitions, paged",
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
        bound = Bound.parse(q)
        table = router.resolved(table, bound)
        page = await router.scans.rows(table, q.get("prefix", ""), q.get("start", ""), q.get("end", ""), limit,
                                       q.get("page_token") or None, bound, as_of)
        return json_response(page.to_dict(router.input_lag(table), router.value_format(table)))

"""The REST key routes — a key's lookup, windows and metadata — answered the same way through either REST door.

The HTTP/1.1 path (:mod:`router.transports.http1`) calls :meth:`KeyHandlers.answer` with the
route it matched, and the FastAPI routes call :meth:`KeyHandlers.respond` with the route the
app parsed; both routes come from :mod:`router.rest_routes`. This is
:class:`router.transports.KeyRoutes`, the HTTP/1.1 path's view of the REST API.
"""

from __future__ import annotations

from typing import Callable
from urllib.parse import parse_qsl

import orjson

from freshroute.errors import foreign
from freshroute.routing.bound import NO_BOUND, parse_millis, parse_query_bound
from freshroute.routing.results import key_not_found
from router.auth import Guard
from router.http_errors import error_headers, error_response
from router.rest_routes import METADATA, WINDOWS, Route, admit, key_route, segment
from router.routing import Router


def query_of(raw: bytes) -> dict[str, str]:
    """A raw query string's parameters (the last of a repeated one)."""
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True)) if raw else {}


class KeyHandlers:
    """A key route's answer as (status, JSON body): errors included, never raised."""

    match: Callable[[bytes], Route | None] = staticmethod(key_route)

    def __init__(self, router: Router, guard: Guard | None = None) -> None:
        self.router = router
        self.guard = guard

    async def answer(self, route: Route, query: bytes, authorization: bytes | None = None,
                     subject: str | None = None) -> tuple[int, bytes, dict[str, str]]:
        """(status, JSON body, extra headers) of a GET on ``route``, the caller admitted here first."""
        try:
            if self.guard is not None:
                await admit(self.guard, route, authorization, subject)
        except Exception as e:  # noqa: BLE001 — the same translation as every other route
            return (*error_response(e), error_headers(e))
        return (*await self.respond(route, query), {})

    async def respond(self, route: Route, query: bytes) -> tuple[int, bytes]:
        """(status, JSON body) of a GET on ``route`` by a caller already admitted."""
        try:
            if route.key is None:
                raise foreign("NOT_FOUND", 404, "Not Found")
            table, key = segment(route.table), segment(route.key)
            if route.op == METADATA:
                body = self.router.key_metadata(table, key).to_dict()
            elif route.op == WINDOWS:
                body = await self._windows(table, key, query_of(query))
            else:
                body = await self._lookup(table, key, query)
            return 200, orjson.dumps(body)
        except Exception as e:  # noqa: BLE001
            return error_response(e)

    async def _lookup(self, table: str, key: str, query: bytes) -> dict:
        bound = self.router.parsed(parse_query_bound, query_of(query)) if query else NO_BOUND
        result = await self.router.get(table, key, bound)
        if not result.found:
            raise key_not_found(result, self.router.input_lag(table))
        return result.to_dict(self.router.input_lag(table), self.router.value_format(table))

    async def _windows(self, table: str, key: str, q: dict[str, str]) -> dict:
        parsed = self.router.parsed
        from_ms, to_ms = parsed(parse_millis, "from", q.get("from")), parsed(parse_millis, "to", q.get("to"))
        result = await self.router.windows(table, key, from_ms, to_ms, parsed(parse_query_bound, q))
        return result.to_dict(self.router.input_lag(table))

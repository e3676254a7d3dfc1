"""The REST routes: what a path names, parsed once from the raw (still percent-encoded) path; the access each
needs; and the key routes' answers — a key's lookup, windows and metadata — the same through either REST door.

Both doors parse with :func:`route_of` (the HTTP/1.1 path asks :func:`key_route` of every request it
reads) and admit with :func:`admit`. The HTTP/1.1 path (:mod:`router.transports.http1`) answers key
routes on the connection with :meth:`KeyHandlers.answer`; the FastAPI app (every route, through
uvicorn: :mod:`router.rest.app`) with :meth:`KeyHandlers.respond`. Paths are split raw, so a key holding ``/`` (sent as
``%2F``) is one segment. A path not named here needs what the cluster view needs: access is denied
by default.
"""

from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple
from urllib.parse import parse_qsl, unquote_to_bytes

import orjson
from fastapi.responses import Response

from freshroute.bound import NO_BOUND, Bound, parse_limit, parse_millis
from freshroute.errors import InvalidArgument, foreign
from freshroute.routing.history import parse_time
from freshroute.routing.results import key_not_found
from router.auth import Guard, Principal
from router.http_errors import error_headers, error_response
from router.routing import Router

# What a route needs: nothing, any principal, read access to its table, or the cluster view.
OPEN, PRINCIPAL, TABLE, CLUSTER = "open", "principal", "table", "cluster"
# The key routes: /v1/tables/{table}/keys/{key}[/metadata|/windows|/versions]
LOOKUP, METADATA, WINDOWS, VERSIONS = b"", b"metadata", b"windows", b"versions"

_PREFIX = b"/v1/tables/"
JSON = "application/json"
# Open to anyone: a load balancer's health checks carry no token, and the console's files hold no data (the page
# asks for a token and sends it with every read of the API).
_OPEN = frozenset((b"/healthz", b"/readyz", b"/console"))
_TABLE_READS = frozenset((b"scan", b"keys:batchGet", b"windows"))
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


class Route(NamedTuple):
    """A parsed REST path: what it needs, and the raw segments it names."""

    need: str
    table: bytes = b""
    key: bytes | None = None  # set for the key routes only
    op: bytes = LOOKUP  # of a key route: LOOKUP, METADATA, WINDOWS or VERSIONS


def key_route(raw_path: bytes) -> Route | None:
    """The key route ``raw_path`` names, or None: the HTTP/1.1 path's question, asked of every request it reads."""
    if not raw_path.startswith(_PREFIX):
        return None
    parts = raw_path[len(_PREFIX):].split(b"/")
    if len(parts) == 3 and parts[1] == b"keys" and parts[0] and parts[2]:
        return Route(TABLE, parts[0], parts[2], LOOKUP)
    if len(parts) == 4 and parts[1] == b"keys" and parts[0] and parts[2]:
        if parts[3] == METADATA:
            return Route(CLUSTER, parts[0], parts[2], METADATA)
        if parts[3] == WINDOWS or parts[3] == VERSIONS:
            return Route(TABLE, parts[0], parts[2], parts[3])
    return None


def route_of(raw_path: bytes) -> Route:
    """What any path names (its query string, if any, aside)."""
    path = raw_path.partition(b"?")[0]
    if path in _OPEN or path.startswith(b"/console/"):
        return Route(OPEN)
    if path.rstrip(b"/") == b"/v1/tables":
        return Route(PRINCIPAL)
    key = key_route(path)
    if key is not None:
        return key
    if path.startswith(_PREFIX):
        table, _, tail = path[len(_PREFIX):].partition(b"/")
        if table and tail in _TABLE_READS:
            return Route(TABLE, table)
    return Route(CLUSTER)


def segment(raw: bytes) -> str:
    """A raw path segment as text; a malformed escape or non-UTF-8 bytes are an :class:`InvalidArgument`."""
    if b"%" in raw:
        if _BAD_ESCAPE.search(raw):
            raise InvalidArgument("a path segment has a '%' not followed by two hex digits (percent-encode '%' as %25)")
        raw = unquote_to_bytes(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument("path segments must be UTF-8") from None


async def admit(guard: Guard, route: Route, authorization: bytes | None, subject: str | None) -> Principal | None:
    """The caller's principal if it may do what ``route`` names (None for open routes); refused otherwise."""
    if route.need == OPEN:
        return None
    if route.need == PRINCIPAL:
        return await guard.principal(authorization, subject)
    if route.need == TABLE:
        return await guard.table(authorization, segment(route.table), subject)
    return await guard.cluster(authorization, subject)


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status, media_type=JSON)


def query_of(raw: bytes) -> dict[str, str]:
    """A raw query string's parameters (the last of a repeated one), blank ones kept, as ``parse_qsl`` reads them."""
    if not raw:
        return {}
    text = raw.decode("utf-8", "replace")
    if "%" in text or "+" in text:
        return dict(parse_qsl(text, keep_blank_values=True))
    # Nothing to unquote (a lookup's ``as_of=MS``, a bound): split it, several times faster than parse_qsl.
    out = {}
    for pair in text.split("&"):
        if pair:
            name, _, value = pair.partition("=")
            out[name] = value
    return out


class KeyHandlers:
    """A key route's answer as (status, JSON body), errors included, never raised: the HTTP/1.1 path's view of the
    REST API (:class:`router.transports.KeyRoutes`)."""

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
                body = self.router.views.key_metadata(table, key).to_dict()
            elif route.op == WINDOWS:
                body = await self._windows(table, key, query_of(query))
            elif route.op == VERSIONS:
                body = await self._versions(table, key, query_of(query))
            else:
                body = await self._lookup(table, key, query)
            return 200, orjson.dumps(body)
        except Exception as e:  # noqa: BLE001
            return error_response(e)

    async def _lookup(self, table: str, key: str, query: bytes) -> dict:
        q = query_of(query) if query else {}
        bound = self.router.parsed(Bound.parse, q) if query else NO_BOUND
        table = self.router.resolved(table, bound)  # the version read: its answer, input lag and format
        if "as_of" in q:
            return await self._as_of(table, key, self.router.parsed(parse_time, "as_of", q["as_of"]), bound)
        result = await self.router.get(table, key, bound)
        if not result.found:
            raise key_not_found(result, self.router.input_lag(table))
        return result.to_dict(self.router.input_lag(table), self.router.value_format(table))

    async def _as_of(self, table: str, key: str, as_of_ms: int, bound: Bound) -> dict:
        answer = await self.router.history.as_of(table, key, as_of_ms, bound)
        if not answer.lookup.found:
            raise answer.not_found(self.router.input_lag(table))
        return answer.to_dict(self.router.input_lag(table), self.router.value_format(table))

    async def _versions(self, table: str, key: str, q: dict[str, str]) -> dict:
        parsed = self.router.parsed
        from_ms = parsed(parse_time, "from", q["from"]) if q.get("from") else None
        to_ms = parsed(parse_time, "to", q["to"]) if q.get("to") else None
        bound = parsed(Bound.parse, q)
        table = self.router.resolved(table, bound)
        page = await self.router.history.versions(table, key, from_ms, to_ms, parsed(parse_limit, "limit", q.get("limit")),
                                                  q.get("page_token") or None, bound)
        return page.to_dict(self.router.input_lag(table), self.router.value_format(table))

    async def _windows(self, table: str, key: str, q: dict[str, str]) -> dict:
        parsed = self.router.parsed
        from_ms, to_ms = parsed(parse_millis, "from", q.get("from")), parsed(parse_millis, "to", q.get("to"))
        bound = parsed(Bound.parse, q)
        table = self.router.resolved(table, bound)
        result = await self.router.windows(table, key, from_ms, to_ms, bound)
        return result.to_dict(self.router.input_lag(table))

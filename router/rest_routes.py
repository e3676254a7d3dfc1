"""What a REST path names, parsed once from the raw (still percent-encoded) path, and the access each needs.

Both REST doors parse with :func:`route_of` and admit with :func:`admit`: the HTTP/1.1 path
(key routes answered on the connection) and the ASGI app (every route, through uvicorn).
Paths are split raw, so a key holding ``/`` (sent as ``%2F``) is one segment. A path not
named here needs what the cluster view needs: access is denied by default.
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import unquote_to_bytes

from freshroute.errors import InvalidArgument
from router.auth import Guard, Principal

# What a route needs: nothing, any principal, read access to its table, or the cluster view.
OPEN, PRINCIPAL, TABLE, CLUSTER = "open", "principal", "table", "cluster"
# The key routes: /v1/tables/{table}/keys/{key}[/metadata|/windows]
LOOKUP, METADATA, WINDOWS = b"", b"metadata", b"windows"

_PREFIX = b"/v1/tables/"
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
    op: bytes = LOOKUP  # of a key route: LOOKUP, METADATA or WINDOWS


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
        if parts[3] == WINDOWS:
            return Route(TABLE, parts[0], parts[2], WINDOWS)
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

"""The router's hand-written transports: protocol code only, one module per protocol layer.

- :mod:`router.transports.http1` — the REST port's HTTP/1.1 protocol: key lookups answered on
  the connection itself, every other request handed to uvicorn's own protocol.
- :mod:`router.transports.http2` — HTTP/2 as a protocol machine: bytes in, events out, bytes to
  send; no sockets, no asyncio.
- :mod:`router.transports.grpc_calls` — gRPC over that machine's events: ``Router.Get`` answered
  in place, every other call relayed to the full grpc.aio server.
- :mod:`router.transports.grpc_front` — the public gRPC port: the asyncio adapter between a
  connection's socket, its machine and its calls, and the server that accepts them.

Both ports' transports exist because they pay for themselves in ``freshroute bench``
(docs/benchmarks.md has the figures); both are held to their protocols by
tests/integration/test_transport_conformance.py (the HTTP/2 cases also fed straight to the machine).
They know nothing of tables or replicas: each calls the API through the small interface below.
"""

from __future__ import annotations

from typing import Any, Protocol

import grpc

from proto import router_pb2


class KeyRoutes(Protocol):
    """What the HTTP/1.1 path needs of the REST API: which requests are key lookups, and their answers."""

    def match(self, raw_path: bytes) -> Any | None:
        """The key route a raw (still percent-encoded) path names, or None if it names none."""

    async def answer(self, route: Any, query: bytes, authorization: bytes | None,
                     subject: str | None = None) -> tuple[int, bytes, dict[str, str]]:
        """(HTTP status, JSON body, extra headers) of a GET on ``route`` with its raw query string, the
        request's ``Authorization`` header (None: absent) and the subject of the client certificate its
        connection presented (None: none); never raises."""


class GetCalls(Protocol):
    """What the gRPC front needs of the Router service: ``Get`` answered, and errors as gRPC statuses."""

    async def get(self, request: router_pb2.GetRequest, authorization: bytes | None,
                  subject: str | None = None) -> router_pb2.GetResponse:
        """The answer to one ``Router.Get`` (with the call's ``authorization`` metadata, None: absent, and the
        subject of the connection's client certificate); errors are raised, for :meth:`status` to translate."""

    def status(self, exc: BaseException) -> tuple[grpc.StatusCode, str, tuple[tuple[bytes, bytes], ...]]:
        """(status code, message, trailing metadata) of a call that failed with ``exc``."""

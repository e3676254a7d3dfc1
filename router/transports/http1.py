"""The REST port's HTTP/1.1 protocol, on httptools: key lookups are answered on the connection itself.

Served through uvicorn's protocol, every request costs an ASGI scope, a request-response
cycle with its event, a keep-alive timer and two writes — together as much CPU as the
lookup behind them. Lookups are the product, so :class:`KeyLookupProtocol` parses
``GET /v1/tables/{table}/keys/{key}`` (and ``…/metadata``) with httptools and answers each
with one write, through the same handlers as the ASGI app. The first request on a
connection that is anything else (another route or method, a body, an upgrade, an
absolute URL) hands the connection to uvicorn's own protocol for good, with every byte
not answered yet, once the answers already owed have been written: FastAPI serves the
rest of the documented surface exactly as before. uvicorn is used only as it is
configured: this protocol is the ``http=`` class of a ``uvicorn.Config``, built with what
uvicorn gives such a class, and it hands over to the class uvicorn's ``http="httptools"``
names. The REST API is known only through :class:`router.transports.KeyRoutes`.

Requests on one connection are answered one at a time, in order (pipelined ones wait).
Answers worked out in one turn of the event loop leave together, back to back, after it
(:class:`AnswerWriter`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from functools import partial
from http import HTTPStatus
from typing import Any, Callable

import httptools
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string

from freshroute.tls import peer_subject
from router.transports import KeyRoutes

STATUS_LINE = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}

# What a request's head may take before it is refused and its connection closed.
MAX_REQUEST_LINE_URL = 8 << 10
MAX_HEAD = 32 << 10
HEAD_TIMEOUT_S = 10.0


def refusal(status: int, text: str) -> bytes:
    """A plain-text answer that closes the connection."""
    body = text.encode()
    return b"%scontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (
        STATUS_LINE[status], len(body), body)


_BAD_REQUEST = refusal(400, "Invalid HTTP request received.")
_URL_TOO_LONG = refusal(414, f"The request line's URL is longer than {MAX_REQUEST_LINE_URL} bytes.")
_HEAD_TOO_LARGE = refusal(431, f"The request's head is larger than {MAX_HEAD} bytes.")
_HEAD_TOO_SLOW = refusal(408, f"The request's head did not arrive within {HEAD_TIMEOUT_S:g} s.")
# A header that gives the request a body or changes the protocol: such a request is uvicorn's.
_NOT_PLAIN = frozenset((b"content-length", b"transfer-encoding", b"expect", b"upgrade"))


class _HandOver(Exception):
    """Raised from a parser callback: the request being parsed is not a key lookup."""


class _Refuse(Exception):
    """Raised from a parser callback: the request is answered ``answer`` and the connection closed."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer


class AnswerWriter:
    """Writes the answers worked out in one turn of the event loop one after another, after it.

    A write to a client asleep in ``epoll_wait`` wakes it, and on a small virtual machine
    the wake-up costs more than the write. The answers of one store batch are worked out in
    one turn, each in its own task; written back to back after it, a client that reads many
    connections (a load balancer, wrk) is woken once for them rather than once each.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: list[tuple[asyncio.Transport, bytes]] = []

    def write(self, transport: asyncio.Transport, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append((transport, data))

    def flush(self) -> None:
        """Write every answer waiting; a connection's earlier answers go before its later writes."""
        pending, self._pending = self._pending, []
        for transport, data in pending:
            if not transport.is_closing():
                transport.write(data)


_writers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AnswerWriter]" = weakref.WeakKeyDictionary()


def answer_writer(loop: asyncio.AbstractEventLoop) -> AnswerWriter:
    """The loop's one writer: all connections served by a loop share it."""
    writer = _writers.get(loop)
    if writer is None:
        writer = _writers[loop] = AnswerWriter(loop)
    return writer


def key_lookup_protocol(routes: KeyRoutes) -> Callable[..., asyncio.Protocol]:
    """The ``http=`` of a ``uvicorn.Config``: key lookups answered here, the rest by uvicorn's httptools protocol."""
    return partial(KeyLookupProtocol, routes, httptools_with_tls_extension())


def httptools_with_tls_extension() -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, putting the subject of the connection's client certificate into every
    request's scope as the ASGI TLS extension does (``scope["extensions"]["tls"]["client_cert_name"]``)."""
    base: Any = import_from_string(HTTP_PROTOCOLS["httptools"])

    class WithTLSExtension(base):  # type: ignore[misc, valid-type]
        _subject: str | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._subject = peer_subject(transport)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._subject is not None:
                self.scope.setdefault("extensions", {})["tls"] = {"client_cert_name": self._subject}

    return WithTLSExtension


class KeyLookupProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection; built by uvicorn (``http=``) with the key routes and the hand-over protocol bound first."""

    def __init__(self, routes: KeyRoutes, fallback: Callable[..., asyncio.Protocol], config: Any, server_state: Any,
                 app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.routes = routes
        self.fallback = fallback
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.writer = answer_writer(self.loop)
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        # Bytes received and neither answered nor parsed past: at a hand-over they are
        # the request uvicorn starts from, and everything after it.
        self.buffer = b""
        self.url = b""
        self.plain = True
        self.head_len = 0
        # (key route, query, keep alive, authorization) of each request parsed and not answered yet
        self.requests: deque[tuple[Any, bytes, bool, bytes | None]] = deque()
        self.match: Any = None  # the key route of the request being parsed
        self.query = b""
        self.authorization: bytes | None = None
        self.subject: str | None = None
        self.head_since: float | None = None  # when the head being parsed began to arrive
        self.busy = False  # an answer of this connection is being worked out
        self.handing_over = False
        self.closing = False  # close after the answers owed (server shutdown)
        self.writing_paused = False
        self.idle_since = 0.0
        self.idle_timer: asyncio.TimerHandle | None = None
        self._headers_of: list[tuple[bytes, bytes]] | None = None
        self._headers = b""

    # ---- connection -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.subject = peer_subject(transport)  # of a verified client certificate, on a port that requires one
        self.server_state.connections.add(self)
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.requests.clear()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close now if idle, else after the answers owed."""
        self.closing = True
        if not self.busy and not self.requests:
            self.writer.flush()
            self.transport.close()

    def pause_writing(self) -> None:
        # The client does not read its answers: stop reading its requests until it does.
        self.writing_paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if not self.handing_over:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.idle_since = self.loop.time()
        self.buffer += data
        try:
            self.parser.feed_data(data)
            if self.head_since is not None and len(self.buffer) > MAX_HEAD:
                raise _Refuse(_HEAD_TOO_LARGE)
        except httptools.HttpParserCallbackError as e:
            if isinstance(e.__context__, _Refuse):
                self._refuse(e.__context__.answer)
                return
            if not isinstance(e.__context__, _HandOver):
                raise
            self.handing_over = True
            self.transport.pause_reading()
            if not self.busy:
                self._hand_over()
        except _Refuse as e:
            self._refuse(e.answer)
        except httptools.HttpParserError:
            self._refuse(_BAD_REQUEST)

    def _refuse(self, answer: bytes) -> None:
        """Answer the request being parsed with ``answer`` and close; nothing more is read or answered."""
        self.head_since = None
        self.requests.clear()
        self.closing = True
        self.transport.pause_reading()
        self.writer.flush()
        self.transport.write(answer)
        self.transport.close()

    # ---- parser callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.plain = True
        self.authorization = None
        self.head_since = self.loop.time()
        # Blank lines before a request line are allowed, and not part of the request.
        self.buffer = self.buffer.lstrip(b"\r\n")

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_REQUEST_LINE_URL:
            raise _Refuse(_URL_TOO_LONG)

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower in _NOT_PLAIN:
            self.plain = False
        elif lower == b"authorization":
            self.authorization = value

    def on_headers_complete(self) -> None:
        self.head_since = None
        head_end = self.buffer.find(b"\r\n\r\n")
        if (head_end if head_end >= 0 else len(self.buffer)) > MAX_HEAD:
            raise _Refuse(_HEAD_TOO_LARGE)
        path, _, self.query = self.url.partition(b"?")
        self.match = self.routes.match(path) if self.plain and head_end >= 0 else None
        if self.match is None or self.parser.get_method() != b"GET" or self.parser.should_upgrade():
            raise _HandOver
        self.head_len = head_end + 4

    def on_message_complete(self) -> None:
        self.buffer = self.buffer[self.head_len:]
        self.requests.append((self.match, self.query, self.parser.should_keep_alive(), self.authorization))
        if not self.busy:
            self._answer_next()

    # ---- answers ----------------------------------------------------------------------

    def _answer_next(self) -> None:
        match, query, keep_alive, authorization = self.requests.popleft()
        self.busy = True
        self.loop.create_task(self._answer(match, query, keep_alive, authorization))

    async def _answer(self, match: Any, query: bytes, keep_alive: bool, authorization: bytes | None) -> None:
        try:
            status, body, extra = await self.routes.answer(match, query, authorization, self.subject)
        finally:
            self.busy = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        keep_alive = keep_alive and not (self.closing and not self.requests)
        answer = b"".join((STATUS_LINE[status], self._default_headers(),
                           *(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in extra.items()),
                           b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body),
                           b"\r\n" if keep_alive else b"connection: close\r\n\r\n", body))
        if keep_alive and not self.requests and not self.handing_over:
            # The usual case: nothing follows on this connection until the client asks again.
            self.writer.write(transport, answer)
            self.idle_since = self.loop.time()
            return
        # A close, a pipelined request or a hand-over follows: this answer, and any still
        # waiting before it, are written first.
        self.writer.flush()
        transport.write(answer)
        if not keep_alive:
            transport.close()
        elif self.requests:
            self._answer_next()
        elif self.handing_over:
            self._hand_over()
        else:
            self.idle_since = self.loop.time()

    def _default_headers(self) -> bytes:
        # uvicorn renews its default headers (date, server) once a second.
        current = self.server_state.default_headers
        if current is not self._headers_of:
            self._headers_of = current
            self._headers = b"".join(b"%s: %s\r\n" % (name, value) for name, value in current)
        return self._headers

    def _hand_over(self) -> None:
        """From here on uvicorn's protocol serves this connection, starting from the bytes not answered."""
        self.server_state.connections.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.writer.flush()  # uvicorn's answers come after this connection's own
        protocol = self.fallback(config=self.config, server_state=self.server_state, app_state=self.app_state,
                                 _loop=self.loop)
        protocol.connection_made(self.transport)
        self.transport.set_protocol(protocol)
        data, self.buffer = self.buffer, b""
        if not self.writing_paused:
            self.transport.resume_reading()
        protocol.data_received(data)

    # ---- idle keep-alive connections --------------------------------------------------

    def _arm_idle_timer(self) -> None:
        # One timer per connection, pushed back while it is in use (not one per request).
        self.idle_since = self.loop.time()
        self.idle_timer = self.loop.call_later(self.config.timeout_keep_alive, self._check_idle)

    def _check_idle(self) -> None:
        if self.transport is None or self.transport.is_closing() or self.handing_over:
            return
        now = self.loop.time()
        if self.head_since is not None and now - self.head_since > HEAD_TIMEOUT_S:
            self._refuse(_HEAD_TOO_SLOW)  # a head trickling in keeps the connection busy, never idle
            return
        idle = now - self.idle_since
        if not self.busy and not self.requests and idle >= self.config.timeout_keep_alive:
            self.writer.flush()
            self.transport.close()
            return
        wait = self.config.timeout_keep_alive - idle if not self.busy else self.config.timeout_keep_alive
        self.idle_timer = self.loop.call_later(max(wait, 0.05), self._check_idle)

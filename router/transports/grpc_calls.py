"""gRPC over one HTTP/2 connection's events: ``Router.Get`` answered in place, every other call relayed to grpc.aio.

:class:`GrpcCalls` takes the events of an :class:`~router.transports.http2.connection.H2Connection`
(a request's headers, its bytes, its end, its reset) and answers through the same machine:
gRPC's message framing, its statuses in trailers, its metadata. ``Router.Get`` is answered
with the code grpc.aio would run (:class:`router.transports.GetCalls`); any other call — BatchGet,
Scan, the metadata calls, health, reflection — is carried message by message to the full
grpc.aio server on a private loopback port and back, so each method has one implementation.
No compression of messages (clients are told ``identity``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import struct
from typing import Any, Callable, NamedTuple
from urllib.parse import quote

import grpc
from google.protobuf.message import DecodeError

from freshroute.errors import InvalidArgument
from proto import router_pb2
from router.transports import GetCalls
from router.transports.http2.connection import H2Connection
from router.transports.http2.events import DataReceived, Drained, Event, RequestEnded, RequestStarted, StreamReset
from router.transports.http2.frames import integer, literal, status

log = logging.getLogger("freshroute.router.grpc")

GET_PATH = b"/freshroute.v1.Router/Get"
_MESSAGE = struct.Struct(">BI")  # gRPC message prefix: compressed flag, length
MAX_MESSAGE = 4 << 20  # gRPC's default largest received message
# A relayed call stops reading answers from grpc.aio while this much waits for the peer's window,
# and stops granting the peer window while this many request messages wait for grpc.aio.
SEND_BUFFER = 256 << 10
QUEUED_MESSAGES = 8

# A relayed call's client certificate subject, and the key that vouches for it: only the front sets them,
# so a client's own headers of these names are dropped.
CLIENT_SUBJECT, RELAY_KEY = "x-freshroute-client-subject", "x-freshroute-relay-key"
# Headers that are HTTP/2's or gRPC's own (or the relay's), not call metadata to relay.
_NOT_METADATA = frozenset((b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                           b"user-agent", b"host", b"connection", CLIENT_SUBJECT.encode(), RELAY_KEY.encode()))
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}

# ":status: 200", and "content-type" (static entry 31) as a literal of that name.
RESPONSE_HEADERS = status(200) + integer(31, 4) + integer(16, 7) + b"application/grpc"
OK_TRAILERS = literal(b"grpc-status", b"0")
# What a request that is no gRPC call is answered: 415 and why, in plain text.
NOT_GRPC_HEADERS = status(415) + literal(b"content-type", b"text/plain; charset=utf-8")
NOT_GRPC_BODY = b"this port serves gRPC: a call is a POST with content-type application/grpc\n"


def status_block(code: grpc.StatusCode, message: str, metadata: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """Trailers ending a call with ``code``: grpc-message percent-encoded as gRPC asks."""
    block = literal(b"grpc-status", str(code.value[0]).encode())
    if message:
        block += literal(b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode())
    for name, value in metadata:
        block += literal(name, value)
    return block


COMPRESSED = status_block(grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not accepted")
TOO_LARGE = status_block(grpc.StatusCode.RESOURCE_EXHAUSTED, "request larger than 4 MiB")


def grpc_timeout(value: bytes | None) -> float | None:
    """Seconds of a ``grpc-timeout`` header ("100m", "5S"); None when absent or malformed."""
    if not value or value[-1:] not in _TIMEOUT_UNITS or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1:]]


class Call:
    """One gRPC call: what arrived of its request, and how its answer goes."""

    __slots__ = ("id", "path", "headers", "received", "owed", "headers_sent", "done", "task", "messages", "drained")

    def __init__(self, stream_id: int, path: bytes, headers: list[tuple[bytes, bytes]], relayed: bool) -> None:
        self.id = stream_id
        self.path = path
        self.headers = headers
        self.received = bytearray()  # request bytes not yet split into messages
        self.owed = 0  # request bytes taken but not yet granted back to the peer
        self.headers_sent = False
        self.done = False
        self.task: asyncio.Task[None] | None = None
        self.messages: asyncio.Queue[bytes | None] | None = asyncio.Queue() if relayed else None
        self.drained: asyncio.Event | None = asyncio.Event() if relayed else None
        if self.drained is not None:
            self.drained.set()


class Relay(NamedTuple):
    """Where calls not answered in place go: a channel to the grpc.aio server, and the key that vouches for the
    client certificate subject they carry."""

    channel: grpc.aio.Channel
    key: str


class GrpcCalls:
    """The gRPC calls of one connection, answered through its HTTP/2 machine; ``flush`` sends what they queued."""

    def __init__(self, h2: H2Connection, get: GetCalls, relay: Relay, subject: str | None,
                 flush: Callable[[], None]) -> None:
        self._h2 = h2
        self._get_calls = get
        self._relay_to = relay
        self._subject = subject  # of a verified client certificate, on a port that requires one
        self._flush = flush
        self._loop = asyncio.get_running_loop()
        self._calls: dict[int, Call] = {}
        self._refused: set[int] = set()  # streams of requests that are no gRPC call, answered once they end

    def handle(self, events: list[Event]) -> None:
        for e in events:
            kind = type(e)
            if kind is DataReceived:
                self._data(e)  # type: ignore[arg-type]
            elif kind is RequestStarted:
                self._start(e)  # type: ignore[arg-type]
            elif kind is RequestEnded:
                self._ended(e.stream_id)
            elif kind is StreamReset:
                self._stop(e.stream_id)
            elif kind is Drained:
                call = self._calls.get(e.stream_id)
                if call is not None and call.drained is not None:
                    call.drained.set()

    def cancel_all(self) -> None:
        """The connection is gone: every call in flight stops."""
        for stream_id in list(self._calls):
            self._stop(stream_id)

    # ---- requests -----------------------------------------------------------------------------

    def _start(self, e: RequestStarted) -> None:
        method = path = content_type = None
        for name, value in e.headers:
            if name == b":path":
                path = value
            elif name == b":method":
                method = value
            elif name == b"content-type":
                content_type = value
        if method != b"POST" or not content_type or not content_type.startswith(b"application/grpc"):
            # Not a gRPC call: a plain HTTP 415, as gRPC asks, once the request has ended (its body unread).
            if e.ended:
                self._not_grpc(e.stream_id)
            else:
                self._refused.add(e.stream_id)
            return
        call = self._calls[e.stream_id] = Call(e.stream_id, path or b"", e.headers, relayed=path != GET_PATH)
        if call.messages is not None:
            call.task = self._loop.create_task(self._relay(call), name=f"grpc-relay-{call.id}")
        if e.ended:
            self._ended(call.id)

    def _data(self, e: DataReceived) -> None:
        call = self._calls.get(e.stream_id)
        if call is None:
            return
        call.received += e.data
        call.owed += e.size
        if call.messages is not None:
            self._split_messages(call)
        elif len(call.received) > MAX_MESSAGE + 5:
            self._end_call(call, TOO_LARGE)
            return
        self._grant(call)

    def _grant(self, call: Call) -> None:
        """Gives the peer back the window its request bytes took, unless a relay has fallen behind.

        A request message larger than the window still arrives whole (its bytes are granted as
        they come, up to MAX_MESSAGE); a peer that sends messages faster than the relay hands
        them on waits once QUEUED_MESSAGES of them are queued (the relay grants again as it
        catches up).
        """
        if call.done or (call.messages is not None and call.messages.qsize() >= QUEUED_MESSAGES):
            return
        self._h2.consumed(call.id, call.owed)
        call.owed = 0

    def _split_messages(self, call: Call) -> None:
        """Relayed calls: each complete message goes to the relay as it arrives."""
        buf = call.received
        while len(buf) >= 5:
            compressed, length = _MESSAGE.unpack_from(buf)
            if length > MAX_MESSAGE:
                self._end_call(call, TOO_LARGE)
                return
            if len(buf) < 5 + length:
                return
            if compressed:
                self._end_call(call, COMPRESSED)
                return
            call.messages.put_nowait(bytes(buf[5:5 + length]))  # type: ignore[union-attr]
            del buf[:5 + length]

    def _ended(self, stream_id: int) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            if stream_id in self._refused:
                self._refused.discard(stream_id)
                self._not_grpc(stream_id)
            return
        if call.messages is None:
            self._answer_get(call)
        elif call.received:
            self._end_call(call, status_block(grpc.StatusCode.INTERNAL, "the request ended inside a message"))
        else:
            call.messages.put_nowait(None)

    def _stop(self, stream_id: int) -> None:
        self._refused.discard(stream_id)
        call = self._calls.pop(stream_id, None)
        if call is not None:
            call.done = True
            self._release(call, cancel=True)

    @staticmethod
    def _release(call: Call, cancel: bool) -> None:
        if call.drained is not None:
            call.drained.set()
        if call.messages is not None:
            call.messages.put_nowait(None)
        if cancel and call.task is not None and not call.task.done():
            call.task.cancel()

    # ---- Router.Get, in place -----------------------------------------------------------------

    def _answer_get(self, call: Call) -> None:
        body = call.received
        try:
            if len(body) < 5:
                raise InvalidArgument("a Get call carries one GetRequest message; this one carried none")
            compressed, length = _MESSAGE.unpack_from(body)
            if compressed:
                self._end_call(call, COMPRESSED)
                return
            if length != len(body) - 5:
                raise InvalidArgument("a Get call carries exactly one GetRequest message")
            request = router_pb2.GetRequest.FromString(bytes(body[5:]))
        except InvalidArgument as e:
            self._end_call(call, self._error(e))
            return
        except DecodeError:
            self._end_call(call, self._error(InvalidArgument("the request is not a GetRequest message")))
            return
        call.received = bytearray()
        call.task = self._loop.create_task(self._get(call, request))

    async def _get(self, call: Call, request: router_pb2.GetRequest) -> None:
        try:
            authorization = next((v for n, v in call.headers if n == b"authorization"), None)
            response = await self._get_calls.get(request, authorization, self._subject)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 — every error leaves as a status, translated once
            self._end_call(call, self._error(e))
            return
        self._send_message(call, response.SerializeToString())
        self._end_call(call, OK_TRAILERS)

    def _error(self, exc: BaseException) -> bytes:
        """Trailers of a call that failed with ``exc``, as the Router service translates it."""
        return status_block(*self._get_calls.status(exc))

    # ---- answers ------------------------------------------------------------------------------

    def _not_grpc(self, stream_id: int) -> None:
        self._h2.send_headers(stream_id, NOT_GRPC_HEADERS)
        self._h2.send_data(stream_id, NOT_GRPC_BODY, end_stream=True)
        self._flush()

    def _send_headers(self, call: Call, extra: bytes = b"") -> None:
        if not call.headers_sent and not call.done:
            call.headers_sent = True
            self._h2.send_headers(call.id, RESPONSE_HEADERS + extra)

    def _send_message(self, call: Call, payload: bytes) -> None:
        """One gRPC message of the answer, sent as far as the windows allow."""
        if call.done:
            return
        self._send_headers(call)
        self._h2.send_data(call.id, _MESSAGE.pack(0, len(payload)) + payload)
        self._flush()

    def _end_call(self, call: Call, trailers: bytes) -> None:
        """The call's status: after its DATA, or alone (gRPC's trailers-only answer) if none was sent."""
        if call.done:
            return
        call.done = True
        self._calls.pop(call.id, None)
        if call.headers_sent:
            self._h2.send_trailers(call.id, trailers)
        else:
            call.headers_sent = True
            self._h2.send_headers(call.id, RESPONSE_HEADERS + trailers, end_stream=True)
        # A relay still running stops, unless it is what ended the call.
        self._release(call, cancel=call.task is not asyncio.current_task(self._loop))
        self._flush()

    # ---- every other call, relayed to grpc.aio ------------------------------------------------

    async def _relay(self, call: Call) -> None:
        """One call of any other method, carried message by message to the grpc.aio server and back."""
        path = call.path.decode("ascii", "replace")
        timeout = grpc_timeout(next((v for n, v in call.headers if n == b"grpc-timeout"), None))
        metadata = metadata_out(call.headers)
        if self._subject is not None:
            metadata += ((CLIENT_SUBJECT, self._subject), (RELAY_KEY, self._relay_to.key))
        relayed = self._relay_to.channel.stream_stream(path)(metadata=metadata, timeout=timeout)
        feeder = self._loop.create_task(self._feed(call, relayed))
        drained = call.drained
        assert drained is not None
        try:
            while (message := await relayed.read()) is not grpc.aio.EOF:
                if not call.headers_sent:
                    self._send_headers(call, b"".join(literal(k, v) for k, v in
                                                      metadata_in(await relayed.initial_metadata())))
                self._send_message(call, message)
                if self._h2.pending(call.id) > SEND_BUFFER:
                    drained.clear()
                    await drained.wait()
                if call.done:
                    return
            code, details, trailing = await relayed.code(), await relayed.details(), await relayed.trailing_metadata()
        except grpc.aio.AioRpcError as e:
            code, details, trailing = e.code(), e.details() or "", e.trailing_metadata()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 — the client gets a status, never a stream left open
            log.exception("relaying %s failed", path)
            code, details, trailing = grpc.StatusCode.INTERNAL, "internal error", ()
        finally:
            feeder.cancel()
            if not relayed.done():
                relayed.cancel()
        self._end_call(call, status_block(code, details or "", metadata_in(trailing)))

    async def _feed(self, call: Call, relayed: Any) -> None:
        queue = call.messages
        assert queue is not None
        try:
            while (message := await queue.get()) is not None:
                await relayed.write(message)
                self._grant(call)
                self._flush()
            if not call.done:
                await relayed.done_writing()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 — the call has ended; its status reaches the client through _relay()
            return


def metadata_out(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
    """Request headers that are call metadata, as grpc.aio takes them (binary ones decoded)."""
    out: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name.startswith(b":") or name in _NOT_METADATA:
            continue
        key = name.decode("ascii", "replace")
        if key.endswith("-bin"):
            try:
                out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except ValueError:
                continue
        else:
            out.append((key, value.decode("ascii", "replace")))
    return tuple(out)


def metadata_in(metadata: Any) -> tuple[tuple[bytes, bytes], ...]:
    """grpc.aio's metadata as header fields (binary values base64-encoded, unpadded)."""
    out = []
    for key, value in metadata or ():
        if isinstance(value, bytes):
            value = base64.b64encode(value).rstrip(b"=")
        else:
            value = value.encode("ascii", "replace")
        out.append((key.encode("ascii", "replace"), value))
    return tuple(out)

"""The router's public gRPC port: HTTP/2 spoken on the event loop itself, ``Router.Get`` answered in place.

Through grpc.aio a call passes C-core's threads: its bytes are read on one, each step's
completion reaches the event loop through grpc.aio's poller thread, and the answer leaves
the same way. On a small machine shared with the pipeline every one of those hand-overs
waits for a core, and a routed lookup paid them on top of the store node's own. Lookups
are the product, so :class:`GrpcConnection` speaks HTTP/2 itself (h2c with prior
knowledge, as gRPC clients do), on the event loop, and answers ``Router.Get`` with the
same code grpc.aio would run. Every other call — BatchGet, Scan, the metadata calls, the
health service and reflection — is relayed message by message to the full grpc.aio server
(:mod:`router.grpc_server`) on a private loopback port: one implementation of each method,
one mapping of errors, and the lookup without C-core's hand-overs. The front knows the
Router service only through :class:`router.transports.GetCalls`.

The HTTP/2 here is a server's and no more: no push, no priorities, no upgrade from
HTTP/1.1, no compression of messages (clients are told ``identity``). Flow control is
kept both ways; what a peer sends beyond the protocol ends its connection with a GOAWAY.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl as ssl_module
import struct
from typing import Any
from urllib.parse import quote

import grpc
import hpack
from google.protobuf.message import DecodeError

from freshroute.errors import InvalidArgument
from freshroute.pacing import PacedByAnswers
from freshroute.tls import peer_subject
from proto import router_pb2
from router.transports import GetCalls

log = logging.getLogger("freshroute.router.grpc")

GET_PATH = b"/freshroute.v1.Router/Get"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types and flags (RFC 9113 §6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# error codes (§7)
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED = 0x0, 0x1, 0x3, 0x5
FRAME_SIZE_ERROR, REFUSED_STREAM, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x6, 0x7, 0x9, 0xb
# settings (§6.5.2); a peer's header table size is not needed: our encoder keeps no table
ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x2, 0x3, 0x4, 0x5, 0x6
MAX_WINDOW = 0x7FFFFFFF

_HEAD = struct.Struct(">BHBBI")  # length as 8 + 16 bits, type, flags, stream id
_SETTING = struct.Struct(">HI")
_WINDOW = struct.Struct(">I")
_RST = struct.Struct(">I")
_GOAWAY = struct.Struct(">II")
_MESSAGE = struct.Struct(">BI")  # gRPC message prefix: compressed flag, length

DEFAULT_WINDOW = 65_535
FRAME_LIMIT = 16_384  # the largest frame a peer may send us (we never raise it)
STREAM_LIMIT = 1_000
# Windows we grant: requests are small, so a peer never waits for a WINDOW_UPDATE, and
# we send one only after half of a window has been used.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 16 << 20
MAX_MESSAGE = 4 << 20  # gRPC's default largest received message
MAX_HEADER_LIST = 64 << 10
# A relayed stream stops reading answers from grpc.aio while this much waits for the peer's window,
# and stops granting the peer window while this many request messages wait for grpc.aio.
SEND_BUFFER = 256 << 10
QUEUED_MESSAGES = 8
# What a peer may ask of us beyond calls, as (burst, per second): calls it resets before their
# answer (each one cost us a task: "rapid reset"), and frames we must acknowledge (SETTINGS,
# PING). gRPC clients stay far below both; a peer over either is told ENHANCE_YOUR_CALM.
RESET_BUDGET = (1_000, 200.0)
CONTROL_BUDGET = (1_000, 100.0)
# Ids of streams the peer reset, remembered so frames it still sends on them are answered
# STREAM_CLOSED (RFC 9113 §5.1); frames on streams we closed are ignored.
RESET_MEMORY = 256

# A relayed call's client certificate subject, and the key that vouches for it: only the front sets them,
# so a client's own headers of these names are dropped.
CLIENT_SUBJECT, RELAY_KEY = "x-freshroute-client-subject", "x-freshroute-relay-key"
# Headers that are HTTP/2's or gRPC's own (or the relay's), not call metadata to relay.
_NOT_METADATA = frozenset((b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                           b"user-agent", b"host", b"connection", CLIENT_SUBJECT.encode(), RELAY_KEY.encode()))
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# A request's pseudo-headers (RFC 9113 §8.3.1), and headers HTTP/2 forbids (§8.2.2).
_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                  b"upgrade"))


_ON_A_STREAM = frozenset((DATA, HEADERS, PRIORITY, RST_STREAM, CONTINUATION))
_ON_THE_CONNECTION = frozenset((SETTINGS, PING, GOAWAY))


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's integer with an N-bit prefix (RFC 7541 §5.1); ``first`` holds the pattern bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header as a literal never added to the peer's table: our blocks need no encoder state."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


# ":status: 200" is entry 8 of the static table; "content-type" entry 31, as a literal's name.
RESPONSE_HEADERS = b"\x88" + _integer(31, 4) + _integer(16, 7) + b"application/grpc"
OK_TRAILERS = _literal(b"grpc-status", b"0")


def status_block(code: grpc.StatusCode, message: str, metadata: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """Trailers ending a call with ``code``: grpc-message percent-encoded as gRPC asks."""
    block = _literal(b"grpc-status", str(code.value[0]).encode())
    if message:
        block += _literal(b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode())
    for name, value in metadata:
        block += _literal(name, value)
    return block


COMPRESSED = status_block(grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not accepted")
TOO_LARGE = status_block(grpc.StatusCode.RESOURCE_EXHAUSTED, "request larger than 4 MiB")


def grpc_timeout(value: bytes | None) -> float | None:
    """Seconds of a ``grpc-timeout`` header ("100m", "5S"); None when absent or malformed."""
    if not value or value[-1:] not in _TIMEOUT_UNITS or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1:]]


def malformed(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request's header list is malformed (RFC 9113 §8.2, §8.3.1), or None if it is well formed."""
    seen: set[bytes] = set()
    regular = False
    for name, value in headers:
        if name != name.lower():
            return "an uppercase header name"
        if name.startswith(b":"):
            if regular:
                return "a pseudo-header after a regular header"
            if name not in _REQUEST_PSEUDO:
                return f"pseudo-header {name.decode('ascii', 'replace')} in a request"
            if name in seen:
                return f"pseudo-header {name.decode('ascii', 'replace')} twice"
            if name == b":path" and not value:
                return "an empty :path"
            seen.add(name)
        else:
            regular = True
            if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
                return f"connection-specific header {name.decode('ascii', 'replace')}"
    missing = {b":method", b":scheme", b":path"} - seen
    return f"no {b', '.join(sorted(missing)).decode()}" if missing else None


class _Budget:
    """A token bucket: ``take()`` is False once the peer has spent its burst faster than the rate refills it."""

    __slots__ = ("tokens", "burst", "rate", "at")

    def __init__(self, burst: int, rate: float, now: float) -> None:
        self.tokens, self.burst, self.rate, self.at = float(burst), burst, rate, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= 1
        return self.tokens >= 0


class ProtocolViolation(Exception):
    """The peer broke the protocol: the connection ends with a GOAWAY carrying ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class _Stream:
    """One call: what arrived of its request, and what waits to be sent of its answer."""

    __slots__ = ("id", "path", "headers", "send_window", "recv_window", "received", "unacked", "remote_closed",
                 "pending", "trailers", "headers_sent", "done", "task", "messages", "drained")

    def __init__(self, stream_id: int, path: bytes, headers: list[tuple[bytes, bytes]], send_window: int) -> None:
        self.id = stream_id
        self.path = path
        self.headers = headers
        self.send_window = send_window
        self.recv_window = STREAM_WINDOW  # what the peer may still send before our next WINDOW_UPDATE
        self.received = bytearray()  # request bytes not yet split into messages
        self.unacked = 0  # request bytes received since our last WINDOW_UPDATE for the stream
        self.remote_closed = False
        self.pending = bytearray()  # DATA held back by flow control
        self.trailers: bytes | None = None  # sent once ``pending`` is empty
        self.headers_sent = False
        self.done = False
        self.task: asyncio.Task[None] | None = None
        self.messages: asyncio.Queue[bytes | None] | None = None  # a relayed call's request messages
        self.drained: asyncio.Event | None = None


class GrpcConnection(PacedByAnswers):
    """One client connection: frames parsed as they arrive, frames sent gathered once per loop turn."""

    def __init__(self, front: GrpcFront) -> None:
        self._front = front
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._subject: str | None = None
        self._buffer = bytearray()
        self._preface_seen = False
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._streams: dict[int, _Stream] = {}
        self._last_id = 0  # the highest stream id the peer has opened
        self._header_block: tuple[int, int, bytearray] | None = None  # (stream, flags, block) awaiting CONTINUATION
        self._send_window = DEFAULT_WINDOW
        self._peer_stream_window = DEFAULT_WINDOW
        self._peer_frame_size = FRAME_LIMIT
        self._unacked = 0  # connection-level bytes received since our last WINDOW_UPDATE
        self._recv_window = CONNECTION_WINDOW  # what the peer may still send before that WINDOW_UPDATE
        now = self._loop.time()
        self._resets = _Budget(*RESET_BUDGET, now)
        self._control = _Budget(*CONTROL_BUDGET, now)
        self._reset_by_peer: dict[int, None] = {}  # insertion-ordered, at most RESET_MEMORY
        self._blocked: set[_Stream] = set()  # streams with DATA waiting for a window
        self._out = bytearray()
        self._going_away = False

    # ---- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        self._transport = transport  # type: ignore[assignment]
        self._subject = peer_subject(transport)  # of a verified client certificate, on a port that requires one
        self._front.connections.add(self)
        settings = b"".join(_SETTING.pack(k, v) for k, v in (
            (MAX_CONCURRENT_STREAMS, STREAM_LIMIT), (INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST)))
        self._send(frame(SETTINGS, 0, 0, settings)
                   + frame(WINDOW_UPDATE, 0, 0, _WINDOW.pack(CONNECTION_WINDOW - DEFAULT_WINDOW)))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._front.connections.discard(self)
        for stream in list(self._streams.values()):
            self._forget(stream, cancel=True)

    @property
    def idle(self) -> bool:
        return not self._streams

    def go_away(self) -> None:
        """Graceful shutdown: calls already opened finish; newer ones are refused."""
        if not self._going_away and self._transport is not None:
            self._going_away = True
            self._send(frame(GOAWAY, 0, 0, _GOAWAY.pack(self._last_id, NO_ERROR)))
            if self.idle:
                self._close()

    def abort(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.abort()

    def _close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    # ---- bytes out ----------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        # Everything worked out in one loop turn leaves in one write after it: a client
        # asleep in epoll_wait is woken once for all its answers, not once each.
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out += data

    def _flush(self) -> None:
        if self._out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(bytes(self._out))
        self._out.clear()

    # ---- bytes in -----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        buf = self._buffer
        buf += data
        try:
            start = 0
            if not self._preface_seen:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buf)):
                        raise ProtocolViolation(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if buf[:len(PREFACE)] != PREFACE:
                    raise ProtocolViolation(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._preface_seen = True
                start = len(PREFACE)
            end = len(buf)
            while end - start >= 9:
                hi, lo, kind, flags, stream_id = _HEAD.unpack_from(buf, start)
                length = (hi << 16) | lo
                if length > FRAME_LIMIT:
                    raise ProtocolViolation(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if end - start - 9 < length:
                    break
                payload = bytes(buf[start + 9:start + 9 + length])
                start += 9 + length
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload)
                if self._transport is None:
                    return
            del buf[:start]
        except ProtocolViolation as e:
            self._fail_connection(e.code, str(e))

    def _fail_connection(self, code: int, reason: str) -> None:
        log.info("gRPC connection %s closed: %s", self._peer(), reason)
        self._send(frame(GOAWAY, 0, 0, _GOAWAY.pack(self._last_id, code) + reason.encode()[:256]))
        self._buffer.clear()
        self._close()

    def _peer(self) -> Any:
        return self._transport.get_extra_info("peername") if self._transport is not None else None

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._header_block is not None and (kind != CONTINUATION or stream_id != self._header_block[0]):
            raise ProtocolViolation(PROTOCOL_ERROR, "a header block interrupted")
        if kind in _ON_A_STREAM and stream_id == 0:
            raise ProtocolViolation(PROTOCOL_ERROR, f"a frame of type {kind} on stream 0")
        if kind in _ON_THE_CONNECTION and stream_id != 0:
            raise ProtocolViolation(PROTOCOL_ERROR, f"a frame of type {kind} on stream {stream_id}")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            if self._header_block is None:
                raise ProtocolViolation(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            sid, first_flags, block = self._header_block
            block += payload
            if len(block) > MAX_HEADER_LIST:
                raise ProtocolViolation(COMPRESSION_ERROR, "a header block larger than advertised, left undecoded")
            if flags & END_HEADERS:
                self._header_block = None
                self._header_block_done(sid, first_flags, bytes(block))
        elif kind == RST_STREAM:
            self._reset(stream_id, payload)
        elif kind == SETTINGS:
            if flags & ACK:
                if payload:
                    raise ProtocolViolation(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            else:
                self._acknowledging()
                self._settings(payload)
        elif kind == PING:
            if len(payload) != 8:
                raise ProtocolViolation(FRAME_SIZE_ERROR, "a malformed PING")
            if not flags & ACK:
                self._acknowledging()
                self._send(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == GOAWAY:
            self._going_away = True  # the peer opens no more calls; those open finish
        elif kind == PUSH_PROMISE:
            raise ProtocolViolation(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        elif kind == PRIORITY and len(payload) != 5:
            self._stream_error(stream_id, FRAME_SIZE_ERROR)
        # PRIORITY otherwise, and unknown frame types, are ignored, as RFC 9113 asks.

    def _acknowledging(self) -> None:
        if not self._control.take(self._loop.time()):
            raise ProtocolViolation(ENHANCE_YOUR_CALM, "too many SETTINGS and PING frames")

    def _reset(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "a malformed RST_STREAM")
        if stream_id > self._last_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        self._forget(stream, cancel=True)
        self._reset_by_peer[stream_id] = None
        if len(self._reset_by_peer) > RESET_MEMORY:
            del self._reset_by_peer[next(iter(self._reset_by_peer))]
        if not self._resets.take(self._loop.time()):
            raise ProtocolViolation(ENHANCE_YOUR_CALM, "too many calls reset before their answer")

    def _stream_error(self, stream_id: int, code: int) -> None:
        """RST_STREAM with ``code``; the call, if open, ends without an answer (RFC 9113 §5.4.2)."""
        # Sent before the stream is forgotten: forgetting the last one of a connection going away closes it.
        self._send(frame(RST_STREAM, 0, stream_id, _RST.pack(code)))
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._forget(stream, cancel=True)

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise ProtocolViolation(PROTOCOL_ERROR, "padding longer than the frame")
            return payload[1:len(payload) - payload[0]]
        return payload

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "a malformed SETTINGS frame")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolViolation(FLOW_CONTROL_ERROR, "initial window size above 2^31-1")
                delta, self._peer_stream_window = value - self._peer_stream_window, value
                for stream in self._streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ProtocolViolation(FLOW_CONTROL_ERROR, "a stream window above 2^31-1")
            elif key == ENABLE_PUSH and value > 1:
                raise ProtocolViolation(PROTOCOL_ERROR, "ENABLE_PUSH neither 0 nor 1")
            elif key == MAX_FRAME_SIZE:
                if not 16_384 <= value <= 16_777_215:
                    raise ProtocolViolation(PROTOCOL_ERROR, "max frame size out of range")
                self._peer_frame_size = value
            # The header table size only bounds an encoder's table, and ours keeps none.
        self._send(frame(SETTINGS, ACK, 0))
        self._pump_blocked()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = _WINDOW.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ProtocolViolation(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ProtocolViolation(FLOW_CONTROL_ERROR, "the connection window above 2^31-1")
            self._pump_blocked()
            return
        if stream_id > self._last_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # a call already ended: the peer may not know yet
        if increment == 0:
            self._stream_error(stream_id, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR)
            return
        self._pump(stream)

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        payload = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block_done(stream_id, flags, payload)
        else:
            self._header_block = (stream_id, flags, bytearray(payload))

    def _header_block_done(self, stream_id: int, flags: int, block: bytes) -> None:
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as e:
            raise ProtocolViolation(COMPRESSION_ERROR, f"cannot decode headers: {e}") from None
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers from the client end its half of the call
            if stream.remote_closed:
                self._stream_error(stream_id, STREAM_CLOSED)
            elif not flags & END_STREAM:
                self._stream_error(stream_id, PROTOCOL_ERROR)  # trailers must end the request
            else:
                self._remote_end(stream)
            return
        if stream_id in self._reset_by_peer:
            self._stream_error(stream_id, STREAM_CLOSED)
            return
        if stream_id % 2 == 0 or stream_id <= self._last_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, which cannot open")
        self._last_id = stream_id
        if self._going_away or len(self._streams) >= STREAM_LIMIT:
            self._stream_error(stream_id, REFUSED_STREAM)
            return
        why = malformed(headers)
        if why is not None:
            log.info("gRPC connection %s: stream %d reset: %s", self._peer(), stream_id, why)
            self._stream_error(stream_id, PROTOCOL_ERROR)
            return
        method = path = content_type = None
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b":method":
                method = value
            elif name == b"content-type":
                content_type = value
        stream = self._streams[stream_id] = _Stream(stream_id, path or b"", headers, self._peer_stream_window)
        if method != b"POST" or not content_type or not content_type.startswith(b"application/grpc"):
            # Not a gRPC call: what gRPC's servers answer is a plain 415.
            self._send(self._header_frames(stream_id, _integer(8, 4) + b"\x03415", END_STREAM))  # :status 415
            self._forget(stream, cancel=False, reset=not flags & END_STREAM)
            return
        if path != GET_PATH:
            stream.messages = asyncio.Queue()
            stream.drained = asyncio.Event()
            stream.drained.set()
            stream.task = self._loop.create_task(self._relay(stream), name=f"grpc-relay-{stream_id}")
        if flags & END_STREAM:
            self._remote_end(stream)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ProtocolViolation(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._unacked += size
        if self._unacked >= CONNECTION_WINDOW // 2:
            self._send(frame(WINDOW_UPDATE, 0, 0, _WINDOW.pack(self._unacked)))
            self._recv_window += self._unacked
            self._unacked = 0
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self._last_id:
                raise ProtocolViolation(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if stream is not None or stream_id in self._reset_by_peer:
                self._stream_error(stream_id, STREAM_CLOSED)  # after the peer's own END_STREAM or RST_STREAM
            return  # a call we ended: its bytes are dropped
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR)
            return
        data = self._unpad(flags, payload)
        stream.received += data
        stream.unacked += size
        if stream.messages is not None:
            self._split_messages(stream)
        elif len(stream.received) > MAX_MESSAGE + 5:
            self._end_call(stream, TOO_LARGE)
            return
        self._grant(stream)
        if flags & END_STREAM:
            self._remote_end(stream)

    def _split_messages(self, stream: _Stream) -> None:
        """Relayed calls: each complete message goes to the relay as it arrives."""
        buf = stream.received
        while len(buf) >= 5:
            compressed, length = _MESSAGE.unpack_from(buf)
            if length > MAX_MESSAGE:
                self._end_call(stream, TOO_LARGE)
                return
            if len(buf) < 5 + length:
                return
            if compressed:
                self._end_call(stream, COMPRESSED)
                return
            stream.messages.put_nowait(bytes(buf[5:5 + length]))  # type: ignore[union-attr]
            del buf[:5 + length]

    def _remote_end(self, stream: _Stream) -> None:
        stream.remote_closed = True
        if stream.done:
            self._forget(stream, cancel=False)
        elif stream.messages is not None:
            if stream.received:
                self._end_call(stream, status_block(grpc.StatusCode.INTERNAL, "the request ended inside a message"))
            else:
                stream.messages.put_nowait(None)
        else:
            self._answer_get(stream)

    # ---- Router.Get, in place -----------------------------------------------------------------

    def _answer_get(self, stream: _Stream) -> None:
        body = stream.received
        try:
            if len(body) < 5:
                raise InvalidArgument("a Get call carries one GetRequest message; this one carried none")
            compressed, length = _MESSAGE.unpack_from(body)
            if compressed:
                self._end_call(stream, COMPRESSED)
                return
            if length != len(body) - 5:
                raise InvalidArgument("a Get call carries exactly one GetRequest message")
            request = router_pb2.GetRequest.FromString(bytes(body[5:]))
        except InvalidArgument as e:
            self._end_call(stream, self._error(e))
            return
        except DecodeError:
            self._end_call(stream, self._error(InvalidArgument("the request is not a GetRequest message")))
            return
        stream.received = bytearray()
        stream.task = self._loop.create_task(self._get(stream, request))

    async def _get(self, stream: _Stream, request: router_pb2.GetRequest) -> None:
        try:
            authorization = next((v for n, v in stream.headers if n == b"authorization"), None)
            response = await self._front.calls.get(request, authorization, self._subject)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 — every error leaves as a status, translated once
            self._end_call(stream, self._error(e))
            return
        if stream.done:
            return
        payload = response.SerializeToString()
        self._send_message(stream, payload)
        self._end_call(stream, OK_TRAILERS)

    def _error(self, exc: BaseException) -> bytes:
        """Trailers of a call that failed with ``exc``, as the Router service translates it."""
        return status_block(*self._front.calls.status(exc))

    # ---- answers ------------------------------------------------------------------------------

    def _header_frames(self, stream_id: int, block: bytes, flags: int) -> bytes:
        limit = self._peer_frame_size
        if len(block) <= limit:
            return frame(HEADERS, flags | END_HEADERS, stream_id, block)
        parts = [block[i:i + limit] for i in range(0, len(block), limit)]
        out = [frame(HEADERS, flags, stream_id, parts[0])]
        out += [frame(CONTINUATION, 0, stream_id, p) for p in parts[1:-1]]
        out.append(frame(CONTINUATION, END_HEADERS, stream_id, parts[-1]))
        return b"".join(out)

    def _send_headers(self, stream: _Stream, extra: bytes = b"") -> None:
        if not stream.headers_sent and not stream.done:
            stream.headers_sent = True
            self._send(self._header_frames(stream.id, RESPONSE_HEADERS + extra, 0))

    def _send_message(self, stream: _Stream, payload: bytes) -> None:
        """One gRPC message of the answer, as DATA as far as the windows allow."""
        if stream.done:
            return
        self._send_headers(stream)
        stream.pending += _MESSAGE.pack(0, len(payload))
        stream.pending += payload
        self._pump(stream)

    def _end_call(self, stream: _Stream, trailers: bytes) -> None:
        """The call's status: after its DATA, or alone (gRPC's trailers-only answer) if none was sent."""
        if stream.done or stream.trailers is not None:
            return
        if not stream.headers_sent:
            stream.headers_sent = True
            trailers = RESPONSE_HEADERS + trailers
        stream.trailers = trailers
        self._pump(stream)

    def _pump(self, stream: _Stream) -> None:
        """Sends what flow control lets through; the trailers follow the last DATA."""
        if stream.done:
            return
        pending = stream.pending
        while pending:
            n = min(len(pending), stream.send_window, self._send_window, self._peer_frame_size)
            if n <= 0:
                self._blocked.add(stream)
                return
            self._send(frame(DATA, 0, stream.id, bytes(pending[:n])))
            del pending[:n]
            stream.send_window -= n
            self._send_window -= n
        self._blocked.discard(stream)
        if stream.drained is not None and not stream.drained.is_set():
            stream.drained.set()
        if stream.trailers is not None:
            self._send(self._header_frames(stream.id, stream.trailers, END_STREAM))
            stream.done = True
            # A call answered before the client ended its half (an error, say) is reset:
            # whatever the client still sends is not wanted; a relay still running stops.
            self._forget(stream, cancel=stream.task is not asyncio.current_task(self._loop), reset=not stream.remote_closed)

    def _pump_blocked(self) -> None:
        for stream in list(self._blocked):
            self._pump(stream)

    def _forget(self, stream: _Stream, cancel: bool, reset: bool = False) -> None:
        stream.done = True
        if self._streams.pop(stream.id, None) is None:
            return
        self._blocked.discard(stream)
        stream.pending.clear()
        if reset and self._transport is not None:
            self._send(frame(RST_STREAM, 0, stream.id, _RST.pack(NO_ERROR)))
        if stream.drained is not None:
            stream.drained.set()
        if stream.messages is not None:
            stream.messages.put_nowait(None)
        if cancel and stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if self._going_away and self.idle:
            self._close()

    def _grant(self, stream: _Stream) -> None:
        """Reopens the stream's window once half of it is used, unless a relay has fallen behind.

        A request message larger than the window still arrives whole (its bytes are granted
        as they come, up to MAX_MESSAGE); a peer that sends messages faster than the relay
        hands them on waits once QUEUED_MESSAGES of them are queued (the relay grants again
        as it catches up).
        """
        if stream.done or stream.remote_closed or stream.unacked < STREAM_WINDOW // 2:
            return
        if stream.messages is not None and stream.messages.qsize() >= QUEUED_MESSAGES:
            return
        self._send(frame(WINDOW_UPDATE, 0, stream.id, _WINDOW.pack(stream.unacked)))
        stream.recv_window += stream.unacked
        stream.unacked = 0

    # ---- every other call, relayed to grpc.aio ------------------------------------------------

    async def _relay(self, stream: _Stream) -> None:
        """One call of any other method, carried message by message to the grpc.aio server and back."""
        path = stream.path.decode("ascii", "replace")
        timeout = grpc_timeout(next((v for n, v in stream.headers if n == b"grpc-timeout"), None))
        metadata = _metadata_out(stream.headers)
        if self._subject is not None:
            metadata += ((CLIENT_SUBJECT, self._subject), (RELAY_KEY, self._front.relay_key))
        call = self._front.channel.stream_stream(path)(metadata=metadata, timeout=timeout)
        feeder = self._loop.create_task(self._feed(stream, call))
        try:
            while (message := await call.read()) is not grpc.aio.EOF:
                if not stream.headers_sent:
                    self._send_headers(stream, b"".join(_literal(k, v) for k, v in
                                                        _metadata_in(await call.initial_metadata())))
                self._send_message(stream, message)
                if len(stream.pending) > SEND_BUFFER:
                    stream.drained.clear()  # type: ignore[union-attr]
                    await stream.drained.wait()  # type: ignore[union-attr]
                if stream.done:
                    return
            code, details, trailing = await call.code(), await call.details(), await call.trailing_metadata()
        except grpc.aio.AioRpcError as e:
            code, details, trailing = e.code(), e.details() or "", e.trailing_metadata()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 — the client gets a status, never a stream left open
            log.exception("relaying %s failed", path)
            code, details, trailing = grpc.StatusCode.INTERNAL, "internal error", ()
        finally:
            feeder.cancel()
            if not call.done():
                call.cancel()
        self._end_call(stream, status_block(code, details or "", _metadata_in(trailing)))

    async def _feed(self, stream: _Stream, call: Any) -> None:
        queue = stream.messages
        assert queue is not None
        try:
            while (message := await queue.get()) is not None:
                await call.write(message)
                self._grant(stream)
            if not stream.done:
                await call.done_writing()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 — the call has ended; its status reaches the client through _relay()
            return


def _metadata_out(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
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


def _metadata_in(metadata: Any) -> tuple[tuple[bytes, bytes], ...]:
    """grpc.aio's metadata as header fields (binary values base64-encoded, unpadded)."""
    out = []
    for key, value in metadata or ():
        if isinstance(value, bytes):
            value = base64.b64encode(value).rstrip(b"=")
        else:
            value = value.encode("ascii", "replace")
        out.append((key.encode("ascii", "replace"), value))
    return tuple(out)


class GrpcFront:
    """The public gRPC port: :class:`GrpcConnection` per client, relaying what it does not answer to ``relay_target``."""

    def __init__(self, calls: GetCalls, relay_target: str, host: str, port: int, reuse_port: bool = False,
                 ssl: "ssl_module.SSLContext | None" = None, relay_key: str = "") -> None:
        self.calls = calls
        self._ssl = ssl
        self.relay_key = relay_key
        self.connections: set[GrpcConnection] = set()
        self._listen = (host, port, reuse_port)
        self._server: asyncio.Server | None = None
        self.channel = grpc.aio.insecure_channel(relay_target, options=[("grpc.max_receive_message_length", -1),
                                                                         ("grpc.max_send_message_length", -1)])
        self.port = 0

    async def start(self) -> int:
        """Starts listening; returns the bound port."""
        host, port, reuse_port = self._listen
        try:
            self._server = await asyncio.get_running_loop().create_server(
                lambda: GrpcConnection(self), host, port, reuse_port=reuse_port or None, backlog=2048, ssl=self._ssl)
        except OSError as e:
            raise RuntimeError(f"cannot bind gRPC to {host}:{port}: {e}") from None
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self, grace: float | None) -> None:
        """Stops accepting; calls in flight get ``grace`` seconds, then every connection is closed."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.go_away()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (grace or 0)
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.abort()
        await self.channel.close(grace=None)

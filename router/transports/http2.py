"""HTTP/2, a server's side, as a protocol machine: bytes in, events out, bytes to send — no sockets, no asyncio.

:class:`H2Connection` is fed what the peer sent (:meth:`~H2Connection.receive`, which returns
the :data:`Event` values it gave rise to) and is told what to answer (``send_headers``,
``send_data``, ``send_trailers``); what it has to send waits in :meth:`~H2Connection.data_to_send`
for its owner to write. It keeps the connection's state: stream states, flow control both ways,
header blocks across CONTINUATION frames, and the budgets that stop a peer from making it work
for nothing. The router's gRPC front (:mod:`router.transports.grpc_front`) drives it over an
asyncio transport; the conformance suite drives it with byte strings too.

A server's HTTP/2 and no more: no push, no priorities, no upgrade from HTTP/1.1 (h2c with
prior knowledge, as gRPC clients speak it). What a peer sends beyond the protocol ends its
stream with RST_STREAM or its connection with a GOAWAY, as RFC 9113 says which.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import Callable, NamedTuple, Union

import hpack

log = logging.getLogger("freshroute.router.grpc")

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

DEFAULT_WINDOW = 65_535
FRAME_LIMIT = 16_384  # the largest frame a peer may send us (we never raise it)
STREAM_LIMIT = 1_000
# Windows we grant: requests are small, so a peer never waits for a WINDOW_UPDATE, and we send
# one only after half of a window has been used.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 16 << 20
MAX_HEADER_LIST = 64 << 10
# What a peer may ask of us beyond requests, as (burst, per second): streams it resets before
# their answer (each one cost its owner work: "rapid reset"), and frames we must acknowledge
# (SETTINGS, PING). gRPC clients stay far below both; a peer over either is told ENHANCE_YOUR_CALM.
RESET_BUDGET = (1_000, 200.0)
CONTROL_BUDGET = (1_000, 100.0)
# Ids of streams the peer closed (its END_STREAM or RST_STREAM), remembered so frames it still sends
# on them are answered STREAM_CLOSED (§5.1); frames on streams we reset are ignored.
CLOSED_MEMORY = 256

# A request's pseudo-headers (§8.3.1), and headers HTTP/2 forbids (§8.2.2).
_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                  b"upgrade"))
_ON_A_STREAM = frozenset((DATA, HEADERS, PRIORITY, RST_STREAM, CONTINUATION))
_ON_THE_CONNECTION = frozenset((SETTINGS, PING, GOAWAY))

Headers = list[tuple[bytes, bytes]]


class RequestStarted(NamedTuple):
    """A well-formed request's headers opened ``stream_id``; ``ended``: the request has no body."""

    stream_id: int
    headers: Headers
    ended: bool


class DataReceived(NamedTuple):
    """Request body bytes; the stream's window reopens once its owner says it has taken them (``consumed``)."""

    stream_id: int
    data: bytes
    size: int  # what the peer's window was charged: the frame's payload, padding included


class RequestEnded(NamedTuple):
    """The peer ended its half of the stream (END_STREAM, on DATA or on trailers)."""

    stream_id: int


class StreamReset(NamedTuple):
    """The stream ended without an answer — the peer reset it, or broke the protocol on it: its work stops."""

    stream_id: int


class Drained(NamedTuple):
    """Everything queued on the stream has been sent: the peer's windows opened."""

    stream_id: int


Event = Union[RequestStarted, DataReceived, RequestEnded, StreamReset, Drained]


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
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


def literal(name: bytes, value: bytes) -> bytes:
    """A header as a literal never added to the peer's table: our blocks need no encoder state."""
    return b"\x00" + integer(len(name), 7) + name + integer(len(value), 7) + value


def status(code: int) -> bytes:
    """``:status`` as a header field: 200 from the static table (entry 8), any other as a literal of entry 8's name."""
    return b"\x88" if code == 200 else integer(8, 4) + integer(3, 7) + str(code).encode()


def malformed(headers: Headers) -> str | None:
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


def content_length(headers: Headers) -> tuple[int | None, str | None]:
    """A request's content-length (None if it gave none), or why it is malformed."""
    length = None
    for name, value in headers:
        if name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                return None, "a malformed content-length"
            length = int(value)
    return length, None


def unpad(flags: int, payload: bytes) -> bytes:
    if flags & PADDED:
        if not payload or payload[0] >= len(payload):
            raise ProtocolViolation(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1:len(payload) - payload[0]]
    return payload


class Budget:
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


class Stream:
    """One stream: the windows both ways, and what waits to be sent of its answer."""

    __slots__ = ("id", "send_window", "recv_window", "unacked", "remote_closed", "pending", "trailers", "ending",
                 "blocked", "expected_length", "received_length")

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.send_window = send_window
        self.recv_window = STREAM_WINDOW  # what the peer may still send before our next WINDOW_UPDATE
        self.unacked = 0  # bytes taken by the stream's owner since our last WINDOW_UPDATE for it
        self.remote_closed = False
        self.pending = bytearray()  # DATA held back by flow control
        self.trailers: bytes | None = None  # sent once ``pending`` is empty
        self.ending = False  # the answer ends with its last DATA (no trailers)
        self.blocked = False  # waited for a window since its last Drained
        self.expected_length: int | None = None  # the request's content-length, if it gave one
        self.received_length = 0


class Settings(NamedTuple):
    """What a SETTINGS frame changes: the peer's initial stream window and largest frame (None: unchanged)."""

    initial_window: int | None
    frame_size: int | None


def parse_settings(payload: bytes) -> Settings:
    if len(payload) % 6:
        raise ProtocolViolation(FRAME_SIZE_ERROR, "a malformed SETTINGS frame")
    window = size = None
    for offset in range(0, len(payload), 6):
        key, value = _SETTING.unpack_from(payload, offset)
        if key == INITIAL_WINDOW_SIZE:
            if value > MAX_WINDOW:
                raise ProtocolViolation(FLOW_CONTROL_ERROR, "initial window size above 2^31-1")
            window = value
        elif key == ENABLE_PUSH and value > 1:
            raise ProtocolViolation(PROTOCOL_ERROR, "ENABLE_PUSH neither 0 nor 1")
        elif key == MAX_FRAME_SIZE:
            if not 16_384 <= value <= 16_777_215:
                raise ProtocolViolation(PROTOCOL_ERROR, "max frame size out of range")
            size = value
        # The header table size only bounds an encoder's table, and ours keeps none.
    return Settings(window, size)


def window_increment(payload: bytes) -> int:
    if len(payload) != 4:
        raise ProtocolViolation(FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
    return _WINDOW.unpack(payload)[0] & 0x7FFFFFFF


class Answering:
    """The sending half of :class:`H2Connection`: answers queued per stream and sent as the peer's windows allow."""

    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}
        self.peer_frame_size = FRAME_LIMIT
        self.going_away = False
        self.closed = False  # the connection is over: send what waits, then close it
        self._send_window = DEFAULT_WINDOW
        self._out = bytearray()
        self._events: list[Event] = []
        # stream -> closed by the peer's RST_STREAM (else by its END_STREAM); insertion-ordered, at most CLOSED_MEMORY
        self._closed_by_peer: dict[int, bool] = {}

    def data_to_send(self) -> bytes:
        out, self._out = bytes(self._out), bytearray()
        return out

    @property
    def idle(self) -> bool:
        return not self.streams

    def consumed(self, stream_id: int, size: int) -> None:
        """The stream's owner took ``size`` bytes of its request: its window reopens once half of it is used."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            return
        stream.unacked += size
        if stream.unacked >= STREAM_WINDOW // 2:
            self._out += frame(WINDOW_UPDATE, 0, stream_id, _WINDOW.pack(stream.unacked))
            stream.recv_window += stream.unacked
            stream.unacked = 0

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """The answer's headers (HEADERS, and CONTINUATION beyond the peer's frame size); with ``end_stream``, the
        whole answer (then the stream is over)."""
        if stream_id not in self.streams:
            return
        self._out += self._header_frames(stream_id, block, END_STREAM if end_stream else 0)
        if end_stream:
            self._forget(stream_id, reset=not self.streams[stream_id].remote_closed)

    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        """Answer body bytes, sent as far as the windows allow and the rest as they open; with ``end_stream``, the
        last of the answer (a plain HTTP answer, without trailers)."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.trailers is not None or stream.ending:
            return
        stream.pending += data
        stream.ending = end_stream
        self._pump(stream)

    def send_trailers(self, stream_id: int, block: bytes) -> None:
        """The answer's trailers, after its last DATA: the stream is over once they are sent."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return
        stream.trailers = block
        self._pump(stream)

    def pending(self, stream_id: int) -> int:
        """Answer bytes of the stream still waiting for a window."""
        stream = self.streams.get(stream_id)
        return len(stream.pending) if stream is not None else 0

    def reset_stream(self, stream_id: int, code: int) -> None:
        """RST_STREAM with ``code``; a stream still open ends without an answer (RFC 9113 §5.4.2)."""
        self._out += frame(RST_STREAM, 0, stream_id, _RST.pack(code))
        if stream_id in self.streams:
            self._forget(stream_id, reset=False)
            self._events.append(StreamReset(stream_id))

    def _header_frames(self, stream_id: int, block: bytes, flags: int) -> bytes:
        limit = self.peer_frame_size
        if len(block) <= limit:
            return frame(HEADERS, flags | END_HEADERS, stream_id, block)
        parts = [block[i:i + limit] for i in range(0, len(block), limit)]
        out = [frame(HEADERS, flags, stream_id, parts[0])]
        out += [frame(CONTINUATION, 0, stream_id, p) for p in parts[1:-1]]
        out.append(frame(CONTINUATION, END_HEADERS, stream_id, parts[-1]))
        return b"".join(out)

    def _pump(self, stream: Stream, opened: bool = False) -> None:
        """Sends what flow control lets through; the trailers follow the last DATA. ``opened``: the peer opened a
        window, and a stream it unblocks is reported :class:`Drained` (its owner knows of the others: it sent)."""
        pending = stream.pending
        if stream.ending and not pending:
            self._out += frame(DATA, END_STREAM, stream.id)
            self._forget(stream.id, reset=not stream.remote_closed)
            return
        while pending:
            n = min(len(pending), stream.send_window, self._send_window, self.peer_frame_size)
            if n <= 0:
                stream.blocked = True
                return
            last = stream.ending and n == len(pending)
            self._out += frame(DATA, END_STREAM if last else 0, stream.id, bytes(pending[:n]))
            del pending[:n]
            stream.send_window -= n
            self._send_window -= n
            if last:
                self._forget(stream.id, reset=not stream.remote_closed)
                return
        if stream.blocked:
            stream.blocked = False
            if opened:
                self._events.append(Drained(stream.id))
        if stream.trailers is not None:
            self._out += self._header_frames(stream.id, stream.trailers, END_STREAM)
            # An answer ended before the peer ended its half (an error, say) resets the stream: whatever the
            # peer still sends is not wanted.
            self._forget(stream.id, reset=not stream.remote_closed)

    def _pump_all(self) -> None:
        for stream in [s for s in self.streams.values() if s.blocked]:
            self._pump(stream, opened=True)

    def _forget(self, stream_id: int, reset: bool) -> None:
        stream = self.streams.pop(stream_id, None)
        if reset:
            self._out += frame(RST_STREAM, 0, stream_id, _RST.pack(NO_ERROR))
        elif stream is not None and stream.remote_closed:
            self._peer_closed(stream_id, by_reset=False)
        if self.going_away and self.idle:
            self.closed = True

    def _peer_closed(self, stream_id: int, by_reset: bool) -> None:
        """Remembers a stream the peer closed: DATA it still sends there is a stream error (§5.1, §6.1)."""
        self._closed_by_peer[stream_id] = by_reset
        if len(self._closed_by_peer) > CLOSED_MEMORY:
            del self._closed_by_peer[next(iter(self._closed_by_peer))]


class H2Connection(Answering):
    """A server's HTTP/2 connection: the peer's bytes become events, answers become bytes to send."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._buffer = bytearray()
        self._preface_seen = False
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self.last_id = 0  # the highest stream id the peer has opened
        # (stream, flags, block, depends on itself) awaiting CONTINUATION
        self._header_block: tuple[int, int, bytearray, bool] | None = None
        self._peer_stream_window = DEFAULT_WINDOW
        self._unacked = 0  # connection-level bytes received since our last WINDOW_UPDATE
        self._recv_window = CONNECTION_WINDOW  # what the peer may still send before that WINDOW_UPDATE
        now = clock()
        self._resets = Budget(*RESET_BUDGET, now)
        self._control = Budget(*CONTROL_BUDGET, now)
        self.violation: str | None = None  # why the peer's connection was ended, if it broke the protocol

    # ---- the connection -----------------------------------------------------------------------

    def initiate(self) -> None:
        """Our SETTINGS and connection window, the first bytes a server sends."""
        settings = b"".join(_SETTING.pack(k, v) for k, v in (
            (MAX_CONCURRENT_STREAMS, STREAM_LIMIT), (INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST)))
        self._out += frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0,
                                                             _WINDOW.pack(CONNECTION_WINDOW - DEFAULT_WINDOW))

    def go_away(self) -> None:
        """Graceful shutdown: streams already opened finish; newer ones are refused; closed once idle."""
        if not self.going_away and not self.closed:
            self.going_away = True
            self._out += frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_id, NO_ERROR))
            self.closed = self.idle

    def receive(self, data: bytes) -> list[Event]:
        """What ``data`` from the peer gave rise to, in order; nothing more once the connection is closed."""
        if self.closed:
            return []
        buf = self._buffer
        buf += data
        try:
            start = self._preface(buf)
            if start is None:
                return []
            end = len(buf)
            while end - start >= 9 and not self.closed:
                hi, lo, kind, flags, stream_id = _HEAD.unpack_from(buf, start)
                length = (hi << 16) | lo
                if length > FRAME_LIMIT:
                    raise ProtocolViolation(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if end - start - 9 < length:
                    break
                payload = bytes(buf[start + 9:start + 9 + length])
                start += 9 + length
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload)
            del buf[:start]
        except ProtocolViolation as e:
            self.violation = str(e)
            self._out += frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_id, e.code) + str(e).encode()[:256])
            buf.clear()
            self.closed = True
        events, self._events = self._events, []
        return events

    def _preface(self, buf: bytearray) -> int | None:
        """Where frames start in ``buf``: after the client's connection preface (None until it has arrived whole)."""
        if self._preface_seen:
            return 0
        if len(buf) < len(PREFACE):
            if not PREFACE.startswith(bytes(buf)):
                raise ProtocolViolation(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            return None
        if buf[:len(PREFACE)] != PREFACE:
            raise ProtocolViolation(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        self._preface_seen = True
        return len(PREFACE)

    # ---- frames in ----------------------------------------------------------------------------

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
            payload = unpad(flags, payload)
            self_dependent = False
            if flags & PRIORITY_FLAG:
                if len(payload) < 5:
                    raise ProtocolViolation(FRAME_SIZE_ERROR, "a HEADERS frame too short for its priority")
                self_dependent = _WINDOW.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id
                payload = payload[5:]
            if flags & END_HEADERS:
                self._header_block_done(stream_id, flags, payload, self_dependent)
            else:
                self._header_block = (stream_id, flags, bytearray(payload), self_dependent)
        elif kind == CONTINUATION:
            self._continuation(flags, payload)
        elif kind == RST_STREAM:
            self._peer_reset(stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, payload)
        elif kind == PING:
            if len(payload) != 8:
                raise ProtocolViolation(FRAME_SIZE_ERROR, "a malformed PING")
            if not flags & ACK:
                self._acknowledging()
                self._out += frame(PING, ACK, 0, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, window_increment(payload))
        elif kind == GOAWAY:
            self.going_away = True  # the peer opens no more streams; those open finish
        elif kind == PUSH_PROMISE:
            raise ProtocolViolation(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        elif kind == PRIORITY:
            if len(payload) != 5:
                self.reset_stream(stream_id, FRAME_SIZE_ERROR)
            elif _WINDOW.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
                self.reset_stream(stream_id, PROTOCOL_ERROR)  # a stream cannot depend on itself (§5.3.1)
        # PRIORITY otherwise, and unknown frame types, are ignored, as RFC 9113 asks.

    def _continuation(self, flags: int, payload: bytes) -> None:
        if self._header_block is None:
            raise ProtocolViolation(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        sid, first_flags, block, self_dependent = self._header_block
        block += payload
        if len(block) > MAX_HEADER_LIST:
            raise ProtocolViolation(COMPRESSION_ERROR, "a header block larger than advertised, left undecoded")
        if flags & END_HEADERS:
            self._header_block = None
            self._header_block_done(sid, first_flags, bytes(block), self_dependent)

    def _acknowledging(self) -> None:
        if not self._control.take(self._clock()):
            raise ProtocolViolation(ENHANCE_YOUR_CALM, "too many SETTINGS and PING frames")

    def _settings(self, flags: int, payload: bytes) -> None:
        if flags & ACK:
            if payload:
                raise ProtocolViolation(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        self._acknowledging()
        window, size = parse_settings(payload)
        if window is not None:
            delta, self._peer_stream_window = window - self._peer_stream_window, window
            for stream in self.streams.values():
                stream.send_window += delta
                if stream.send_window > MAX_WINDOW:
                    raise ProtocolViolation(FLOW_CONTROL_ERROR, "a stream window above 2^31-1")
        if size is not None:
            self.peer_frame_size = size
        self._out += frame(SETTINGS, ACK, 0)
        self._pump_all()

    def _window_update(self, stream_id: int, increment: int) -> None:
        if stream_id == 0:
            if increment == 0:
                raise ProtocolViolation(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ProtocolViolation(FLOW_CONTROL_ERROR, "the connection window above 2^31-1")
            self._pump_all()
            return
        if stream_id > self.last_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream already ended: the peer may not know yet
        if increment == 0:
            self.reset_stream(stream_id, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self.reset_stream(stream_id, FLOW_CONTROL_ERROR)
            return
        self._pump(stream, opened=True)

    def _peer_reset(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "a malformed RST_STREAM")
        if stream_id > self.last_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        if stream_id not in self.streams:
            return
        self._forget(stream_id, reset=False)
        self._events.append(StreamReset(stream_id))
        self._peer_closed(stream_id, by_reset=True)
        if not self._resets.take(self._clock()):
            raise ProtocolViolation(ENHANCE_YOUR_CALM, "too many calls reset before their answer")

    def _header_block_done(self, stream_id: int, flags: int, block: bytes, self_dependent: bool = False) -> None:
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as e:
            raise ProtocolViolation(COMPRESSION_ERROR, f"cannot decode headers: {e}") from None
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client end its half of the stream
            if stream.remote_closed:
                self.reset_stream(stream_id, STREAM_CLOSED)
            elif not flags & END_STREAM:
                self.reset_stream(stream_id, PROTOCOL_ERROR)  # trailers must end the request
            elif stream.expected_length not in (None, stream.received_length):
                self.reset_stream(stream_id, PROTOCOL_ERROR)  # a body its content-length does not match (§8.1.1)
            else:
                self._remote_end(stream)
            return
        if self._closed_by_peer.get(stream_id):  # after the peer's RST_STREAM (else: an id reused, below)
            self.reset_stream(stream_id, STREAM_CLOSED)
            return
        if stream_id % 2 == 0 or stream_id <= self.last_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, which cannot open")
        self.last_id = stream_id
        if self.going_away or len(self.streams) >= STREAM_LIMIT:
            self.reset_stream(stream_id, REFUSED_STREAM)
            return
        ended = bool(flags & END_STREAM)
        why = "a stream depending on itself" if self_dependent else malformed(headers)
        length = None
        if why is None:
            length, why = content_length(headers)
            if ended and length:
                why = "a content-length and no body"
        if why is not None:
            log.info("HTTP/2 stream %d reset: %s", stream_id, why)
            self.reset_stream(stream_id, PROTOCOL_ERROR)
            return
        stream = self.streams[stream_id] = Stream(stream_id, self._peer_stream_window)
        stream.expected_length = length
        stream.remote_closed = ended
        self._events.append(RequestStarted(stream_id, headers, ended))

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ProtocolViolation(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._unacked += size
        if self._unacked >= CONNECTION_WINDOW // 2:
            self._out += frame(WINDOW_UPDATE, 0, 0, _WINDOW.pack(self._unacked))
            self._recv_window += self._unacked
            self._unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self.last_id:
                raise ProtocolViolation(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if stream is not None or stream_id in self._closed_by_peer:
                self.reset_stream(stream_id, STREAM_CLOSED)  # after the peer's own END_STREAM or RST_STREAM
            return  # a stream we reset: its bytes are dropped
        stream.recv_window -= size
        if stream.recv_window < 0:
            self.reset_stream(stream_id, FLOW_CONTROL_ERROR)
            return
        data = unpad(flags, payload)
        if stream.expected_length is not None:
            stream.received_length += len(data)
            if stream.received_length > stream.expected_length or (
                    flags & END_STREAM and stream.received_length != stream.expected_length):
                self.reset_stream(stream_id, PROTOCOL_ERROR)  # a body its content-length does not match (§8.1.1)
                return
        self._events.append(DataReceived(stream_id, data, size))
        if flags & END_STREAM:
            self._remote_end(stream)

    def _remote_end(self, stream: Stream) -> None:
        stream.remote_closed = True
        self._events.append(RequestEnded(stream.id))

"""The receiving half of an HTTP/2 connection: the peer's bytes cut into frames, each held to the protocol and
turned into the connection's state and its events.

:class:`FrameReader` checks what the peer sends (stream states, flow control, header blocks across CONTINUATION
frames, a request's headers, and the budgets that stop a peer from making the connection work for nothing) and
answers what the protocol asks of it at once: SETTINGS and PING acknowledged, windows reopened, and streams reset
through the connection's :class:`~router.transports.http2.writer.AnswerWriter`. A connection error is raised as
:class:`~router.transports.http2.frames.ProtocolViolation`, for the connection to end with a GOAWAY.
"""

from __future__ import annotations

import logging
from typing import Callable

import hpack

from router.transports.http2.events import DataReceived, Headers, RequestEnded, RequestStarted, StreamReset
from router.transports.http2.frames import (ACK, COMPRESSION_ERROR, CONTINUATION, DATA, DEFAULT_WINDOW, END_HEADERS,
                                            END_STREAM, ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR,
                                            GOAWAY, HEAD, HEADERS, MAX_WINDOW, PING, PREFACE, PRIORITY,
                                            PRIORITY_FLAG, PROTOCOL_ERROR, PUSH_PROMISE, REFUSED_STREAM, RST_STREAM,
                                            SETTINGS, STREAM_CLOSED, WINDOW, WINDOW_UPDATE, ProtocolViolation, frame,
                                            parse_settings, unpad, window_increment)
from router.transports.http2.state import (CONNECTION_WINDOW, FRAME_LIMIT, MAX_HEADER_LIST, STREAM_LIMIT,
                                           ConnectionState, Stream)
from router.transports.http2.writer import AnswerWriter

log = logging.getLogger("freshroute.router.grpc")

# What a peer may ask of us beyond requests, as (burst, per second): streams it resets before
# their answer (each one cost its owner work: "rapid reset"), and frames we must acknowledge
# (SETTINGS, PING). gRPC clients stay far below both; a peer over either is told ENHANCE_YOUR_CALM.
RESET_BUDGET = (1_000, 200.0)
CONTROL_BUDGET = (1_000, 100.0)

# A request's pseudo-headers (§8.3.1), and headers HTTP/2 forbids (§8.2.2).
_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                  b"upgrade"))
_ON_A_STREAM = frozenset((DATA, HEADERS, PRIORITY, RST_STREAM, CONTINUATION))
_ON_THE_CONNECTION = frozenset((SETTINGS, PING, GOAWAY))


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


class FrameReader:
    """The peer's bytes into frames, and each frame into the connection's state and events."""

    def __init__(self, state: ConnectionState, writer: AnswerWriter, clock: Callable[[], float]) -> None:
        self._state = state
        self.streams = state.streams
        self._closed_by_peer = state.closed_by_peer
        self._out = state.out
        self._events = state.events
        self._peer_closed = state.peer_closed
        # What the protocol answers through the sending half, bound once.
        self._reset_stream = writer.reset_stream
        self._forget = writer.forget
        self._pump = writer.pump
        self._pump_all = writer.pump_all
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

    def read(self, data: bytes) -> None:
        """Handles every whole frame the peer has sent, ``data`` the latest of its bytes (a frame's beginning waits
        for the rest); stops once the connection is closed. Raises :class:`ProtocolViolation` if the peer broke
        the protocol: nothing more of its bytes is read."""
        buf = self._buffer
        buf += data
        try:
            start = self._preface(buf)
            if start is None:
                return
            state = self._state
            end = len(buf)
            while end - start >= 9 and not state.closed:
                hi, lo, kind, flags, stream_id = HEAD.unpack_from(buf, start)
                length = (hi << 16) | lo
                if length > FRAME_LIMIT:
                    raise ProtocolViolation(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if end - start - 9 < length:
                    break
                payload = bytes(buf[start + 9:start + 9 + length])
                start += 9 + length
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload)
            del buf[:start]
        except ProtocolViolation:
            buf.clear()
            raise

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
                self_dependent = WINDOW.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id
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
            self._state.going_away = True  # the peer opens no more streams; those open finish
        elif kind == PUSH_PROMISE:
            raise ProtocolViolation(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        elif kind == PRIORITY:
            if len(payload) != 5:
                self._reset_stream(stream_id, FRAME_SIZE_ERROR)
            elif WINDOW.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
                self._reset_stream(stream_id, PROTOCOL_ERROR)  # a stream cannot depend on itself (§5.3.1)
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
            self._state.peer_frame_size = size
        self._out += frame(SETTINGS, ACK, 0)
        self._pump_all()

    def _window_update(self, stream_id: int, increment: int) -> None:
        if stream_id == 0:
            if increment == 0:
                raise ProtocolViolation(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            state = self._state
            state.send_window += increment
            if state.send_window > MAX_WINDOW:
                raise ProtocolViolation(FLOW_CONTROL_ERROR, "the connection window above 2^31-1")
            self._pump_all()
            return
        if stream_id > self.last_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream already ended: the peer may not know yet
        if increment == 0:
            self._reset_stream(stream_id, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._reset_stream(stream_id, FLOW_CONTROL_ERROR)
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
                self._reset_stream(stream_id, STREAM_CLOSED)
            elif not flags & END_STREAM:
                self._reset_stream(stream_id, PROTOCOL_ERROR)  # trailers must end the request
            elif stream.expected_length not in (None, stream.received_length):
                self._reset_stream(stream_id, PROTOCOL_ERROR)  # a body its content-length does not match (§8.1.1)
            else:
                self._remote_end(stream)
            return
        if self._closed_by_peer.get(stream_id):  # after the peer's RST_STREAM (else: an id reused, below)
            self._reset_stream(stream_id, STREAM_CLOSED)
            return
        if stream_id % 2 == 0 or stream_id <= self.last_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, which cannot open")
        self.last_id = stream_id
        if self._state.going_away or len(self.streams) >= STREAM_LIMIT:
            self._reset_stream(stream_id, REFUSED_STREAM)
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
            self._reset_stream(stream_id, PROTOCOL_ERROR)
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
            self._out += frame(WINDOW_UPDATE, 0, 0, WINDOW.pack(self._unacked))
            self._recv_window += self._unacked
            self._unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self.last_id:
                raise ProtocolViolation(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if stream is not None or stream_id in self._closed_by_peer:
                self._reset_stream(stream_id, STREAM_CLOSED)  # after the peer's own END_STREAM or RST_STREAM
            return  # a stream we reset: its bytes are dropped
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._reset_stream(stream_id, FLOW_CONTROL_ERROR)
            return
        data = unpad(flags, payload)
        if stream.expected_length is not None:
            stream.received_length += len(data)
            if stream.received_length > stream.expected_length or (
                    flags & END_STREAM and stream.received_length != stream.expected_length):
                self._reset_stream(stream_id, PROTOCOL_ERROR)  # a body its content-length does not match (§8.1.1)
                return
        self._events.append(DataReceived(stream_id, data, size))
        if flags & END_STREAM:
            self._remote_end(stream)

    def _remote_end(self, stream: Stream) -> None:
        stream.remote_closed = True
        self._events.append(RequestEnded(stream.id))

"""HTTP/2's wire as a server reads and writes it (RFC 9113, RFC 7541): frame types, flags, error codes and settings;
a frame's bytes; the payloads of control frames, read; header fields, written as literals.

Nothing here keeps state: the connection's halves (:mod:`router.transports.http2.reader`,
:mod:`router.transports.http2.writer`) build on it, and so do the tests that speak HTTP/2 to the router.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

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
DEFAULT_WINDOW = 65_535  # every window's size until a SETTINGS or WINDOW_UPDATE changes it (§6.9.2)

# The fixed parts of frames, packed where a frame is made or read (the hot path calls no helper for them).
HEAD = struct.Struct(">BHBBI")  # length as 8 + 16 bits, type, flags, stream id
SETTING = struct.Struct(">HI")
WINDOW = struct.Struct(">I")  # a window increment, or a stream dependency
RST = struct.Struct(">I")  # an error code
GOAWAY_FIELDS = struct.Struct(">II")  # the last stream id, an error code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


class ProtocolViolation(Exception):
    """The peer broke the protocol: the connection ends with a GOAWAY carrying ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def unpad(flags: int, payload: bytes) -> bytes:
    if flags & PADDED:
        if not payload or payload[0] >= len(payload):
            raise ProtocolViolation(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1:len(payload) - payload[0]]
    return payload


class Settings(NamedTuple):
    """What a SETTINGS frame changes: the peer's initial stream window and largest frame (None: unchanged)."""

    initial_window: int | None
    frame_size: int | None


def parse_settings(payload: bytes) -> Settings:
    if len(payload) % 6:
        raise ProtocolViolation(FRAME_SIZE_ERROR, "a malformed SETTINGS frame")
    window = size = None
    for offset in range(0, len(payload), 6):
        key, value = SETTING.unpack_from(payload, offset)
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
    return WINDOW.unpack(payload)[0] & 0x7FFFFFFF


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

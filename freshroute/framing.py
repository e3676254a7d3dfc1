"""Length-prefixed frames: how messages travel on a store node's read port.

The read port carries ``ReadBatch`` / ``ResultBatch`` messages (``proto/store.proto``),
each as a 4-byte big-endian length followed by the serialized message, on a plain TCP
connection. One frame in is answered by one frame out, in order. Frames rather than a gRPC
stream because every read takes this path: a message on a grpc.aio stream costs ~150–300 µs
of CPU on each side and passes several threads, a frame on an asyncio transport a few µs.
"""

from __future__ import annotations

import struct

# Far above any batch the router sends (a few hundred reads) or a node answers; a length
# beyond it means the peer does not speak this protocol, and the connection is dropped.
MAX_FRAME = 64 << 20

_LENGTH = struct.Struct(">I")
HEADER = _LENGTH.size


class FrameError(Exception):
    """The byte stream is not a sequence of frames (e.g. a client speaking another protocol)."""


def frame(payload: bytes) -> bytes:
    """``payload`` with its length in front."""
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Splits received bytes into payloads; keeps an incomplete frame until the rest arrives."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads completed by ``data``, in order. Raises :class:`FrameError` on an oversized length."""
        buf = self._buffer
        if not buf and len(data) >= HEADER and _LENGTH.unpack_from(data)[0] == len(data) - HEADER:
            return [data[HEADER:]]  # the usual case: exactly one whole frame, nothing buffered
        buf += data
        payloads = []
        start = 0
        end = len(buf)
        while end - start >= HEADER:
            (size,) = _LENGTH.unpack_from(buf, start)
            if size > MAX_FRAME:
                raise FrameError(f"frame of {size} bytes announced; the limit is {MAX_FRAME}")
            if end - start - HEADER < size:
                break
            start += HEADER
            payloads.append(bytes(buf[start:start + size]))
            start += size
        del buf[:start]
        return payloads

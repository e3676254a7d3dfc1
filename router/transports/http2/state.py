"""An HTTP/2 connection's state, shared by its two halves: the streams open and their windows, the streams the
peer closed, what waits to be sent and to be reported, and the windows and limits we grant the peer.

:class:`ConnectionState` is held by :class:`~router.transports.http2.connection.H2Connection` and read and changed
by its :class:`~router.transports.http2.reader.FrameReader` and :class:`~router.transports.http2.writer.AnswerWriter`.
"""

from __future__ import annotations

from router.transports.http2.events import Event
from router.transports.http2.frames import DEFAULT_WINDOW

FRAME_LIMIT = 16_384  # the largest frame a peer may send us (we never raise it)
STREAM_LIMIT = 1_000
# Windows we grant: requests are small, so a peer never waits for a WINDOW_UPDATE, and we send
# one only after half of a window has been used.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 16 << 20
MAX_HEADER_LIST = 64 << 10
# Ids of streams the peer closed (its END_STREAM or RST_STREAM), remembered so frames it still sends
# on them are answered STREAM_CLOSED (§5.1); frames on streams we reset are ignored.
CLOSED_MEMORY = 256


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


class ConnectionState:
    """What both halves of a connection read and change. The containers are made once and never replaced, so each
    half holds them directly; the scalars are read through this object."""

    __slots__ = ("streams", "closed_by_peer", "out", "events", "send_window", "peer_frame_size", "going_away",
                 "closed")

    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}
        # stream -> closed by the peer's RST_STREAM (else by its END_STREAM); insertion-ordered, at most CLOSED_MEMORY
        self.closed_by_peer: dict[int, bool] = {}
        self.out = bytearray()  # bytes to send, until the owner takes them
        self.events: list[Event] = []  # until the owner takes them (receive returns them)
        self.send_window = DEFAULT_WINDOW  # the connection's window for our DATA
        self.peer_frame_size = FRAME_LIMIT
        self.going_away = False
        self.closed = False  # the connection is over: send what waits, then close it

    def peer_closed(self, stream_id: int, by_reset: bool) -> None:
        """Remembers a stream the peer closed: DATA it still sends there is a stream error (§5.1, §6.1)."""
        closed = self.closed_by_peer
        closed[stream_id] = by_reset
        if len(closed) > CLOSED_MEMORY:
            del closed[next(iter(closed))]

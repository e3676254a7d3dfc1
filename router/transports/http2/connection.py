"""A server's HTTP/2 connection: what its owner feeds it and asks of it, over its state and its two halves.

:class:`H2Connection` is fed what the peer sent (:meth:`~H2Connection.receive`, which returns
the :data:`~router.transports.http2.events.Event` values it gave rise to) and is told what to answer
(``send_headers``, ``send_data``, ``send_trailers``); what it has to send waits in
:meth:`~H2Connection.data_to_send` for its owner to write. The router's gRPC front
(:mod:`router.transports.grpc_front`) drives it over an asyncio transport; the conformance suite drives it with
byte strings too.
"""

from __future__ import annotations

import time
from typing import Callable

from router.transports.http2.events import Event
from router.transports.http2.frames import (DEFAULT_WINDOW, GOAWAY, GOAWAY_FIELDS, INITIAL_WINDOW_SIZE,
                                            MAX_CONCURRENT_STREAMS, MAX_HEADER_LIST_SIZE, NO_ERROR, SETTING,
                                            SETTINGS, WINDOW, WINDOW_UPDATE, ProtocolViolation, frame)
from router.transports.http2.reader import FrameReader
from router.transports.http2.state import (CONNECTION_WINDOW, MAX_HEADER_LIST, STREAM_LIMIT, STREAM_WINDOW,
                                           ConnectionState)
from router.transports.http2.writer import AnswerWriter


class H2Connection:
    """A server's HTTP/2 connection: the peer's bytes become events, answers become bytes to send.

    It holds the connection's :class:`~router.transports.http2.state.ConnectionState` and the two halves over it:
    the :class:`~router.transports.http2.reader.FrameReader` the peer's bytes go to, and the
    :class:`~router.transports.http2.writer.AnswerWriter` the owner's answers go to."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        # What the owner reads of the connection (``state.closed``: send what waits, then close it), an attribute
        # rather than a property: the gRPC front asks it for every read and every write.
        state = self.state = ConnectionState()
        writer = AnswerWriter(state)
        self._reader = FrameReader(state, writer, clock)
        self._out = state.out
        self._events = state.events
        self.violation: str | None = None  # why the peer's connection was ended, if it broke the protocol
        # The owner's answers go straight to the writer, bound once: every call answered makes several of them.
        self.consumed = writer.consumed
        self.send_headers = writer.send_headers
        self.send_data = writer.send_data
        self.send_trailers = writer.send_trailers
        self.pending = writer.pending
        self.reset_stream = writer.reset_stream

    @property
    def idle(self) -> bool:
        return not self.state.streams

    def initiate(self) -> None:
        """Our SETTINGS and connection window, the first bytes a server sends."""
        settings = b"".join(SETTING.pack(k, v) for k, v in (
            (MAX_CONCURRENT_STREAMS, STREAM_LIMIT), (INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST)))
        self._out += frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0,
                                                             WINDOW.pack(CONNECTION_WINDOW - DEFAULT_WINDOW))

    def go_away(self) -> None:
        """Graceful shutdown: streams already opened finish; newer ones are refused; closed once idle."""
        state = self.state
        if not state.going_away and not state.closed:
            state.going_away = True
            self._out += frame(GOAWAY, 0, 0, GOAWAY_FIELDS.pack(self._reader.last_id, NO_ERROR))
            state.closed = not state.streams

    def receive(self, data: bytes) -> list[Event]:
        """What ``data`` from the peer gave rise to, in order; nothing more once the connection is closed."""
        state = self.state
        if state.closed:
            return []
        try:
            self._reader.read(data)
        except ProtocolViolation as e:
            self.violation = str(e)
            self._out += frame(GOAWAY, 0, 0, GOAWAY_FIELDS.pack(self._reader.last_id, e.code) + str(e).encode()[:256])
            state.closed = True
        # The events list is the halves' own, kept for the next call: its owner gets a copy.
        events = self._events
        taken = events.copy()
        events.clear()
        return taken

    def data_to_send(self) -> bytes:
        out = self._out
        taken = bytes(out)
        out.clear()
        return taken

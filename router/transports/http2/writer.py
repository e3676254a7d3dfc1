"""The sending half of an HTTP/2 connection: a stream's answer — headers, body, trailers — queued and sent as the
peer's windows allow, and streams ended (by their answer, or reset).

:class:`AnswerWriter` is what the connection's owner answers through (the connection hands it the owner's calls),
and what the reading half asks to reset a stream or to send what a window it opened lets through.
"""

from __future__ import annotations

from router.transports.http2.events import Drained, StreamReset
from router.transports.http2.frames import (CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADERS, NO_ERROR, RST,
                                            RST_STREAM, WINDOW, WINDOW_UPDATE, frame)
from router.transports.http2.state import STREAM_WINDOW, ConnectionState, Stream


class AnswerWriter:
    """Answers queued per stream and sent as the peer's windows allow, into the connection's bytes to send."""

    def __init__(self, state: ConnectionState) -> None:
        self._state = state
        self.streams = state.streams
        self._out = state.out
        self._events = state.events
        self._peer_closed = state.peer_closed

    def consumed(self, stream_id: int, size: int) -> None:
        """The stream's owner took ``size`` bytes of its request: its window reopens once half of it is used."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            return
        stream.unacked += size
        if stream.unacked >= STREAM_WINDOW // 2:
            self._out += frame(WINDOW_UPDATE, 0, stream_id, WINDOW.pack(stream.unacked))
            stream.recv_window += stream.unacked
            stream.unacked = 0

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """The answer's headers (HEADERS, and CONTINUATION beyond the peer's frame size); with ``end_stream``, the
        whole answer (then the stream is over)."""
        if stream_id not in self.streams:
            return
        self._out += self._header_frames(stream_id, block, END_STREAM if end_stream else 0)
        if end_stream:
            self.forget(stream_id, reset=not self.streams[stream_id].remote_closed)

    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        """Answer body bytes, sent as far as the windows allow and the rest as they open; with ``end_stream``, the
        last of the answer (a plain HTTP answer, without trailers)."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.trailers is not None or stream.ending:
            return
        stream.pending += data
        stream.ending = end_stream
        self.pump(stream)

    def send_trailers(self, stream_id: int, block: bytes) -> None:
        """The answer's trailers, after its last DATA: the stream is over once they are sent."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return
        stream.trailers = block
        self.pump(stream)

    def pending(self, stream_id: int) -> int:
        """Answer bytes of the stream still waiting for a window."""
        stream = self.streams.get(stream_id)
        return len(stream.pending) if stream is not None else 0

    def reset_stream(self, stream_id: int, code: int) -> None:
        """RST_STREAM with ``code``; a stream still open ends without an answer (RFC 9113 §5.4.2)."""
        self._out += frame(RST_STREAM, 0, stream_id, RST.pack(code))
        if stream_id in self.streams:
            self.forget(stream_id, reset=False)
            self._events.append(StreamReset(stream_id))

    def _header_frames(self, stream_id: int, block: bytes, flags: int) -> bytes:
        limit = self._state.peer_frame_size
        if len(block) <= limit:
            return frame(HEADERS, flags | END_HEADERS, stream_id, block)
        parts = [block[i:i + limit] for i in range(0, len(block), limit)]
        out = [frame(HEADERS, flags, stream_id, parts[0])]
        out += [frame(CONTINUATION, 0, stream_id, p) for p in parts[1:-1]]
        out.append(frame(CONTINUATION, END_HEADERS, stream_id, parts[-1]))
        return b"".join(out)

    def pump(self, stream: Stream, opened: bool = False) -> None:
        """Sends what flow control lets through; the trailers follow the last DATA. ``opened``: the peer opened a
        window, and a stream it unblocks is reported :class:`Drained` (its owner knows of the others: it sent)."""
        pending = stream.pending
        if stream.ending and not pending:
            self._out += frame(DATA, END_STREAM, stream.id)
            self.forget(stream.id, reset=not stream.remote_closed)
            return
        state = self._state
        while pending:
            n = min(len(pending), stream.send_window, state.send_window, state.peer_frame_size)
            if n <= 0:
                stream.blocked = True
                return
            last = stream.ending and n == len(pending)
            self._out += frame(DATA, END_STREAM if last else 0, stream.id, bytes(pending[:n]))
            del pending[:n]
            stream.send_window -= n
            state.send_window -= n
            if last:
                self.forget(stream.id, reset=not stream.remote_closed)
                return
        if stream.blocked:
            stream.blocked = False
            if opened:
                self._events.append(Drained(stream.id))
        if stream.trailers is not None:
            self._out += self._header_frames(stream.id, stream.trailers, END_STREAM)
            # An answer ended before the peer ended its half (an error, say) resets the stream: whatever the
            # peer still sends is not wanted.
            self.forget(stream.id, reset=not stream.remote_closed)

    def pump_all(self) -> None:
        """Sends what a window the peer opened for every stream lets through (its connection window, or SETTINGS)."""
        for stream in [s for s in self.streams.values() if s.blocked]:
            self.pump(stream, opened=True)

    def forget(self, stream_id: int, reset: bool) -> None:
        """The stream is over for us (with ``reset``, the peer is told so: RST_STREAM NO_ERROR); a connection going
        away closes once it has no stream left."""
        stream = self.streams.pop(stream_id, None)
        if reset:
            self._out += frame(RST_STREAM, 0, stream_id, RST.pack(NO_ERROR))
        elif stream is not None and stream.remote_closed:
            self._peer_closed(stream_id, by_reset=False)
        state = self._state
        if state.going_away and not self.streams:
            state.closed = True

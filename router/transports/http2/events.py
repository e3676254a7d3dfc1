"""What an HTTP/2 connection tells its owner: the events :meth:`H2Connection.receive
<router.transports.http2.connection.H2Connection.receive>` returns, in the order the peer's frames and the owner's
calls gave rise to them."""

from __future__ import annotations

from typing import NamedTuple, Union

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

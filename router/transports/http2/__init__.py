"""HTTP/2, a server's side, as a protocol machine: bytes in, events out, bytes to send — no sockets, no asyncio.

A connection (:class:`router.transports.http2.connection.H2Connection`) is composed as h11 composes one: the
connection's state (:mod:`~router.transports.http2.state`), the half that reads the peer's frames into that state
and into events (:mod:`~router.transports.http2.reader`), and the half that writes answers as the peer's windows
allow (:mod:`~router.transports.http2.writer`), over the wire's vocabulary (:mod:`~router.transports.http2.frames`);
what it tells its owner is in :mod:`~router.transports.http2.events`.

A server's HTTP/2 and no more: no push, no priorities, no upgrade from HTTP/1.1 (h2c with
prior knowledge, as gRPC clients speak it). What a peer sends beyond the protocol ends its
stream with RST_STREAM or its connection with a GOAWAY, as RFC 9113 says which.
"""

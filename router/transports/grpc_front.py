"""The router's public gRPC port: HTTP/2 spoken on the event loop itself, ``Router.Get`` answered in place.

Through grpc.aio a call passes C-core's threads: its bytes are read on one, each step's
completion reaches the event loop through grpc.aio's poller thread, and the answer leaves
the same way. On a small machine shared with the pipeline every one of those hand-overs
waits for a core, and a routed lookup paid them on top of the store node's own. Lookups are
the product, so the port speaks HTTP/2 itself: :class:`GrpcConnection` is the thin asyncio
adapter that feeds a connection's bytes to its protocol machine
(:class:`router.transports.http2.connection.H2Connection`), hands the machine's events to the gRPC
layer (:class:`router.transports.grpc_calls.GrpcCalls`: Get in place, every other call
relayed to the full grpc.aio server) and writes what the machine has to send, once per
loop turn. The front knows the Router service only through :class:`router.transports.GetCalls`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module

import grpc

from freshroute.pacing import PacedByAnswers
from freshroute.tls import peer_subject
from router.transports import GetCalls
from router.transports.grpc_calls import GrpcCalls, Relay
from router.transports.http2.connection import H2Connection

log = logging.getLogger("freshroute.router.grpc")


class GrpcConnection(PacedByAnswers):
    """One client connection: its bytes into the HTTP/2 machine, the machine's bytes out once per loop turn."""

    def __init__(self, front: "GrpcFront") -> None:
        self._front = front
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self.h2 = H2Connection(self._loop.time)
        self._calls: GrpcCalls | None = None
        self._flush_due = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        self._transport = transport  # type: ignore[assignment]
        front = self._front
        self._calls = GrpcCalls(self.h2, front.calls, front.relay, peer_subject(transport), self.flush_soon)
        self._front.connections.add(self)
        self.h2.initiate()
        self.flush_soon()

    def data_received(self, data: bytes) -> None:
        h2 = self.h2
        if h2.state.closed:
            return
        events = h2.receive(data)
        if h2.violation is not None and self._transport is not None:
            log.info("gRPC connection %s closed: %s", self._transport.get_extra_info("peername"), h2.violation)
        if events:
            self._calls.handle(events)  # type: ignore[union-attr]
        self.flush_soon()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._front.connections.discard(self)
        if self._calls is not None:
            self._calls.cancel_all()

    @property
    def idle(self) -> bool:
        return self.h2.idle

    def go_away(self) -> None:
        """Graceful shutdown: calls already opened finish; newer ones are refused."""
        self.h2.go_away()
        self.flush_soon()

    def abort(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.abort()

    def flush_soon(self) -> None:
        # Everything worked out in one loop turn leaves in one write after it: a client asleep in
        # epoll_wait is woken once for all its answers, not once each.
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        transport = self._transport
        data = self.h2.data_to_send()
        if transport is None or transport.is_closing():
            return
        if data:
            transport.write(data)
        if self.h2.state.closed:
            transport.close()


class GrpcFront:
    """The public gRPC port: :class:`GrpcConnection` per client, relaying what it does not answer to ``relay_target``."""

    def __init__(self, calls: GetCalls, relay_target: str, host: str, port: int, reuse_port: bool = False,
                 ssl: "ssl_module.SSLContext | None" = None, relay_key: str = "") -> None:
        self.calls = calls
        self._ssl = ssl
        self.connections: set[GrpcConnection] = set()
        self._listen = (host, port, reuse_port)
        self._server: asyncio.Server | None = None
        self.relay = Relay(grpc.aio.insecure_channel(relay_target, options=[("grpc.max_receive_message_length", -1),
                                                                            ("grpc.max_send_message_length", -1)]),
                           relay_key)
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
        await self.relay.channel.close(grace=None)

"""Connections the compiled path gives to the router's Python front whole (every request but the lookups it answers
or relays: the console, scans, batches, the rest of the API). Each arrives in an inbox — a datagram socket pair
within the process — as one datagram: its socket's descriptor (a duplicate the path made, this side's from then on)
and the bytes the path read and did not answer. The Python front's protocol serves it as if uvicorn had accepted it
on the front's own port, so no process sits between the client and the Python app from then on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any, Callable

log = logging.getLogger(__name__)

# Larger than anything the path sends with a socket (its MAX_ADOPTED, 60 KiB, and the descriptor).
MAX_DATAGRAM = 64 << 10
# Datagrams taken per wake-up of the event loop: the rest are taken at the next.
PER_WAKE = 64
START_POLL_S = 0.01  # how often the inbox looks again while the Python front has not started

ProtocolFactory = Callable[[], asyncio.Protocol]


class Inbox:
    """The Python side of the handover: ``path_end`` goes to the compiled path; :meth:`start` adopts what arrives."""

    def __init__(self) -> None:
        self._ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._ours.setblocking(False)
        self._theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._protocol: Callable[[], ProtocolFactory | None] = lambda: None

    @property
    def path_end(self) -> int:
        """The descriptor the compiled path sends on (it keeps duplicates; this one stays open until :meth:`close`)."""
        return self._theirs.fileno()

    def start(self, protocol: Callable[[], ProtocolFactory | None]) -> None:
        """Adopt connections on the running loop, each served by a protocol of ``protocol()`` — None until the front
        has started, and the connections wait in the inbox until then."""
        self.loop = asyncio.get_running_loop()
        self._protocol = protocol
        self.loop.add_reader(self._ours.fileno(), self._readable)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.remove_reader(self._ours.fileno())
        self._ours.close()
        self._theirs.close()

    def _readable(self) -> None:
        assert self.loop is not None
        factory = self._protocol()
        if factory is None:
            self.loop.remove_reader(self._ours.fileno())
            self.loop.call_later(START_POLL_S, self.loop.add_reader, self._ours.fileno(), self._readable)
            return
        for _ in range(PER_WAKE):
            try:
                datagram = self._ours.recv(MAX_DATAGRAM)
            except BlockingIOError:
                return
            self._adopt(datagram, factory)

    def _adopt(self, datagram: bytes, factory: ProtocolFactory) -> None:
        assert self.loop is not None
        fd, pending = int.from_bytes(datagram[:4], "little", signed=True), datagram[4:]
        try:
            sock = socket.socket(fileno=fd)
        except OSError as e:
            log.warning("a handed-over connection could not be adopted (%s); it is closed", e)
            _close(fd)
            return
        sock.setblocking(False)
        self.loop.create_task(self._serve(sock, lambda: Resumed(factory(), pending)))

    async def _serve(self, sock: socket.socket, factory: ProtocolFactory) -> None:
        assert self.loop is not None
        try:
            await self.loop.connect_accepted_socket(factory, sock)
        except OSError:
            sock.close()  # the client left meanwhile


class Resumed(asyncio.Protocol):
    """A connection adopted part-way: the Python front's protocol takes the transport, then the bytes the compiled
    path read and did not answer, before anything read from the socket here."""

    def __init__(self, protocol: asyncio.Protocol, pending: bytes) -> None:
        self.protocol = protocol
        self.pending = pending

    def connection_made(self, transport: Any) -> None:
        transport.set_protocol(self.protocol)
        self.protocol.connection_made(transport)
        if self.pending:
            self.protocol.data_received(self.pending)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass

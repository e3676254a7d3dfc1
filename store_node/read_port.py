"""The store node's read port: the ``Read`` stream's batches as length-prefixed frames on plain TCP.

The router's lookups take this path when a node advertises a read port (see
:mod:`freshroute.framing` for why). Each ``ReadBatch`` frame is answered, in order, by one
``ResultBatch`` frame computed exactly as the gRPC ``Read`` stream computes it — the same
bounds, the same refusals — synchronously on the event loop, since RocksDB point reads
take microseconds. A peer that sends something other than frames is disconnected; on a node
with a cluster secret, so is one whose first batch does not carry it, answered only by a
batch that says why. With TLS settings the port speaks only TLS.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Callable

from google.protobuf.message import DecodeError

from freshroute.framing import FrameError, FrameReader, frame
from freshroute.pacing import PacedByAnswers
from proto import store_pb2
from store_node.access import REFUSAL, ClusterSecret
from store_node.service import StoreNodeService

log = logging.getLogger(__name__)


class ReadPortConnection(PacedByAnswers):
    """One router connection: every complete frame is answered before the next bytes are read."""

    def __init__(self, service: StoreNodeService, secret: ClusterSecret) -> None:
        self._service = service
        self._frames = FrameReader()
        self._transport: asyncio.Transport | None = None
        self._secret: ClusterSecret | None = secret if secret.required else None  # None once admitted

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        try:
            payloads = self._frames.feed(data)
            for payload in payloads:
                batch = store_pb2.ReadBatch.FromString(payload)
                if self._secret is not None and not self._admit(batch, transport):
                    return
                transport.write(frame(self._service.reader().results(batch).SerializeToString()))
        except (FrameError, DecodeError) as e:
            log.warning("read port: dropping %s: %s", transport.get_extra_info("peername"), e)
            transport.abort()

    def _admit(self, batch: store_pb2.ReadBatch, transport: asyncio.Transport) -> bool:
        assert self._secret is not None
        if self._secret.admits(batch.cluster_secret):
            self._secret = None
            return True
        log.warning("read port: refused %s: %s", transport.get_extra_info("peername"), REFUSAL)
        transport.write(frame(store_pb2.ResultBatch(refused=REFUSAL).SerializeToString()))
        transport.close()  # after the refusal is written; nothing was read
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def start_read_port(service: StoreNodeService, host: str, port: int, secret: ClusterSecret = ClusterSecret(None),
                          tls: ssl.SSLContext | None = None) -> tuple[asyncio.Server, int]:
    """Listen on ``host:port`` (0 lets the OS pick); returns the server and the bound port."""
    loop = asyncio.get_running_loop()
    factory: Callable[[], asyncio.Protocol] = lambda: ReadPortConnection(service, secret)  # noqa: E731
    server = await loop.create_server(factory, host, port, ssl=tls)
    bound = server.sockets[0].getsockname()[1]
    return server, bound

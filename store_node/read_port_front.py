"""The read port's front: its connections' bytes in and out, each connection's frames answered by the node's
:class:`~store_node.read_port.Answers`.

The compiled front (native/dataplane's ``ReadPortFront``) accepts and reads the port's connections on a thread of its
own and takes the GIL only to answer: a batch of plain key reads by compiled code (``KeyReads``), which runs no Python
bytecode but each replica's figures and its store's read, any other batch by the Python reader. A lone key read's cost
was mostly bytecode run with cold caches. Where the compiled path is not built, where rustls cannot serve the node's TLS
files, or with ``read_port_front`` python, the event loop serves the port (uvloop). The tests of the port run against
both fronts.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, Literal, Protocol

from freshroute.pacing import PacedByAnswers
from freshroute.tls import ServerTLS
from freshroute.wire import FrameError, FrameReader
from store_node.access import ClusterSecret
from store_node.read_port import Answers, ReadPort

log = logging.getLogger(__name__)

Front = Literal["compiled", "python"]


class ReadDoor(Protocol):
    """A read port being served: its bound port, and which front serves it."""

    port: int
    front: Front

    def reloaded(self) -> None:
        """The TLS files were reloaded (SIGHUP): new connections get the new certificate."""

    def close(self) -> None:
        """Stop accepting and drop the port's connections."""


async def start_read_port(reads: ReadPort, host: str, port: int, secret: ClusterSecret = ClusterSecret(None),
                          tls: ServerTLS | None = None, front: Front = "compiled") -> ReadDoor:
    """Serve the read port on ``host:port`` (0 lets the OS pick), over TLS with ``tls``: by the compiled front unless
    ``front`` is python or it cannot be (said in the log)."""
    answers = Answers(reads, secret)
    why = why_python(front)
    if why is None:
        listening = _listening(host, port)
        try:
            return _CompiledDoor(listening, answers, reads, tls)
        except ValueError as e:
            listening.close()
            why = f"rustls cannot serve tls_cert and tls_key: {e}"
    if front == "compiled":
        log.warning("read port served by the event loop: %s", why)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ReadPortConnection(answers), host, port,
                                      ssl=tls.context if tls is not None else None)
    return _LoopDoor(server)


def why_python(front: Front) -> str | None:
    """Why the event loop serves the read port, whatever the TLS files (None: the compiled front does)."""
    if front != "compiled":
        return "read_port_front is python"
    try:
        import freshroute_dataplane  # noqa: F401
    except ImportError:
        return "the compiled path is not built here (native/dataplane: ./dev builds it)"
    return None


def _listening(host: str, port: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return socket.create_server((host, port), family=family, backlog=1024)


class _CompiledDoor:
    """The port on the compiled front's thread."""

    front: Front = "compiled"

    def __init__(self, listening: socket.socket, answers: Answers, reads: ReadPort, tls: ServerTLS | None) -> None:
        from freshroute_dataplane import KeyReads, ReadPortFront

        self._socket = listening  # kept open while the front accepts on it
        self.port = listening.getsockname()[1]
        self._tls = tls
        self._front: Any = ReadPortFront(listening.fileno(), answers, KeyReads(reads.node, reads.clock))
        if tls is not None:
            self._front.tls(*tls.pem)  # files rustls cannot use are a ValueError, before anything is served
        self._front.start()

    def reloaded(self) -> None:
        if self._tls is None:
            return
        try:
            self._front.tls(*self._tls.pem)
        except ValueError as e:
            log.error("read port: the reloaded TLS files are not usable by rustls, the previous certificate stays in "
                      "use: %s", e)

    def close(self) -> None:
        self._front.stop()
        self._socket.close()


class _LoopDoor:
    """The port on the node's event loop."""

    front: Front = "python"

    def __init__(self, server: asyncio.Server) -> None:
        self._server = server
        self.port = server.sockets[0].getsockname()[1]

    def reloaded(self) -> None:
        """ServerTLS reloads its SSLContext in place."""

    def close(self) -> None:
        self._server.close()


class ReadPortConnection(PacedByAnswers):
    """One peer's connection on the event loop: every complete frame is answered before the next bytes are read."""

    def __init__(self, answers: Answers) -> None:
        self._answers = answers
        self._frames = FrameReader()
        self._transport: asyncio.Transport | None = None
        self._peer = ""
        self._admitted = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._transport = transport
        host, port = transport.get_extra_info("peername")[:2]
        self._peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # as the compiled front names it

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        try:
            payloads = self._frames.feed(data)
        except FrameError as e:
            self._answers.refuse(self._peer, str(e))
            transport.abort()
            return
        if not payloads:
            return
        out, still_open = self._answers.answer(self._peer, payloads, self._admitted)
        if out:
            transport.write(out)
        if still_open:
            self._admitted = True
        else:
            transport.close()  # after what was answered is written

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

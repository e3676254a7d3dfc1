"""GETs at a fixed rate over keep-alive HTTP/1.1 connections spread evenly over every router behind one port.

A Python load cheap enough to hold a few thousand lookups a second beside the stack it measures on two cores: uvloop,
an asyncio Protocol per connection and httptools' parser (httpx costs several times the CPU a request). Routers
sharing a port (SO_REUSEPORT) are told apart by the process that holds the accepted end of a connection (``/proc``):
a connection is opened again until it lands on the router it is for, so each router gets its share of the rate and
every answer says which router gave it.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from typing import Callable, Mapping, NamedTuple

import httptools

NO_ANSWER = 0  # the status of a request that got no answer (timed out, or its connection was lost)


class Response(NamedTuple):
    status: int
    body: bytes
    keep_alive: bool


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one GET at a time; its answers parsed by httptools."""

    def __init__(self, host: str) -> None:
        self._head = f"HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._waiter: asyncio.Future[Response] | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(ConnectionError(f"not an HTTP/1.1 answer: {e}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionError("the connection was closed before the answer"))

    # httptools' callbacks
    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        response = Response(self._parser.get_status_code(), b"".join(self._body), self._parser.should_keep_alive())
        self._body = []
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(response)

    def _fail(self, error: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)

    async def get(self, target: bytes, timeout_s: float) -> Response:
        """The answer to ``GET target``: ConnectionError when the connection ends first, TimeoutError when none came
        within ``timeout_s`` (the connection is then of no more use: a late answer would pass for the next one's)."""
        if self.closed or self.transport is None:
            raise ConnectionError("the connection is closed")
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(timeout_s, self._fail, TimeoutError(f"no answer within {timeout_s} s"))
        self.transport.write(b"GET " + target + b" " + self._head)
        try:
            return await waiter
        finally:
            timer.cancel()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _hex_address(text: str) -> tuple[str, int]:
    """An IPv4 address and port as /proc/net/tcp prints them (the address in the machine's byte order)."""
    address, port = text.split(":")
    return ".".join(str(b) for b in int(address, 16).to_bytes(4, sys.byteorder)), int(port, 16)


def socket_inode(local: tuple[str, int], remote: tuple[str, int], table: str = "/proc/net/tcp") -> int | None:
    """The inode of the IPv4 TCP socket from ``local`` to ``remote`` (None while there is none, or it has no file)."""
    with open(table) as f:
        next(f)
        for line in f:
            fields = line.split()
            if _hex_address(fields[1]) == local and _hex_address(fields[2]) == remote:
                return int(fields[9]) or None
    return None


def holder(inode: int, pids: Mapping[str, int]) -> str | None:
    """Which of the processes ``pids`` (name → pid) holds socket ``inode`` open."""
    wanted = f"socket:[{inode}]"
    for name, pid in pids.items():
        fds = f"/proc/{pid}/fd"
        try:
            entries = os.listdir(fds)
        except OSError:
            continue
        for fd in entries:
            try:
                if os.readlink(f"{fds}/{fd}") == wanted:
                    return name
            except OSError:
                continue
    return None


async def accepted_by(transport: asyncio.BaseTransport, pids: Mapping[str, int], timeout_s: float = 2.0) -> str | None:
    """The process among ``pids`` that accepted the connection of ``transport`` (None if none did in time)."""
    local, remote = transport.get_extra_info("sockname")[:2], transport.get_extra_info("peername")[:2]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # a connection waiting in its listener's queue has no file yet
        inode = socket_inode(remote, local)
        if inode is not None and (name := holder(inode, pids)) is not None:
            return name
        await asyncio.sleep(0.005)
    return None


class RateLoad:
    """GETs of ``target()`` at ``rate`` a second over ``connections`` keep-alive connections to ``host:port``, until
    ``stopped()``: each answer given to ``on_answer(router, status, body)`` (status NO_ANSWER: none came). With
    ``routers`` (name → pid of the processes sharing the port), the connections are spread evenly over them and each
    answer names its router; without, every answer names ``host:port``."""

    def __init__(self, host: str, port: int, rate: float, connections: int, target: Callable[[random.Random], bytes],
                 on_answer: Callable[[str, int, bytes], None], stopped: Callable[[], bool],
                 routers: Mapping[str, int] | None = None, timeout_s: float = 10.0) -> None:
        if rate <= 0 or connections <= 0:
            raise ValueError("a load needs a rate and connections above 0")
        self.host, self.port, self.rate, self.connections = host, port, rate, connections
        self.target, self.on_answer, self.stopped = target, on_answer, stopped
        self.routers, self.timeout_s = dict(routers or {}), timeout_s
        self.reconnects = 0

    async def run(self) -> None:
        names = list(self.routers) or [f"{self.host}:{self.port}"]
        await asyncio.gather(*(self._worker(i, names[i % len(names)]) for i in range(self.connections)))

    async def _connect(self, router: str) -> Connection:
        """A connection accepted by ``router``: others are closed and opened again (the kernel picks the listener)."""
        loop = asyncio.get_running_loop()
        for _ in range(100):
            _, conn = await loop.create_connection(lambda: Connection(self.host), self.host, self.port)
            if not self.routers:
                return conn
            assert conn.transport is not None
            if await accepted_by(conn.transport, self.routers) == router:
                return conn
            conn.close()
        raise ConnectionError(f"no connection to {self.host}:{self.port} landed on {router} in 100 tries")

    async def _worker(self, i: int, router: str) -> None:
        rng = random.Random(i)
        every = self.connections / self.rate
        conn: Connection | None = None
        due = time.monotonic() + every * rng.random()  # the connections' requests interleaved, not in lockstep
        try:
            while not self.stopped():
                try:
                    if conn is None:
                        conn = await self._connect(router)
                        due = max(due, time.monotonic())  # no burst to make up for the time it took
                        await asyncio.sleep(due - time.monotonic())
                    answer = await conn.get(self.target(rng), self.timeout_s)
                    self.on_answer(router, answer.status, answer.body)
                    if not answer.keep_alive or conn.closed:
                        conn.close()
                        conn, self.reconnects = None, self.reconnects + 1
                except (OSError, TimeoutError):  # refused, closed, no answer in time: a lookup failed
                    self.on_answer(router, NO_ANSWER, b"")
                    if conn is not None:
                        conn.close()
                        conn, self.reconnects = None, self.reconnects + 1
                due += every
                await asyncio.sleep(max(0.0, due - time.monotonic()))
        finally:
            if conn is not None:
                conn.close()

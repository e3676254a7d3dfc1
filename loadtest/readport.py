"""A store node's read port from a tool: one batch answered (tests, scripts), and load at a fixed rate or flat out.

The read port carries ``ReadBatch`` / ``ResultBatch`` messages as length-prefixed frames
(:mod:`freshroute.routing.store`), one answer per batch, in order. The load generator sends one
serialized batch again and again on several connections, each keeping a number of batches
unanswered, and counts answers as frames without parsing them: what it measures is the node,
not the parsing of answers in Python.
"""

from __future__ import annotations

import asyncio
import socket
import time

from freshroute.wire import FrameReader, frame
from proto import store_pb2


def _host_port(read_address: str) -> tuple[str, int]:
    host, port = read_address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def read_batch(read_address: str, batch: store_pb2.ReadBatch, timeout_s: float = 10.0) -> store_pb2.ResultBatch:
    """``batch`` sent to the node at ``read_address`` on a connection of its own, and its answer."""
    with socket.create_connection(_host_port(read_address), timeout=timeout_s) as sock:
        sock.sendall(frame(batch.SerializeToString()))
        frames = FrameReader()
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError(f"read port {read_address} closed the connection before answering")
            payloads = frames.feed(data)
            if payloads:
                return store_pb2.ResultBatch.FromString(payloads[0])


async def _connection(host: str, port: int, payload: bytes, in_flight: int, until: float, counts: list[int]) -> None:
    """One connection keeping ``in_flight`` batches unanswered until ``until`` (monotonic)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(payload * in_flight)
        frames = FrameReader()
        while True:
            data = await reader.read(1 << 16)
            if not data:
                raise ConnectionError("the read port closed the connection")
            answered = len(frames.feed(data))
            counts[0] += answered
            if time.monotonic() >= until:
                return
            writer.write(payload * answered)
    finally:
        writer.close()


def throughput(read_address: str, batch: store_pb2.ReadBatch, connections: int, in_flight: int,
               duration_s: float) -> float:
    """Batches answered per second with ``connections`` × ``in_flight`` batches unanswered at all times."""
    host, port = _host_port(read_address)
    payload = frame(batch.SerializeToString())
    counts = [0]

    async def run() -> float:
        started = time.monotonic()
        until = started + duration_s
        await asyncio.gather(*(_connection(host, port, payload, in_flight, until, counts)
                               for _ in range(connections)))
        return counts[0] / (time.monotonic() - started)

    return asyncio.run(run())


def latencies(read_address: str, batch: store_pb2.ReadBatch, rate: float, duration_s: float) -> list[float]:
    """Round trips (ms) of one batch sent every 1/``rate`` s on one connection, for ``duration_s``."""
    payload = frame(batch.SerializeToString())
    out: list[float] = []
    with socket.create_connection(_host_port(read_address), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        frames = FrameReader()
        start = time.monotonic()
        n = 0
        while (due := start + n / rate) < start + duration_s:
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            t0 = time.perf_counter()
            sock.sendall(payload)
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    raise ConnectionError(f"read port {read_address} closed the connection")
                if frames.feed(data):
                    break
            out.append((time.perf_counter() - t0) * 1000)
            n += 1
    return out

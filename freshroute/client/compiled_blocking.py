"""The blocking client's key reads on the compiled path, where it is built: the same ``DirectReads`` as
:mod:`freshroute.client.compiled` decides each read, and the calling thread carries its bytes — blocking sockets,
one per store node's read port and thread, waited on with ``select()`` until the answer or the engine's next timer,
no hand-off to another thread. What it does not read goes to the client's Python path (None), as there.
"""

from __future__ import annotations

import select
import socket
import time
from typing import Any

import orjson

from freshroute.bound import Bound
from freshroute.cluster_access import NodeAccess
from freshroute.client import nonblocking
from freshroute.client.lookup import Lookup
from freshroute.routing.compiled_view import policy_doc, snapshot_doc
from freshroute.routing.counts import Metrics
from freshroute.routing.policy import RoutingPolicy
from freshroute.routing.snapshot import Snapshot, SnapshotSource

_FLUSH = 2  # DirectReads' flag: reads wait in an outbox (native/dataplane/src/direct.rs)


class _Answer:
    """What DirectReads resolves a read into (an asyncio future's two methods, without a loop)."""

    __slots__ = ("value", "resolved")

    def __init__(self) -> None:
        self.value: Any = None
        self.resolved = False

    def done(self) -> bool:
        return self.resolved

    def set_result(self, value: Any) -> None:
        self.value, self.resolved = value, True


class _Port:
    """A socket to one read port as the engine's transport: it writes whole frames, and is aborted by closing (a write
    that fails closes it too: the next wait finds it gone and tells the engine)."""

    __slots__ = ("address", "sock", "write_timeout_s")

    def __init__(self, address: str, sock: socket.socket, write_timeout_s: float) -> None:
        self.address, self.sock, self.write_timeout_s = address, sock, write_timeout_s

    def write(self, data: bytes) -> None:
        try:
            nonblocking.send(self.sock, data, self.write_timeout_s)
        except OSError:
            self.sock.close()

    def abort(self) -> None:
        self.sock.close()

    def fileno(self) -> int:
        return self.sock.fileno()


def blocking_compiled_reads(policy: RoutingPolicy, access: NodeAccess, metadata: SnapshotSource,
                            metrics: Metrics | None, connect_timeout_s: float) -> BlockingCompiledReads | None:
    """One thread's compiled reads, or None where the compiled path is not built."""
    try:
        from freshroute_dataplane import DirectReads
    except ImportError:  # not built here: the Python path reads alone
        return None
    engine = DirectReads(orjson.dumps(policy_doc(policy, access.secret)).decode(), Lookup)
    return BlockingCompiledReads(engine, policy, access, metadata, metrics, connect_timeout_s)


class BlockingCompiledReads:
    def __init__(self, engine: Any, policy: RoutingPolicy, access: NodeAccess, metadata: SnapshotSource,
                 metrics: Metrics | None, connect_timeout_s: float) -> None:
        self._engine, self._policy, self._access, self._metadata = engine, policy, access, metadata
        self._metrics, self._connect_timeout_s = metrics, connect_timeout_s
        self._ports: dict[str, _Port] = {}
        self._seen: Snapshot | None = None

    def _view(self) -> None:
        """The engine brought to the metadata's current view, and a connection opened to each read port it names
        and this thread has not (one failing to connect is read by the Python path until the next view)."""
        snap = self._metadata.current
        if snap is self._seen:
            return
        self._seen = snap
        self._engine.update(snapshot_doc(snap, self._policy))
        for node in snap.nodes.values():
            address = node.read_address
            if address and address not in self._ports:
                try:
                    self._connect(address)
                except OSError:
                    pass

    def _connect(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        host = host.strip("[]")
        sock = socket.create_connection((host, int(port)), timeout=self._connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._access.ssl_context is not None:
            try:
                sock = self._access.ssl_context.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self._ports[address] = _Port(address, nonblocking.connected(sock), self._connect_timeout_s)
        self._engine.connected(address, self._ports[address])

    def get(self, table: str, physical: str, key: str, bound: Bound) -> Lookup | None:
        """``key`` of ``table`` (read as ``physical``, the version resolved), or None for the Python path."""
        if not bound.compiled or type(key) is not str:
            return None
        self._view()
        position = bound.min_position
        answer = _Answer()
        started = time.perf_counter()
        flags = self._engine.get(table, physical, key, bound.max_lag, bound.max_staleness_ms,
                                 None if position is None else (position.table, position.offsets), answer,
                                 time.monotonic())
        lookup: Lookup | None = self._wait(flags, answer, started)
        return lookup

    def get_many(self, table: str, physical: str, keys: list[str], bound: Bound) -> list[Lookup] | None:
        """``keys`` of ``table`` as :meth:`get` reads one, in their order; None for the Python path."""
        if not bound.compiled or not keys or len(keys) > self._policy.batch_max_keys:
            return None
        self._view()
        position = bound.min_position
        answer = _Answer()
        started = time.perf_counter()
        flags = self._engine.get_many(table, physical, keys, bound.max_lag, bound.max_staleness_ms,
                                      None if position is None else (position.table, position.offsets), answer,
                                      time.monotonic())
        lookups: list[Lookup] | None = self._wait(flags, answer, started)
        return lookups

    def _wait(self, flags: int, answer: _Answer, started: float) -> Any:
        """The read's answer, the calling thread carrying its bytes until it resolves (None: the Python path's)."""
        if not flags:
            return None
        engine = self._engine
        if flags & _FLUSH:
            engine.flush()  # this thread issues one read at a time: nothing else will join it
        while not answer.resolved:
            for port in [p for p in self._ports.values() if p.sock.fileno() < 0]:
                self._lost(port)  # closed by a failed write or by the engine: its reads fail
            if answer.resolved:
                break
            due = engine.due
            timeout = self._policy.attempt_timeout_ms / 1000 if due is None else max(0.0, due - time.monotonic())
            ready, _, _ = select.select(list(self._ports.values()), [], [], timeout)
            now = time.monotonic()
            for port in ready:
                self._receive(port, now)
            due = engine.due
            if not answer.resolved and (not ready or (due is not None and due <= now)):
                engine.expire(now)
        if answer.value is not None and self._metrics is not None:
            elapsed = time.perf_counter() - started
            for lookup in answer.value if isinstance(answer.value, list) else (answer.value,):
                self._metrics.lookup("ok" if lookup.found else "not_found", lookup.role, elapsed)
        return answer.value

    def _receive(self, port: _Port, now: float) -> None:
        try:
            data = nonblocking.receive(port.sock)
        except OSError:
            data = b""
        if data is None:
            return
        if not data:
            self._lost(port)
            return
        self._engine.received(port.address, data, now)  # a frame it cannot read: it aborts the port, found next

    def _lost(self, port: _Port) -> None:
        if self._ports.get(port.address) is port:
            del self._ports[port.address]
        port.sock.close()
        self._engine.lost(port.address, None, time.monotonic())

    def close(self) -> None:
        for port in list(self._ports.values()):
            self._lost(port)

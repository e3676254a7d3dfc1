"""The client's key reads on the compiled path, where it is built (``native/dataplane``'s ``DirectReads``): the key's
partition, the freshest replica within the bound, the read, the hedge and the answer's labels are decided in Rust by
the router's own routing code, while this module's asyncio protocol carries the bytes — one connection per store
node's read port, TLS as the client's, the loop's one timer for hedges and deadlines. A read it does not serve (a
bound of the Python path's, no replica the view trusts, a refusal, a failure, a timeout) answers None, and the
client's Python path reads it with every rule of :mod:`freshroute.routing`.

Without the built extension the client reads by its Python path alone: ``pip install 'freshroute[client]'`` needs
no compiler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any

import orjson

from freshroute.bound import Bound
from freshroute.cluster_access import NodeAccess
from freshroute.client.lookup import Lookup
from freshroute.routing.compiled_view import policy_doc, snapshot_doc
from freshroute.routing.counts import Metrics
from freshroute.routing.policy import RoutingPolicy
from freshroute.routing.snapshot import Snapshot

log = logging.getLogger(__name__)

# DirectReads' flags (native/dataplane/src/direct.rs).
_SERVED, _FLUSH, _TIMER = 1, 2, 4


def compiled_reads(policy: RoutingPolicy, access: NodeAccess, metrics: Metrics | None) -> CompiledReads | None:
    """The compiled path's reads for a client started on the running loop, or None where it is not built."""
    try:
        from freshroute_dataplane import DirectReads
    except ImportError:  # not built here: the Python path reads alone
        return None
    engine = DirectReads(orjson.dumps(policy_doc(policy, access.secret)).decode(), Lookup)
    return CompiledReads(asyncio.get_running_loop(), engine, policy, access, metrics)


class CompiledReads:
    def __init__(self, loop: asyncio.AbstractEventLoop, engine: Any, policy: RoutingPolicy, access: NodeAccess,
                 metrics: Metrics | None) -> None:
        self._loop, self._engine, self._policy, self._access, self._metrics = loop, engine, policy, access, metrics
        self._connecting: dict[str, asyncio.Task[None]] = {}
        self._transports: dict[str, asyncio.Transport] = {}
        self._flush_due = False
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def update(self, snap: Snapshot) -> None:
        """A new routing view: pushed to the engine, and a connection opened to each read port it names and has not."""
        if self._closed:
            return
        self._engine.update(snapshot_doc(snap, self._policy))
        for node in snap.nodes.values():
            address = node.read_address
            if address and not self._engine.reaches(address) and address not in self._connecting:
                self._connecting[address] = self._loop.create_task(self._connect(address))

    async def _connect(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        host = host.strip("[]")
        context = self._access.ssl_context
        try:
            await asyncio.wait_for(self._loop.create_connection(
                lambda: _ReadPort(self, address), host, int(port), ssl=context,
                server_hostname=host if context is not None else None), self._policy.attempt_timeout_ms / 1000 * 4)
        except (OSError, asyncio.TimeoutError) as e:
            # Reads of its replicas go by the Python path meanwhile; the next view tries again.
            log.debug("compiled reads: no connection to %s: %s", address, e)
        finally:
            self._connecting.pop(address, None)

    def get(self, table: str, physical: str, key: str, bound: Bound) -> asyncio.Future[Lookup | None] | None:
        """The future of ``key`` of ``table`` (read as ``physical``, the version resolved): its Lookup, or None for
        the Python path; None at once when the Python path reads it. A future, not a coroutine: a get's every
        frame counts at 200 reads a second."""
        if self._closed or not bound.compiled or type(key) is not str:
            return None
        position = bound.min_position
        fut: asyncio.Future[Lookup | None] = self._loop.create_future()
        flags = self._engine.get(table, physical, key, bound.max_lag, bound.max_staleness_ms,
                                 None if position is None else (position.table, position.offsets), fut,
                                 self._loop.time())
        if not flags:
            return None
        if flags != _SERVED:
            self._after(flags)
        if self._metrics is not None:
            fut.add_done_callback(partial(self._count, time.perf_counter()))
        return fut

    def get_many(self, table: str, physical: str, keys: list[str],
                 bound: Bound) -> asyncio.Future[list[Lookup] | None] | None:
        """The future of ``keys`` of ``table`` as :meth:`get` reads one, in their order; None for the Python path
        (which also says what is wrong with a batch: too many keys, keys not text)."""
        if self._closed or not bound.compiled or not keys or len(keys) > self._policy.batch_max_keys:
            return None
        position = bound.min_position
        fut: asyncio.Future[list[Lookup] | None] = self._loop.create_future()
        flags = self._engine.get_many(table, physical, keys, bound.max_lag, bound.max_staleness_ms,
                                      None if position is None else (position.table, position.offsets), fut,
                                      self._loop.time())
        if not flags:
            return None
        if flags != _SERVED:
            self._after(flags)
        if self._metrics is not None:
            fut.add_done_callback(partial(self._count, time.perf_counter()))
        return fut

    def _count(self, started: float, fut: asyncio.Future[Any]) -> None:
        """A compiled read's answers in the client's metrics (those it gave the Python path count there)."""
        answers = None if fut.cancelled() else fut.result()
        if answers is None or self._metrics is None:
            return
        elapsed = time.perf_counter() - started
        for answer in answers if isinstance(answers, list) else (answers,):
            self._metrics.lookup("ok" if answer.found else "not_found", answer.role, elapsed)

    def _after(self, flags: int) -> None:
        if flags & _FLUSH and not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)
        if flags & _TIMER:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(self._engine.due, self._expire)

    def _flush(self) -> None:
        self._flush_due = False
        if not self._closed:
            self._engine.flush()

    def _expire(self) -> None:
        self._timer = None
        if not self._closed:
            self._after(self._engine.expire(self._loop.time()))

    def received(self, address: str, data: bytes) -> None:
        if self._closed:
            return
        flags = self._engine.received(address, data, self._loop.time())
        if flags:
            self._after(flags)

    def lost(self, address: str) -> None:
        self._transports.pop(address, None)
        if not self._closed:
            self._after(self._engine.lost(address, None, self._loop.time()))

    def connected(self, address: str, transport: asyncio.Transport) -> None:
        if self._closed:
            transport.abort()
            return
        self._transports[address] = transport
        self._engine.connected(address, transport)

    def close(self) -> None:
        """Every connection closed; a read in flight goes to the Python path at once. Called on the loop's thread."""
        if self._closed:
            return
        self._closed = True
        for task in self._connecting.values():
            task.cancel()
        now = self._loop.time()
        for address, transport in list(self._transports.items()):
            self._engine.lost(address, None, now)  # its reads resolve to None
            transport.abort()
        self._transports.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._engine = None  # its routing view and its transports go with it now, not with the client


class _ReadPort(asyncio.Protocol):
    """One store node's read port: bytes in and out for the engine."""

    def __init__(self, reads: CompiledReads, address: str) -> None:
        self._reads, self._address = reads, address

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._reads.connected(self._address, transport)  # type: ignore[arg-type]  # a stream transport

    def data_received(self, data: bytes) -> None:
        self._reads.received(self._address, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._reads.lost(self._address)

"""How the routing core talks to store nodes: the interface it reads through, and its asyncio implementation over the
read port's protocol (:mod:`freshroute.wire`).

Every read — a key, a batch's group of keys, a range (a key's windows, a page of a scan) —
travels over one long-lived read stream per node, results matched back by id. While few reads
are unanswered on a stream, a read leaves at once; past that, reads wait and leave together as
one ``ReadBatch`` when an earlier batch is answered. Under load a message each way thus carries
many lookups, while a lightly used stream adds no wait. If a stream breaks, every read in
flight on it fails as retryable — the router then asks another replica — and the next read
opens a new stream. It speaks TLS and presents the cluster secret as the :class:`NodeAccess`
given says.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from typing import Any, Awaitable, Mapping, NamedTuple, Protocol, TypeVar, cast

from google.protobuf.message import DecodeError

from freshroute.bound import Bound
from freshroute.cluster_access import NodeAccess
from freshroute.errors import ReplicaUnavailable
from freshroute.wire import (FrameError, FrameReader, GroupResult, RangeResult, ReadResult, RowsAsOf, VersionFilter,
                             WindowFilter, checked, frame, group_read, group_result, judged_alike, key_read, range_read,
                             range_result, results)
from proto import store_pb2

log = logging.getLogger("freshroute.routing.store")

# What a read stream's futures resolve to, by the kind of read sent.
_A = TypeVar("_A", ReadResult, GroupResult, RangeResult)


class StoreClient(Protocol):
    """Reads from store nodes. Transport failures raise :class:`ReplicaUnavailable`."""

    def read(self, address: str, table: str, partition: int, key: bytes, bound: Bound) -> Awaitable[ReadResult]:
        """One key read; the awaitable resolves when the node answers (no timeout of its own)."""
        ...

    def read_version(self, address: str, table: str, partition: int, key: bytes, as_of_ms: int,
                     bound: Bound) -> Awaitable[ReadResult]:
        """A versioned table's key as of ``as_of_ms``: its ``version`` valid then (None: it had none)."""
        ...

    def read_many(self, address: str, table: str, partition: int, keys: list[bytes],
                  bound: Bound) -> Awaitable[GroupResult]:
        """Several keys of one partition from one replica, sent together."""
        ...

    def read_range(self, address: str, table: str, partition: int, start: bytes, end: bytes, limit: int,
                   window: WindowFilter | VersionFilter | RowsAsOf | None, bound: Bound) -> Awaitable[RangeResult]:
        """Up to ``limit`` rows of ``[start, end)`` of one partition from one replica (windows passing ``window``)."""
        ...

    def track(self, read_addresses: Mapping[str, str | None]) -> None:
        """The nodes in the metadata: gRPC address → read port address (None: the node has none).

        Connections to nodes no longer named are dropped."""
        ...

    async def close(self) -> None: ...


class PendingGroup(NamedTuple):
    """A group read waiting in a stream's outbox."""

    id: int
    table: str
    partition: int
    keys: list[bytes]
    bound: Bound


# What waits in a stream's outbox.
_R = TypeVar("_R", store_pb2.KeyRead, PendingGroup, store_pb2.RangeRead)


def merged_groups(groups: list[PendingGroup]) -> tuple[list[store_pb2.GroupRead], dict[int, list[tuple[int, int]]]]:
    """Groups alike (same partition, same bound as the node checks it) as one message each, under the first one's id;
    and for each message, its groups' (id, number of keys) in the order their keys were joined.

    A node judges a group as one — every value, or one refusal — so groups it would judge alike
    lose nothing by travelling together, and a message costs a node far more than one more key in it.
    """
    alike: dict[tuple[str, int, tuple[object, ...] | None], list[PendingGroup]] = {}
    for g in groups:
        b, p = g.bound, g.partition
        same = (g.table, p, judged_alike(b, p))
        members = alike.get(same)
        if members is None:
            alike[same] = [g]
        else:
            members.append(g)
    messages, asked = [], {}
    for members in alike.values():
        first = members[0]
        keys = first.keys if len(members) == 1 else [k for g in members for k in g.keys]
        messages.append(group_read(first.id, first.table, first.partition, keys, first.bound))
        asked[first.id] = [(g.id, len(g.keys)) for g in members]
    return messages, asked


# ---- the asyncio client -------------------------------------------------------------------------------


class _ReadStream(asyncio.Protocol):
    """Reads and groups in flight on one connection to a node: an outbox flushed once per tick, and futures by id.

    Past a few unanswered reads, reads wait in the outbox and leave together when an answer
    arrives: under load batches grow by themselves (a message costs far more than one more
    read in it), while on a lightly used stream no read waits for another's answer. Every
    batch sent is answered by one batch, in order, holding one result per read and per group.
    """

    # Cancelled reads (timed out at the router) stay in ``pending`` until their result
    # arrives or the stream ends; past this many entries, done ones are swept.
    _SWEEP_AT = 4096

    # A node that does not answer a connect within this fails its reads as unavailable (the
    # router moves on to another replica) instead of holding them for the OS's connect timeout.
    _CONNECT_TIMEOUT_S = 2.0

    def __init__(self, address: str, read_address: str, max_unanswered: int, access: NodeAccess) -> None:
        self.address = address
        self.read_address = read_address
        self.broken = False
        self._pending: dict[int, asyncio.Future[Any]] = {}  # each of its read's kind (see _expect)
        self._outbox: list[store_pb2.KeyRead] = []
        self._groups: list[PendingGroup] = []
        self._ranges: list[store_pb2.RangeRead] = []
        self._unanswered = 0  # reads, groups and ranges sent whose results have not arrived yet
        # Each batch awaiting its answer: its reads, the groups each group message carries (by its id), and its
        # ranges' ids.
        self._sent: deque[tuple[int, dict[int, list[tuple[int, int]]], list[int]]] = deque()
        self._max_unanswered = max_unanswered
        # Kept: asyncio.get_running_loop() costs a getpid() system call per read on Python 3.11.
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._frames = FrameReader()
        self._flush_due = False
        self._secret = access.secret  # goes with the first batch, then is dropped
        host, port = read_address.rsplit(":", 1)
        self._connecting = asyncio.create_task(self._connect(host.strip("[]"), int(port), access),
                                               name=f"store-connect-{read_address}")

    def submit(self, read: store_pb2.KeyRead) -> asyncio.Future[ReadResult]:
        self._outbox.append(read)
        return self._expect(read.id)

    def submit_group(self, group: PendingGroup) -> asyncio.Future[GroupResult]:
        self._groups.append(group)
        return self._expect(group.id)

    def submit_range(self, read: store_pb2.RangeRead) -> asyncio.Future[RangeResult]:
        self._ranges.append(read)
        return self._expect(read.id)

    def _expect(self, read_id: int) -> asyncio.Future[Any]:
        """The future of read ``read_id``: it resolves to the answer of the kind of read sent under that id (a
        ReadResult, GroupResult or RangeResult, as the submit that asked for it declares)."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        if len(self._pending) >= self._SWEEP_AT:
            self._pending = {i: f for i, f in self._pending.items() if not f.done()}
        self._pending[read_id] = fut
        self._wake()
        return fut

    def _take(self) -> store_pb2.ReadBatch | None:
        """The next batch to send, if one may leave now."""
        if not (self._outbox or self._groups or self._ranges) or self._unanswered >= self._max_unanswered:
            return None
        reads, groups, ranges = self._live(self._outbox), self._live(self._groups), self._live(self._ranges)
        self._outbox, self._groups, self._ranges = [], [], []
        if not reads and not groups and not ranges:
            return None
        # Counted as issued, merged or not: the stream keeps its pace however its groups travel.
        self._unanswered += len(reads) + len(groups) + len(ranges)
        messages, asked = merged_groups(groups) if groups else ((), {})
        self._sent.append((len(reads), asked, [r.id for r in ranges]))
        return store_pb2.ReadBatch(reads=reads, groups=messages, ranges=ranges)

    def _live(self, reads: list[_R]) -> list[_R]:
        """The reads still awaited: one given up on while it waited (a timeout, a hedge lost) is not sent."""
        pending = self._pending
        live = []
        for read in reads:
            fut = pending.get(read.id)
            if fut is not None and not fut.done():
                live.append(read)
            else:
                pending.pop(read.id, None)
        return live

    def _answered(self, batch: store_pb2.ResultBatch) -> None:
        if batch.refused:
            self._break(ConnectionRefusedError(f"the node refused this peer: {batch.refused}"))
            return
        reads, asked, ranges = self._sent.popleft() if self._sent else (0, {}, [])
        self._unanswered -= reads + sum(map(len, asked.values())) + len(ranges)
        if self._outbox or self._groups or self._ranges:
            self._wake()
        pending = self._pending
        for read_id, result in results(batch):
            fut = pending.pop(read_id, None)
            if fut is not None and not fut.done():
                fut.set_result(result)
        for msg in batch.groups:
            members = asked.pop(msg.id, None)
            if members is not None:
                self._settle_groups(members, msg)
        for msg in batch.ranges:
            fut = pending.pop(msg.id, None)
            if fut is not None and not fut.done():
                fut.set_result(range_result(msg))
        answered = {msg.id for msg in batch.ranges} if ranges else ()
        unanswered = (g for members in asked.values() for g, _ in members)
        for read_id in (*unanswered, *(i for i in ranges if i not in answered)):
            # Left unanswered by a node that does not know group or range reads (older than this client).
            fut = pending.pop(read_id, None)
            if fut is not None and not fut.done():
                fut.set_exception(ReplicaUnavailable(f"store node {self.address}: no answer to a group or range read",
                                                     address=self.address))

    def _settle_groups(self, members: list[tuple[int, int]], msg: store_pb2.GroupResult) -> None:
        """Each group a group message carried gets its own keys' share of the answer (a refusal: the same one)."""
        pending = self._pending
        try:
            answer = checked(group_result(msg), sum(n for _, n in members), self.address)
        except ReplicaUnavailable as e:
            for read_id, _ in members:
                fut = pending.pop(read_id, None)
                if fut is not None and not fut.done():
                    fut.set_exception(e)
            return
        status, values, replica, message = answer
        at = 0
        for read_id, n in members:
            fut = pending.pop(read_id, None)
            if fut is not None and not fut.done():
                fut.set_result(GroupResult(status, values[at:at + n], replica, message) if values else answer)
            at += n

    def _break(self, cause: BaseException | None) -> None:
        if self.broken:
            return
        self.broken = True
        reason = _describe(cause)
        pending, self._pending = self._pending, {}
        self._outbox, self._groups, self._ranges = [], [], []
        self._sent.clear()
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ReplicaUnavailable(f"store node {self.address}: {reason}", address=self.address))
        self._disconnect()

    # ---- the connection ---------------------------------------------------------------------

    async def _connect(self, host: str, port: int, access: NodeAccess) -> None:
        loop = asyncio.get_running_loop()
        context = access.ssl_context
        try:
            await asyncio.wait_for(loop.create_connection(lambda: self, host, port, ssl=context,
                                                          server_hostname=host if context is not None else None),
                                   self._CONNECT_TIMEOUT_S)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 — refused, unreachable: the reads fail retryable
            self._break(e)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_connection makes a stream transport (plain or TLS): an asyncio.Transport
        transport = cast(asyncio.Transport, transport)
        if self.broken:
            transport.abort()
            return
        self._transport = transport
        self._flush()

    def _wake(self) -> None:
        """Have the outbox flushed after the callbacks already queued in this tick: reads issued together leave
        together."""
        if self._flush_due:
            return
        if not self._unanswered:
            # An idle stream sends at once (still connecting: connection_made sends): a lone read
            # waits for no loop iteration. Reads issued with it in this tick find one unanswered
            # and leave together after it.
            self._flush()
            return
        self._flush_due = True
        self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        transport = self._transport
        if transport is None or self.broken:
            return  # connecting: connection_made flushes
        batch = self._take()
        if batch is not None:
            if self._secret:
                batch.cluster_secret, self._secret = self._secret, ""
            transport.write(frame(batch.SerializeToString()))

    def data_received(self, data: bytes) -> None:
        try:
            for payload in self._frames.feed(data):
                self._answered(store_pb2.ResultBatch.FromString(payload))
        except (FrameError, DecodeError) as e:
            self._break(e)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._break(exc or ConnectionResetError("connection closed by the node"))

    def _disconnect(self) -> None:
        self._connecting.cancel()
        if self._transport is not None:
            self._transport.abort()
            self._transport = None

    async def close(self) -> None:
        self._break(None)
        await asyncio.gather(self._connecting, return_exceptions=True)


def _describe(cause: BaseException | None) -> str:
    if cause is None:
        return "read stream closed"
    if isinstance(cause, TimeoutError):
        return "no connection to its read port within the connect timeout"
    return f"{type(cause).__name__}: {cause}"


class _NoReadPort:
    """The stream of a node that advertises no read port: every read fails at once as unavailable."""

    broken = False
    read_address = None

    def __init__(self, address: str) -> None:
        self.address = address

    def _failed(self, read: object) -> asyncio.Future[_A]:
        fut: asyncio.Future[_A] = asyncio.get_running_loop().create_future()
        fut.set_exception(ReplicaUnavailable(f"store node {self.address} advertises no read port",
                                             address=self.address))
        return fut

    submit = submit_group = submit_range = _failed

    async def close(self) -> None:
        pass


class StoreNodeClient:
    """:class:`StoreClient` of real nodes: one read stream per node, on its read port; TLS and the cluster secret
    as ``access`` says."""

    # Reads that may be unanswered on a stream before more wait for an answer: at a few
    # hundred lookups per second none waits; under load reads still travel ~10 to a message.
    def __init__(self, max_unanswered_reads: int = 4, access: NodeAccess = NodeAccess()) -> None:
        self._max_unanswered = max_unanswered_reads
        self._access = access
        self._streams: dict[str, _ReadStream | _NoReadPort] = {}
        self._read_addresses: Mapping[str, str | None] = {}
        self._ids = itertools.count(1)
        self._closing: set[asyncio.Task[None]] = set()

    def _stream(self, address: str) -> _ReadStream | _NoReadPort:
        stream = self._streams.get(address)
        if stream is None or stream.broken:
            if stream is not None:
                self._close_later(stream)  # its reads have failed; its connection goes
            read_address = self._read_addresses.get(address)
            stream = self._streams[address] = _ReadStream(address, read_address, self._max_unanswered, self._access) \
                if read_address else _NoReadPort(address)
        return stream

    def read(self, address: str, table: str, partition: int, key: bytes, bound: Bound) -> asyncio.Future[ReadResult]:
        return self._stream(address).submit(key_read(next(self._ids), table, partition, key, bound))

    def read_version(self, address: str, table: str, partition: int, key: bytes, as_of_ms: int,
                     bound: Bound) -> asyncio.Future[ReadResult]:
        return self._stream(address).submit(key_read(next(self._ids), table, partition, key, bound, as_of_ms))

    def read_many(self, address: str, table: str, partition: int, keys: list[bytes],
                  bound: Bound) -> asyncio.Future[GroupResult]:
        return self._stream(address).submit_group(PendingGroup(next(self._ids), table, partition, keys, bound))

    def read_range(self, address: str, table: str, partition: int, start: bytes, end: bytes, limit: int,
                   window: WindowFilter | VersionFilter | RowsAsOf | None, bound: Bound) -> asyncio.Future[RangeResult]:
        return self._stream(address).submit_range(range_read(next(self._ids), table, partition, start, end, limit,
                                                             window, bound))

    def track(self, read_addresses: Mapping[str, str | None]) -> None:
        self._read_addresses = read_addresses
        for address, stream in list(self._streams.items()):
            # A node gone, or back with another read port: its connection goes.
            if read_addresses.get(address, "") != stream.read_address:
                del self._streams[address]
                self._close_later(stream)

    def _close_later(self, stream: _ReadStream | _NoReadPort) -> None:
        task = asyncio.get_running_loop().create_task(stream.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        streams, self._streams = list(self._streams.values()), {}
        await asyncio.gather(*(s.close() for s in streams), *self._closing, return_exceptions=True)

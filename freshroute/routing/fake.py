"""An in-memory :class:`StoreClient`: the routing core's test seam, and a way to measure the router alone.

Fake nodes host replicas with a lag of their choosing, enforce bounds the way a store node
does, and can be taken down or slowed down to exercise failover and hedging.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Mapping, TypedDict, Unpack

from freshroute import input_position
from freshroute.errors import ReplicaUnavailable
from freshroute.bound import Bound
from freshroute.lag import lag_offsets
from freshroute.metadata.assignment import Assignment
from freshroute.metadata.reports import NodeReport, ReplicaReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.tables import TableSpec

from freshroute.routing.snapshot import Snapshot, build_snapshot
from freshroute.windows import WATERMARK_KEY, live_starts, parse_watermark
from freshroute.wire import (GroupResult, RangeResult, ReadResult, ReadStatus, ReplicaStatus, RowsAsOf, Version,
                             VersionFilter, WindowFilter)


@dataclass
class FakeReplica:
    role: Role = Role.ACTIVE
    applied: int = 0
    end: int | None = 0  # None: not learnt yet
    staleness_ms: int = 0
    restoring: bool = False
    data: dict[bytes, bytes] = field(default_factory=dict)
    positions: dict[bytes, bytes] = field(default_factory=dict)  # a row's input position header, if it has one
    history: dict[bytes, dict[int, bytes | None]] = field(default_factory=dict)  # a versioned table's: time → value

    def versions(self, key: bytes, window: VersionFilter, limit: int) -> tuple[Version, ...]:
        """The key's versions valid at some time in the window, newest first, as a store node reads them."""
        at = self.history.get(key, {})
        times = sorted(at)
        every = [Version(t, n, at[t]) for t, n in zip(times, times[1:] + [None])]
        return tuple(v for v in reversed(every) if v.valid_from_ms < window.to_ms and
                     (v.valid_to_ms is None or v.valid_to_ms > window.from_ms))[:limit]

    def rows_at(self, start: bytes, end: bytes, at_ms: int, limit: int) -> list[tuple[bytes, Version]]:
        """The keys in ``[start, end)`` present at ``at_ms``, each with its version then, in byte order."""
        out = []
        for key in sorted(self.history):
            held = self.versions(key, VersionFilter(at_ms, at_ms + 1), 1)
            if start <= key and (not end or key < end) and held and held[0].value is not None:
                out.append((key, held[0]))
        return out[:limit]

    def unseen(self, partition: int, keys: list[bytes], bound: Bound) -> str | None:
        """Why these rows do not reflect the events ``bound`` is after yet, as a store node says (None: they do)."""
        after = bound.read_after
        if after is None or (after.after_offset(partition) and self.applied >= after.after_offset(partition)):
            return None
        if keys and all(input_position.reflects(self.positions.get(k), after.offsets) for k in keys):
            return None
        return f"the events named are not yet visible (applied offset {self.applied})"

    @property
    def state(self) -> ReplicaState:
        if self.restoring:
            return ReplicaState.RESTORING
        return ReplicaState.ACTIVE if self.role is Role.ACTIVE else ReplicaState.STANDBY

    @property
    def lag(self) -> int | None:
        return lag_offsets(self.applied, self.end)


class ReplicaFields(TypedDict, total=False):
    """A :class:`FakeReplica`'s fields, as :meth:`FakeNode.host` takes them."""

    role: Role
    applied: int
    end: int | None
    staleness_ms: int
    restoring: bool
    data: dict[bytes, bytes]
    positions: dict[bytes, bytes]
    history: dict[bytes, dict[int, bytes | None]]


@dataclass
class FakeNode:
    node: str
    address: str
    replicas: dict[tuple[str, int], FakeReplica] = field(default_factory=dict)
    read_address: str | None = None  # set when a test serves this node's answers on a real read port
    down: bool = False
    delay_s: float = 0.0
    reads: int = 0
    batches: int = 0
    scans: int = 0

    def host(self, table: str, partition: int, **kw: Unpack[ReplicaFields]) -> FakeReplica:
        replica = self.replicas[(table, partition)] = FakeReplica(**kw)
        return replica

    def report(self, heartbeat_ms: int) -> NodeReport:
        """The heartbeat this node would publish."""
        return NodeReport(self.node, self.address, heartbeat_ms, tuple(
            ReplicaReport(t, p, r.role, r.state, r.applied, r.end, r.staleness_ms)
            for (t, p), r in sorted(self.replicas.items())), read_address=self.read_address)

    def status(self, table: str, partition: int) -> ReplicaStatus:
        r = self.replicas[(table, partition)]
        return ReplicaStatus(self.node, r.role, r.state, r.applied, r.end, r.lag, r.staleness_ms)

    def refusal(self, table: str, partition: int, bound: Bound) -> str | None:
        r = self.replicas[(table, partition)]
        return bound.refusal(partition, r.applied, r.end, r.staleness_ms)

    def answer(self, table: str, partition: int, key: bytes, bound: Bound, as_of_ms: int | None = None) -> ReadResult:
        replica = self.replicas.get((table, partition))
        if replica is None:
            return ReadResult(ReadStatus.NOT_HOSTED, message=f"{self.node} does not host {table}/{partition}")
        status = self.status(table, partition)
        why = self.refusal(table, partition, bound)
        if why is not None:
            return ReadResult(ReadStatus.TOO_STALE, replica=status, message=why)
        unseen = replica.unseen(partition, [key], bound)
        if unseen is not None:
            return ReadResult(ReadStatus.NOT_YET_VISIBLE, replica=status, message=unseen)
        if as_of_ms is not None:
            found = replica.versions(key, VersionFilter(as_of_ms, as_of_ms + 1), 1)
            version = found[0] if found else None
            if version is None or version.value is None:
                return ReadResult(ReadStatus.NOT_FOUND, replica=status, version=version)
            return ReadResult(ReadStatus.OK, version.value, status, version=version)
        value = replica.data.get(key)
        if value is None:
            return ReadResult(ReadStatus.NOT_FOUND, replica=status)
        return ReadResult(ReadStatus.OK, value, status)


class InMemoryStoreClient:
    """A :class:`StoreClient` whose nodes live in a dict, keyed by address."""

    def __init__(self) -> None:
        self.nodes: dict[str, FakeNode] = {}

    def add_node(self, node: str, address: str | None = None) -> FakeNode:
        fake = self.nodes[address or f"{node}:0"] = FakeNode(node, address or f"{node}:0")
        return fake

    def reports(self, heartbeat_ms: int) -> list[NodeReport]:
        return [n.report(heartbeat_ms) for n in self.nodes.values()]

    def read(self, address: str, table: str, partition: int, key: bytes, bound: Bound) -> Awaitable[ReadResult]:
        node = self.nodes.get(address)
        if node is None or node.down or node.delay_s:
            return self._slow_read(node, address, table, partition, key, bound)
        node.reads += 1
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(node.answer(table, partition, key, bound))
        return fut

    def read_version(self, address: str, table: str, partition: int, key: bytes, as_of_ms: int,
                     bound: Bound) -> Awaitable[ReadResult]:
        node = self.nodes.get(address)
        if node is None or node.down or node.delay_s:
            return self._slow_read(node, address, table, partition, key, bound, as_of_ms)
        node.reads += 1
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(node.answer(table, partition, key, bound, as_of_ms))
        return fut

    async def _reachable(self, node: FakeNode | None, address: str) -> FakeNode:
        """The node after its delay; a node down (before or during the delay) fails as unreachable."""
        if node is None or node.down:
            raise ReplicaUnavailable(f"store node {address}: connection refused", address=address)
        if node.delay_s:
            await asyncio.sleep(node.delay_s)
            if node.down:
                raise ReplicaUnavailable(f"store node {address}: stream closed", address=address)
        return node

    async def _slow_read(self, node: FakeNode | None, address: str, table: str, partition: int, key: bytes,
                         bound: Bound, as_of_ms: int | None = None) -> ReadResult:
        if node is not None and not node.down:
            node.reads += 1
        node = await self._reachable(node, address)
        return node.answer(table, partition, key, bound, as_of_ms)

    async def read_many(self, address: str, table: str, partition: int, keys: list[bytes],
                        bound: Bound) -> GroupResult:
        node = self.nodes.get(address)
        if node is not None and not node.down:
            node.batches += 1
        node = await self._reachable(node, address)
        answers = [node.answer(table, partition, k, bound) for k in keys]
        for r in answers:
            if r.status is not ReadStatus.OK and r.status is not ReadStatus.NOT_FOUND:
                return GroupResult(r.status, [], r.replica, r.message)
        return GroupResult(ReadStatus.OK, [r.value for r in answers], answers[0].replica if answers else None)

    async def _admitted(self, address: str, table: str, partition: int,
                        bound: Bound) -> tuple[FakeReplica | None, ReplicaStatus | None, str | None]:
        """(replica, its status, why it refuses) of a range or scan read: no replica when the node hosts none."""
        node = self.nodes.get(address)
        if node is not None and not node.down:
            node.scans += 1
        node = await self._reachable(node, address)
        replica = node.replicas.get((table, partition))
        if replica is None:
            return None, None, None
        return replica, node.status(table, partition), node.refusal(table, partition, bound)

    async def read_range(self, address: str, table: str, partition: int, start: bytes, end: bytes, limit: int,
                         window: WindowFilter | VersionFilter | RowsAsOf | None, bound: Bound) -> RangeResult:
        replica, status, why = await self._admitted(address, table, partition, bound)
        if replica is None:
            return RangeResult(ReadStatus.NOT_HOSTED, [])
        if why is not None:
            return RangeResult(ReadStatus.TOO_STALE, [], status, why)
        unseen = replica.unseen(partition, [], bound)
        if unseen is not None:
            return RangeResult(ReadStatus.NOT_YET_VISIBLE, [], status, unseen)
        if isinstance(window, VersionFilter):
            return RangeResult(ReadStatus.OK, [], status, "", None, replica.versions(start, window, limit))
        if isinstance(window, RowsAsOf):
            rows = replica.rows_at(start, end, window.at_ms, limit)
            return RangeResult(ReadStatus.OK, [(k, v.value or b"") for k, v in rows], status, "", None,
                               tuple(v for _, v in rows))
        watermark = parse_watermark(replica.data.get(WATERMARK_KEY)) if window is not None else None
        keep = live_starts(*window, watermark) if window is not None else (lambda _k: True)
        keys = [k for k in sorted(replica.data) if k >= start and (not end or k < end) and keep(k)]
        return RangeResult(ReadStatus.OK, [(k, replica.data[k]) for k in keys[:limit]], status, "", watermark)

    def track(self, read_addresses: Mapping[str, str | None]) -> None:
        pass

    async def close(self) -> None:
        pass


def fake_snapshot(store: InMemoryStoreClient, tables: list[TableSpec], now: int, node_expiry_ms: int = 2000,
                  assignment: Assignment | None = None) -> Snapshot:
    """The snapshot the router would build from these fake nodes' heartbeats at ``now``."""
    return build_snapshot({t.name: t for t in tables}, store.reports(now), assignment, now, node_expiry_ms)

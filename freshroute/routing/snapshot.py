"""The router's view of the cluster: an immutable snapshot rebuilt whole from Redis, plus lag overlay.

The hot path only reads ``MetadataRefresher.current``; a refresh builds a new
:class:`Snapshot` and swaps it in with one assignment. Liveness is judged when a snapshot
is built, so while Redis is unreachable the last good snapshot keeps serving with the
liveness it had then — heartbeat ages that only grow because the router cannot read them
never mark a node dead. Per-request failures and the store nodes' own bound checks cover
what the frozen view misses.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Awaitable, Callable, Iterable, Mapping, Protocol

import orjson

from freshroute.freshness import (InputEnds, InputLag, InputMark, input_lag_at, lag_offsets, marks_from_json, now_ms,
                                  rejections_from_json)
from freshroute.heartbeats import Liveness, NodeFeed, Rejections
from freshroute.metadata import Assignment, Keys, NodePositions, NodeReport, ReplicaState, Role, TableSpec, text

log = logging.getLogger("freshroute.routing.snapshot")

TablePartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica of a table-partition as the router last learned it."""

    node: str
    address: str
    table: str
    partition: int
    role: Role
    # None: the assignment names this node but its heartbeat does not report the replica
    # (yet), so the replica cannot serve and is shown only for metadata.
    state: ReplicaState | None
    applied: int
    end: int | None  # None: the replica has not learnt its changelog's end offset yet
    staleness_ms: int
    observed_ms: int  # wall-clock ms at which applied/end/staleness were true
    alive: bool
    draining: bool = False
    # Where the node's positions published since its report land (shared by that report's
    # views), and this replica's place in them.
    moved: "MovedPositions | None" = field(default=None, compare=False)
    slot: int = field(default=0, compare=False)
    failure: str | None = None  # why it is FAILED

    @property
    def reported(self) -> bool:
        return self.state is not None

    def latest(self) -> tuple[int, int | None, int, int]:
        """(applied, end, staleness_ms, observed_ms): the report's, or the newer positions published since."""
        p = self.moved.latest if self.moved is not None else None
        if p is not None and p.observed_ms > self.observed_ms:
            applied, end, staleness_ms = p.replica(self.slot)
            return applied, end, staleness_ms, p.observed_ms
        return self.applied, self.end, self.staleness_ms, self.observed_ms

    @property
    def lag_offsets(self) -> int | None:
        return lag_offsets(self.applied, self.end)


class MovedPositions:
    """The latest positions a node published for one report: each refresh that reads newer ones
    swaps them in here, for every view of that report at once, rather than rebuilding the views."""

    __slots__ = ("latest",)

    def __init__(self) -> None:
        self.latest: NodePositions | None = None


@dataclass(frozen=True, slots=True)
class NodeView:
    """A store node as its report describes it, with liveness judged when the snapshot was built.

    It holds no heartbeat time, so that a node's view is rebuilt only when its report or
    liveness changes, not at every heartbeat (see :attr:`Snapshot.heard`)."""

    node: str
    address: str
    alive: bool
    draining: bool = False
    rack: str | None = None
    read_address: str | None = None  # the node's read port, if it offers one


_EMPTY: Mapping[Any, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Snapshot:
    """Tables, replicas per table-partition, nodes and assignment generation at one instant."""

    tables: Mapping[str, TableSpec] = field(default_factory=lambda: _EMPTY)
    replicas: Mapping[TablePartition, tuple[ReplicaView, ...]] = field(default_factory=lambda: _EMPTY)
    nodes: Mapping[str, NodeView] = field(default_factory=lambda: _EMPTY)
    assignment: Assignment | None = None
    built_ms: int = 0
    loaded: bool = False  # False until the first successful read from Redis
    heard: Mapping[str, int] = field(default_factory=lambda: _EMPTY)  # node → when last heard from (reader's clock)
    input_lag: Mapping[str, InputLag] = field(default_factory=lambda: _EMPTY)  # table → where its query is in its input
    input_ends: Mapping[str, InputEnds] = field(default_factory=lambda: _EMPTY)  # input topic → where it ends
    # table → where its changelog reflected its input (oldest first); input topic → partition → offset → why rejected
    input_marks: Mapping[str, tuple[InputMark, ...]] = field(default_factory=lambda: _EMPTY)
    rejected: Mapping[str, Mapping[int, Mapping[int, str]]] = field(default_factory=lambda: _EMPTY)
    assignor: str | None = None  # the node holding the assignor lease; None: nobody holds it

    def input_lag_at(self, table: str, now: int) -> tuple[int, int]:
        """(records, ms) the table's changelog is behind its input at ``now`` (:func:`freshroute.metadata.input_lag_at`)."""
        spec = self.tables.get(table)
        ends = self.input_ends.get(spec.input_topic) if spec is not None and spec.input_topic else None
        return input_lag_at(self.input_lag.get(table), ends, now)

    @property
    def generation(self) -> int | None:
        return self.assignment.generation if self.assignment else None

    def heartbeat_age_ms(self, node: str) -> int | None:
        """How long before this snapshot the node was last heard from."""
        heard = self.heard.get(node)
        return None if heard is None else max(0, self.built_ms - heard)

    def replicas_of(self, table: str, partition: int) -> tuple[ReplicaView, ...]:
        return self.replicas.get((table, partition), ())


def build_snapshot(tables: Mapping[str, TableSpec], reports: Iterable[NodeReport],
                   assignment: Assignment | None, now: int, node_expiry_ms: int) -> Snapshot:
    """Combine table specs, node heartbeats and the assignment into one snapshot, at once.

    Replicas come from what nodes report (role, state, lag); replicas the assignment names
    but no heartbeat reports are kept, unreported, for metadata. Liveness is decided here,
    from each report's own time.
    """
    by_id = {r.node_id: r for r in reports}
    heard = {n: r.heartbeat_ms for n, r in by_id.items()}
    return SnapshotBuilder(node_expiry_ms).build(tables, by_id, heard, assignment, now)[0]


class SnapshotBuilder:
    """Builds each snapshot from the last one, redoing only the partitions whose replicas changed.

    A partition's replicas change when a node hosting it sends a new report, lives or dies,
    or when the assignment places it elsewhere; at a thousand nodes a refresh in a quiet
    cluster rebuilds none of the ten thousand partitions' views.
    """

    def __init__(self, node_expiry_ms: int) -> None:
        self._expiry_ms = node_expiry_ms
        self._node_state: dict[str, tuple[NodeReport, bool]] = {}
        self._nodes: dict[str, NodeView] = {}
        self._nodes_view: Mapping[str, NodeView] = _EMPTY  # shared by snapshots until a node's view changes
        self._moved: dict[str, MovedPositions] = {}  # node → where its current report's views read newer positions
        self._views: dict[str, dict[TablePartition, ReplicaView]] = {}  # node → its reported replicas
        self._by_tp: dict[TablePartition, dict[str, ReplicaView]] = {}
        self._assignment: Assignment | None = None
        self._assigned: dict[str, list[TablePartition]] = {}  # node → partitions the assignment gives it
        self._replicas: Mapping[TablePartition, tuple[ReplicaView, ...]] = _EMPTY

    def build(self, tables: Mapping[str, TableSpec], reports: Mapping[str, NodeReport], heard: Mapping[str, int],
              assignment: Assignment | None, now: int, positions: Mapping[str, NodePositions] = _EMPTY,
              moved: Iterable[str] | None = None) -> tuple[Snapshot, set[TablePartition]]:
        """The snapshot, and the partitions whose replicas differ from the previous build's.

        ``positions`` are what nodes published since their reports: they move the views' lags
        without making anything dirty. ``moved`` names the nodes whose positions changed since
        the previous build (None: any may have)."""
        dirty: set[TablePartition] = set()
        replaced = []
        for node_id, report in reports.items():
            alive = now - heard.get(node_id, report.heartbeat_ms) <= self._expiry_ms
            state = self._node_state.get(node_id)
            if state is None or state[0] is not report or state[1] != alive:
                self._node_state[node_id] = (report, alive)
                self._nodes[node_id] = NodeView(node_id, report.address, alive, report.draining, report.rack,
                                                report.read_address)
                self._replace_views(node_id, report, alive, dirty)
                replaced.append(node_id)
        for node_id in [n for n in self._node_state if n not in reports]:
            del self._node_state[node_id], self._nodes[node_id]
            self._replace_views(node_id, None, False, dirty)
            replaced.append(node_id)
        for node_id in (positions if moved is None else [*moved, *replaced]):
            p = positions.get(node_id)
            cell = self._moved.get(node_id)
            if p is not None and cell is not None and p is not cell.latest and p.fits(self._node_state[node_id][0]):
                cell.latest = p
        if replaced:
            self._nodes_view = MappingProxyType(dict(self._nodes))
        if assignment is not self._assignment:
            self._reassign(assignment, dirty)
        if dirty:
            replicas = dict(self._replicas)
            for tp in dirty:
                views = self._assemble(tp, self._nodes)
                if views:
                    replicas[tp] = views
                else:
                    replicas.pop(tp, None)
            self._replicas = MappingProxyType(replicas)
        return Snapshot(MappingProxyType(dict(tables)), self._replicas, self._nodes_view, assignment, now, True,
                        MappingProxyType(dict(heard))), dirty

    def _replace_views(self, node_id: str, report: NodeReport | None, alive: bool,
                       dirty: set[TablePartition]) -> None:
        old = self._views.pop(node_id, {})
        self._moved.pop(node_id, None)
        for tp in old:
            by_node = self._by_tp[tp]
            del by_node[node_id]
            if not by_node:
                del self._by_tp[tp]
        dirty.update(old)
        # Placeholders for replicas assigned but not reported show the node's address and liveness.
        dirty.update(self._assigned.get(node_id, ()))
        if report is None:
            return
        views = {}
        self._moved[node_id] = moved = MovedPositions()  # build() fills it from what the feed holds
        for slot, r in enumerate(report.replicas):
            tp = (r.table, r.partition)
            views[tp] = view = ReplicaView(node_id, report.address, r.table, r.partition, r.role, r.state, r.applied,
                                           r.end, r.staleness_ms, report.heartbeat_ms, alive, report.draining,
                                           moved, slot, r.failure)
            self._by_tp.setdefault(tp, {})[node_id] = view
        self._views[node_id] = views
        dirty.update(views)

    def _reassign(self, assignment: Assignment | None, dirty: set[TablePartition]) -> None:
        before = self._assignment.replicas if self._assignment is not None else {}
        after = assignment.replicas if assignment is not None else {}
        for tp in before.keys() | after.keys():
            if before.get(tp) != after.get(tp):
                dirty.add(tp)
        self._assignment = assignment
        assigned: dict[str, list[TablePartition]] = {}
        for tp, node_ids in after.items():
            for node_id in node_ids:
                assigned.setdefault(node_id, []).append(tp)
        self._assigned = assigned

    def _assemble(self, tp: TablePartition, nodes: Mapping[str, NodeView]) -> tuple[ReplicaView, ...]:
        known = dict(self._by_tp.get(tp, {}))
        if self._assignment is not None:
            table, partition = tp
            for i, node_id in enumerate(self._assignment.replicas.get(tp, ())):
                if node_id in known:
                    continue
                node = nodes.get(node_id)
                known[node_id] = ReplicaView(node_id, node.address if node else "", table, partition,
                                             Role.ACTIVE if i == 0 else Role.STANDBY, None, 0, None, 0, 0,
                                             bool(node and node.alive), bool(node and node.draining))
        return tuple(sorted(known.values(), key=lambda v: (v.role is not Role.ACTIVE, v.node)))


@dataclass(slots=True)
class LagObservation:
    """A replica's lag as its own latest response reported it."""

    applied: int
    end: int | None
    staleness_ms: int
    observed_ms: int
    state: ReplicaState | None = None


class LagOverlay:
    """Per-replica lag piggy-backed on store responses; newer than heartbeats between refreshes."""

    def __init__(self) -> None:
        self._by_replica: dict[tuple[str, str, int], LagObservation] = {}

    def observe(self, node: str, table: str, partition: int, applied: int, end: int | None, staleness_ms: int,
                observed_ms: int, state: ReplicaState | None = None) -> None:
        self._by_replica[(node, table, partition)] = LagObservation(applied, end, staleness_ms, observed_ms, state)

    def get(self, node: str, table: str, partition: int) -> LagObservation | None:
        return self._by_replica.get((node, table, partition))

    def prune(self, older_than_ms: int) -> None:
        """Forget observations that every heartbeat since has superseded."""
        stale = [k for k, o in self._by_replica.items() if o.observed_ms < older_than_ms]
        for k in stale:
            del self._by_replica[k]

    def __len__(self) -> int:
        return len(self._by_replica)


class SnapshotSource(Protocol):
    """Anything that holds the current snapshot (the refresher, or a fixed one in tests)."""

    @property
    def current(self) -> Snapshot: ...

    @property
    def last_error(self) -> str | None:
        """Why the latest read of the metadata failed, naming where it was read from (None: it did not fail)."""


@dataclass
class FixedSnapshot:
    """A snapshot that never changes (tests, tools)."""

    current: Snapshot = field(default_factory=Snapshot)
    last_error: str | None = None


async def refresh_until(refresh_once: Callable[[], Awaitable[bool]], period_s: float, stop: asyncio.Event) -> None:
    """Call ``refresh_once`` every ``period_s`` until ``stop`` is set."""
    while not stop.is_set():
        await refresh_once()
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except asyncio.TimeoutError:
            pass


class MetadataRefresher:
    """Rebuilds the snapshot from Redis every ``refresh_ms`` and swaps it in atomically."""

    def __init__(self, redis: Any, namespace: str, refresh_ms: int, node_expiry_ms: int,
                 timeout_ms: int = 500, reset_grace_ms: int = 5000,
                 on_swap: Callable[[Snapshot], None] | None = None,
                 clock_ms: Callable[[], int] = now_ms, source: str = "Redis") -> None:
        self._redis = redis
        self._source = source  # where the metadata is read from, as errors name it
        self._keys = Keys(namespace)
        self._refresh_s = refresh_ms / 1000
        self._node_expiry_ms = node_expiry_ms
        self._timeout_s = timeout_ms / 1000
        self._reset_grace_ms = reset_grace_ms
        self._on_swap = on_swap
        self._clock_ms = clock_ms
        self.current = Snapshot()
        self.redis_ok = False
        self.last_ok_ms = 0
        self.last_error: str | None = None
        self._failing_since: int | None = None
        self._reset_since: int | None = None
        self._tables_lost = False
        self._vanished: dict[TablePartition, int] = {}
        self._warned: set[str] = set()
        self.feed = NodeFeed(Rejections("router metadata"), positions=True)
        self.liveness = Liveness()
        self._builder = SnapshotBuilder(node_expiry_ms)
        self._tables: tuple[bytes | None, dict[str, TableSpec]] | None = None
        self._assignment: tuple[bytes | None, Assignment | None] | None = None
        self.input_lag: Mapping[str, InputLag] = _EMPTY
        self.input_ends: Mapping[str, InputEnds] = _EMPTY
        self.input_marks: Mapping[str, tuple[InputMark, ...]] = _EMPTY
        self.rejected: Mapping[str, Mapping[int, Mapping[int, str]]] = _EMPTY
        self._kept: dict[tuple[str, Any], tuple[Any, Any]] = {}  # (what, name) → (raw, decoded) of the last refresh
        self.assignor: str | None = None

    async def refresh_once(self) -> bool:
        """Read Redis and swap in a new snapshot; on any failure keep the current one."""
        try:
            async with asyncio.timeout(self._timeout_s):
                tables, assignment = await self._read()
        except Exception as e:  # noqa: BLE001 — any Redis or decode failure means "keep the last view"
            self._note_failure(e)
            return False
        now = self._clock_ms()
        if self._failing_since is not None:
            log.warning("metadata: Redis reachable again after %d ms; serving a fresh snapshot",
                        now - self._failing_since)
            self._failing_since = None
        self.redis_ok = True
        self.last_ok_ms = now
        self.last_error = None
        prev = self.current
        if not tables and prev.tables:
            # No table is ever dropped by emptying the whole hash: an empty one means Redis
            # lost its state. Keep routing the tables we know until they are registered again.
            if not self._tables_lost:
                self._tables_lost = True
                log.warning("metadata: Redis has no table specs; keeping the %d known tables", len(prev.tables))
            tables = dict(prev.tables)
        else:
            self._tables_lost = False
        self.liveness.observe(self.feed.beats, now)
        if self._looks_reset(now):
            return False
        snap, dirty = self._builder.build(tables, self.feed.reports, self.liveness.heard, assignment, now,
                                          self.feed.positions, self.feed.take_moved())
        self.current = replace(self._carry_over(prev, snap, now, dirty), input_lag=self.input_lag,
                               input_ends=self.input_ends, input_marks=self.input_marks, rejected=self.rejected,
                               assignor=self.assignor)
        if self._on_swap is not None:
            self._on_swap(self.current)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh until ``stop`` is set."""
        await refresh_until(self.refresh_once, self._refresh_s, stop)

    async def _read(self) -> tuple[dict[str, TableSpec], Assignment | None]:
        """Bring the node feed up to date, the tables' input lag, who holds the assignor lease, and the tables and
        assignment when their version moved."""
        keys = self._keys
        pipe = self._redis.pipeline(transaction=False)
        n = self.feed.ask_changes(pipe, keys)
        pipe.mget([keys.tables_version, keys.assignment_version, keys.assignor])
        pipe.hgetall(keys.input_lag)
        pipe.hgetall(keys.input_ends)
        pipe.hgetall(keys.input_marks)
        pipe.hgetall(keys.input_rejected)
        replies = await pipe.execute()
        ids = self.feed.changed_ids(*replies[:n])
        tables_version, assignment_version, lease = replies[n]
        self.assignor = text(lease).rpartition(":")[0] or None if lease else None
        self.input_lag = self._decoded(InputLag.from_json, replies[n + 1], "input lag")
        self.input_ends = self._decoded(InputEnds.from_json, replies[n + 2], "input ends")
        self.input_marks = self._decoded(marks_from_json, replies[n + 3], "input marks")
        self.rejected = self._decoded(rejections_from_json, replies[n + 4], "rejected input")
        read_tables = self._tables is None or self._tables[0] != tables_version
        read_assignment = self._assignment is None or self._assignment[0] != assignment_version
        out: list[Any] = []
        pipe = self._redis.pipeline(transaction=False)
        n = self.feed.ask_reports(pipe, keys, ids)
        if read_tables:
            pipe.hgetall(keys.tables)
        if read_assignment:
            pipe.get(keys.assignment)
        if n or read_tables or read_assignment:
            out = await pipe.execute()
        if read_tables:
            raw_tables = out[n]
            tables: dict[str, TableSpec] = {}
            for name, raw in raw_tables.items():
                spec = self._decode(TableSpec.from_json, raw, "table spec")
                if spec is not None:
                    tables[text(name)] = spec
            self._tables = (tables_version, tables)
        if read_assignment:
            raw_assignment = out[-1]
            self._assignment = (assignment_version, self._decode(Assignment.from_json, raw_assignment, "assignment")
                                if raw_assignment else None)
        self.feed.absorb(ids, out[:n])
        assert self._tables is not None and self._assignment is not None
        return self._tables[1], self._assignment[1]

    def _looks_reset(self, now: int) -> bool:
        """True while a Redis that lost its state (restart) should not replace a populated view.

        Redis holds soft state only; after a restart it has no heartbeats until the store
        nodes republish (within a heartbeat interval). Every node vanishing at once is far
        more likely that than a whole cluster dying, so it is believed only once it has
        lasted the grace period.
        """
        prev = self.current
        emptied = prev.loaded and bool(prev.nodes) and not self.feed.reports
        if not emptied:
            self._reset_since = None
            return False
        if self._reset_since is None:
            self._reset_since = now
            log.warning("metadata: Redis has no node heartbeats; keeping the last snapshot for up to %d ms",
                        self._reset_grace_ms)
        return now - self._reset_since < self._reset_grace_ms

    def _carry_over(self, prev: Snapshot, snap: Snapshot, now: int, dirty: set[TablePartition]) -> Snapshot:
        """Keep a partition's last known replicas, for the grace period, when a refresh shows none.

        Heartbeats come back one node at a time after Redis lost them, so for a moment a
        partition can look unhosted although its replicas are serving. Routing to them costs
        at most a failed attempt (the store answers NOT_HOSTED if it really let go); routing
        nowhere fails the lookup for sure.
        """
        carried: dict[TablePartition, tuple[ReplicaView, ...]] = {}
        # Only a partition whose replicas changed in this build can have lost its last one.
        for tp in dirty.union(self._vanished):
            kept = tuple(v for v in prev.replicas_of(*tp) if v.reported)
            if not kept:
                continue
            if any(v.reported for v in snap.replicas_of(*tp)):
                self._vanished.pop(tp, None)
                continue
            # An emptied Redis already counted against the grace (see _looks_reset).
            since = self._vanished.setdefault(tp, self._reset_since if self._reset_since is not None else now)
            if now - since < self._reset_grace_ms:
                carried[tp] = kept
            else:
                del self._vanished[tp]
        for tp in [tp for tp in self._vanished if tp not in prev.replicas]:
            del self._vanished[tp]
        if not carried:
            return snap
        replicas = dict(snap.replicas)
        replicas.update(carried)
        nodes = dict(snap.nodes)
        for views in carried.values():
            for v in views:
                if v.node not in nodes and v.node in prev.nodes:
                    nodes[v.node] = prev.nodes[v.node]
        return replace(snap, replicas=MappingProxyType(replicas), nodes=MappingProxyType(nodes))

    def _decoded(self, fn: Callable[[Any], Any], entries: Mapping[Any, Any], what: str) -> Mapping[str, Any]:
        """A hash's entries decoded by name; malformed ones skipped. An entry read as it was last time is not decoded
        again (most entries change far less often than every refresh)."""
        out = {}
        for name, raw in entries.items():
            kept = self._kept.get((what, name))
            if kept is not None and kept[0] == raw:
                out[text(name)] = kept[1]
                continue
            value = self._decode(fn, raw, what)
            if len(self._kept) < 10_000:
                self._kept[(what, name)] = (raw, value)
            out[text(name)] = value
        return MappingProxyType({name: v for name, v in out.items() if v is not None})

    def _decode(self, fn: Callable[[Any], Any], raw: Any, what: str) -> Any:
        """Decode one entry; a malformed entry is skipped rather than failing the whole refresh."""
        try:
            return fn(raw)
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as e:
            # Warn once per distinct problem: the same bad entry is re-read every refresh.
            problem = f"{what}: {e}"
            if problem not in self._warned and len(self._warned) < 100:
                self._warned.add(problem)
                log.warning("metadata: skipping malformed %s", problem)
            return None

    def _note_failure(self, e: BaseException) -> None:
        self.redis_ok = False
        self.last_error = f"{self._source} does not answer ({type(e).__name__}: {e})"
        if self._failing_since is None:
            self._failing_since = self._clock_ms()
            # One line per outage, not per refresh.
            log.warning("metadata: cannot read Redis (%s: %s); serving the last snapshot with liveness frozen",
                        type(e).__name__, e)

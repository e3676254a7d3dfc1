"""The router's view of the cluster: an immutable snapshot rebuilt whole from Redis, plus lag overlay.

The hot path only reads ``current`` of a :class:`SnapshotSource` (:class:`freshroute.routing.refresher.MetadataRefresher`);
a refresh builds a new :class:`Snapshot` and swaps it in with one assignment. Liveness is judged when a snapshot is
built, so while Redis is unreachable the last good snapshot keeps serving with the liveness it had then — heartbeat
ages that only grow because the router cannot read them never mark a node dead. Per-request failures and the store
nodes' own bound checks cover what the frozen view misses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Protocol

from freshroute.lag import lag_offsets
from freshroute.metadata.assignment import Assignment
from freshroute.metadata.progress import input_lag_at, InputEnds, InputLag, InputMark
from freshroute.metadata.reports import NodePositions, NodeReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.errors import TableVersionNotFound
from freshroute.metadata.table_versions import VersionedTable, logical_of
from freshroute.metadata.tables import TableSpec

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


EMPTY: Mapping[Any, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Snapshot:
    """Tables, replicas per table-partition, nodes and assignment generation at one instant."""

    tables: Mapping[str, TableSpec] = field(default_factory=lambda: EMPTY)
    replicas: Mapping[TablePartition, tuple[ReplicaView, ...]] = field(default_factory=lambda: EMPTY)
    nodes: Mapping[str, NodeView] = field(default_factory=lambda: EMPTY)
    assignment: Assignment | None = None
    built_ms: int = 0
    loaded: bool = False  # False until the first successful read from Redis
    heard: Mapping[str, int] = field(default_factory=lambda: EMPTY)  # node → when last heard from (reader's clock)
    input_lag: Mapping[str, InputLag] = field(default_factory=lambda: EMPTY)  # table → where its query is in its input
    input_ends: Mapping[str, InputEnds] = field(default_factory=lambda: EMPTY)  # input topic → where it ends
    # table → where its changelog reflected its input (oldest first); input topic → partition → offset → why rejected
    input_marks: Mapping[str, tuple[InputMark, ...]] = field(default_factory=lambda: EMPTY)
    rejected: Mapping[str, Mapping[int, Mapping[int, str]]] = field(default_factory=lambda: EMPTY)
    assignor: str | None = None  # the node holding the assignor lease; None: nobody holds it
    versions: Mapping[str, VersionedTable] = field(default_factory=lambda: EMPTY)  # table → its versions, if recorded

    def input_lag_at(self, table: str, now: int) -> tuple[int, int]:
        """(records, ms) the table's changelog is behind its input at ``now``
        (:func:`freshroute.metadata.progress.input_lag_at`)."""
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

    def physical(self, name: str, version: int | None = None) -> str:
        """The table a read of table ``name`` reads: its served version's, or version ``version``'s
        (freshroute.metadata.table_versions); a named error for a version it cannot read. A version's own name
        (``t-v2``) reads that version, so a name resolved once resolves to itself."""
        record = self.versions.get(name)
        if record is None:
            if version is None or version == logical_of(name)[1]:
                return name
            raise TableVersionNotFound(f"table {name!r} has one version, not {version}", table=name,
                                       table_version=version)
        if version is None:
            return record.physical()
        record.readable(version)
        physical = record.physical(version)
        if physical not in self.tables:
            raise TableVersionNotFound(f"version {version} of table {name!r} is not placed on the store nodes yet",
                                       table=name, table_version=version)
        return physical


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
        self._nodes_view: Mapping[str, NodeView] = EMPTY  # shared by snapshots until a node's view changes
        self._moved: dict[str, MovedPositions] = {}  # node → where its current report's views read newer positions
        self._views: dict[str, dict[TablePartition, ReplicaView]] = {}  # node → its reported replicas
        self._by_tp: dict[TablePartition, dict[str, ReplicaView]] = {}
        self._assignment: Assignment | None = None
        self._assigned: dict[str, list[TablePartition]] = {}  # node → partitions the assignment gives it
        self._replicas: Mapping[TablePartition, tuple[ReplicaView, ...]] = EMPTY

    def build(self, tables: Mapping[str, TableSpec], reports: Mapping[str, NodeReport], heard: Mapping[str, int],
              assignment: Assignment | None, now: int, positions: Mapping[str, NodePositions] = EMPTY,
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

"""What the routing metadata says, for people and tools: a key's replicas, the tables, the cluster — each replica
with the lag routing would estimate for it."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Protocol

from freshroute.errors import ReplicaUnavailable
from freshroute.bound import NO_BOUND, Bound
from freshroute.lag import known_staleness
from freshroute.metadata.catch_up import version_figures
from freshroute.metadata.roles import Role
from freshroute.metadata.table_versions import served_specs
from freshroute.metadata.tables import TableSpec
from freshroute.routing.results import (ClusterView, HostedReplica, KeyLocation, MetadataHealth, NodeState,
                                        ReplicaInfo, TableInfo, TablePipeline, pipeline_doc)
from freshroute.routing.selection import Candidate, FreshestFirst
from freshroute.routing.snapshot import ReplicaView, Snapshot, SnapshotSource


class Tables(Protocol):
    """What the views ask of the routing core: its snapshot and its tables' partitions and bounds."""

    metadata: SnapshotSource

    def table(self, name: str) -> TableSpec: ...

    def partition_of(self, spec: TableSpec, key: str) -> int: ...

    def bound_for(self, spec: TableSpec, bound: Bound) -> Bound: ...

    def input_lag(self, table: str) -> tuple[int, int]: ...

    def not_loaded(self) -> str: ...


class MetadataViews:
    """The metadata views of a routing core (its snapshot, its lag estimates, its tables' bounds)."""

    def __init__(self, core: Tables, freshest: FreshestFirst, clock_ms: Callable[[], int]) -> None:
        self._core = core
        self._freshest = freshest
        self._clock_ms = clock_ms

    def replica_info(self, r: ReplicaView, now: int) -> ReplicaInfo:
        if r.reported:
            c, _ = self._freshest.estimate(r, now)
            lag, ms, applied, end = c.lag_offsets, known_staleness(c.staleness_ms), c.applied, c.end
        else:
            lag, ms, applied, end = None, None, 0, None
        return ReplicaInfo(r.node, r.address, r.role.value, r.state.value if r.state else None, r.alive,
                           lag, ms, applied, end, r.failure)

    def key_metadata(self, table: str, key: str) -> KeyLocation:
        """The key's partition, its active replica and its standbys, each with lag."""
        spec = self._core.table(table)
        partition = self._core.partition_of(spec, key)
        now = self._clock_ms()
        infos = [self.replica_info(r, now) for r in self._core.metadata.current.replicas_of(table, partition)]
        active = next((i for i in infos if i.role == Role.ACTIVE.value), None)
        return KeyLocation(table, key, partition, active, [i for i in infos if i is not active])

    def list_tables(self) -> list[TableInfo]:
        snap = self._core.metadata.current
        if not snap.loaded:
            raise ReplicaUnavailable(self._core.not_loaded())
        now = self._clock_ms()
        out = []
        for name, spec in served_specs(snap.tables, snap.versions, lambda s, n: replace(s, name=n)).items():
            b = self._core.bound_for(spec, NO_BOUND)
            record = snap.versions.get(name)
            served = record.physical() if record is not None else name
            # Each version's input lag, and the building one's progress and estimate (freshroute.metadata.catch_up).
            lags, ways = ({}, {}) if record is None else \
                version_figures(record, snap.tables, snap.input_lag, snap.input_ends, now)
            out.append(TableInfo(spec, b.max_lag, b.max_staleness_ms, self._core.input_lag(served),
                                 snap.input_lag.get(served), record, lags, ways))
        return out

    def cluster(self) -> ClusterView:
        """Nodes with liveness and per-replica lag, the assignment, each table's pipeline, and how old this view is."""
        snap = self._core.metadata.current
        now = self._clock_ms()
        by_node: dict[str, list[HostedReplica]] = {}
        for (table, partition), replicas in sorted(snap.replicas.items()):
            for r in replicas:
                by_node.setdefault(r.node, []).append(HostedReplica(table, partition, self.replica_info(r, now)))
        nodes = []
        for node_id in sorted(set(snap.nodes) | set(by_node)):
            n = snap.nodes.get(node_id)
            nodes.append(NodeState(node_id, n.address if n else "", n.read_address if n else None, bool(n and n.alive),
                                   snap.heartbeat_age_ms(node_id) if n else None, bool(n and n.draining),
                                   by_node.get(node_id, [])))
        assignment = None
        if snap.assignment is not None:
            assignment = [(t, p, tuple(ns)) for (t, p), ns in sorted(snap.assignment.replicas.items())]
        pipelines = [TablePipeline(name, **pipeline_doc(snap.input_lag.get(name), now),
                                   input_lag=snap.input_lag_at(name, now)) for name in sorted(snap.tables)]
        return ClusterView(nodes, snap.generation, assignment, pipelines, self.metadata_health(snap, now))

    def metadata_health(self, snap: Snapshot, now: int) -> MetadataHealth:
        """How old ``snap`` is at ``now``, and whether Redis answered the last read."""
        return MetadataHealth(snap.loaded, max(0, now - snap.built_ms) if snap.loaded else None,
                              bool(getattr(self._core.metadata, "redis_ok", snap.loaded)))

    def estimate(self, r: ReplicaView, now: int) -> Candidate:
        """A replica's best-known lag now (heartbeat or a newer response)."""
        return self._freshest.estimate(r, now)[0]

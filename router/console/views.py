"""What the operator's console reads besides the public API: the cluster summed up per node and per table (one
answer that grows with the nodes, not the replicas), and one table's partitions with every replica, a page of
partitions at a time.

The summary is one pass over the snapshot's replicas, made on a worker thread (the snapshot is immutable) so that
lookups on the event loop wait for it no longer than an interpreter switch, and shared by every console that asks
within :data:`SUMMARY_MAX_AGE_MS` — or within :data:`BUILD_SHARE` times its last build's duration, whichever is
longer, so that however large the cluster, summaries take at most about 1/BUILD_SHARE of a core.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import orjson

from freshroute.errors import InvalidArgument
from freshroute.bound import parse_limit
from freshroute.lag import known_staleness, now_ms
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.table_versions import named
from freshroute.routing.core import RoutingCore
from freshroute.routing.results import ReplicaInfo, input_lag_doc, pipeline_doc
from freshroute.routing.snapshot import Snapshot

SUMMARY_MAX_AGE_MS = 500
BUILD_SHARE = 20
RESTORING_SHOWN = 20  # per table: the restores in progress the summary lists (it counts them all)
GRID_DEFAULT_LIMIT = 512
GRID_MAX_LIMIT = 4096

_ACTIVE, _RESTORING, _FAILED = Role.ACTIVE, ReplicaState.RESTORING, ReplicaState.FAILED


def replica_kind(state: ReplicaState | str | None, role: Role | str) -> str:
    """What a replica is doing, as the console colours it: ``active``, ``standby``, ``restoring``, ``failed`` (its
    store cannot be written), or ``pending`` (assigned, not reported by its node yet)."""
    if state is None:
        return "pending"
    if state == _RESTORING:
        return "restoring"
    if state == _FAILED:
        return "failed"
    return "active" if role == _ACTIVE else "standby"


def replica_doc(info: ReplicaInfo) -> dict[str, Any]:
    return {**info.to_dict(), "kind": replica_kind(info.state, info.role)}


class _Worst:
    """The largest known lag among some replicas (None while none is known)."""

    __slots__ = ("offsets", "ms")

    def __init__(self) -> None:
        self.offsets: int | None = None
        self.ms: int | None = None

    def take(self, offsets: int | None, ms: int | None) -> None:
        if offsets is not None and (self.offsets is None or offsets > self.offsets):
            self.offsets = offsets
        if ms is not None and (self.ms is None or ms > self.ms):
            self.ms = ms


class _NodeSum(_Worst):
    __slots__ = ("replicas", "actives", "restoring")

    def __init__(self) -> None:
        super().__init__()
        self.replicas = self.actives = self.restoring = 0


class _TableSum(_Worst):
    __slots__ = ("kinds", "hosted", "unserved", "lag_unknown", "restores")

    def __init__(self) -> None:
        super().__init__()
        self.kinds: dict[str, int] = {}
        self.hosted = self.unserved = self.lag_unknown = 0
        self.restores: list[dict[str, Any]] = []


def summarise(core: RoutingCore, snap: Snapshot, now: int) -> dict[str, Any]:
    """The cluster per node and per table at ``now``: replicas by kind, the worst lag, the restores in progress.

    A replica's lag is its view's (heartbeat or newer positions), aged as routing ages it: one that was behind keeps
    getting staler until it reports again."""
    node_sums = {node_id: _NodeSum() for node_id in snap.nodes}
    table_sums = {name: _TableSum() for name in snap.tables}
    for (table, partition), replicas in snap.replicas.items():
        t = table_sums.get(table)
        if t is None or partition >= snap.tables[table].partitions:
            continue
        t.hosted += 1
        serving = False
        for r in replicas:
            state, n = r.state, node_sums.get(r.node)
            kind = replica_kind(state, r.role)
            # A replica on a node known dead is dead; one assigned to a node never heard from is pending.
            counted = "dead" if not r.alive and n is not None else kind
            t.kinds[counted] = t.kinds.get(counted, 0) + 1
            if n is not None:
                n.replicas += 1
                n.actives += kind == "active"
                n.restoring += kind == "restoring"
            if not r.alive or state is None:
                continue
            c = core.views.estimate(r, now)  # as routing and /v1/cluster see the replica
            applied, end, lag, staleness = c.applied, c.end, c.lag_offsets, known_staleness(c.staleness_ms)
            if state == _RESTORING:
                t.restores.append({"partition": partition, "node": r.node, "applied_offset": applied,
                                   "end_offset": end})
            else:
                serving = True
            t.lag_unknown += lag is None or staleness is None
            t.take(lag, staleness)
            if n is not None:
                n.take(lag, staleness)
        t.unserved += not serving
    nodes = []
    for node_id in sorted(node_sums):
        view, n = snap.nodes[node_id], node_sums[node_id]
        nodes.append({"node": node_id, "address": view.address, "read_address": view.read_address,
                      "alive": view.alive, "heartbeat_age_ms": snap.heartbeat_age_ms(node_id),
                      "draining": view.draining, "replicas": n.replicas, "actives": n.actives,
                      "restoring": n.restoring, "max_lag_offsets": n.offsets, "max_lag_ms": n.ms})
    infos = {t.spec.name: t for t in core.views.list_tables()} if snap.loaded else {}
    tables = []
    for name in sorted(table_sums):
        t, lag = table_sums[name], snap.input_lag.get(name)
        restores = sorted(t.restores, key=lambda r: (r["partition"], r["node"]))
        # A version's own table (NAME-vN, its replicas in the grid) says whose version it is; its table's row lists
        # it with its state, input lag, progress and estimate.
        doc = infos[name].to_dict(now) if name in infos else {
            "name": name, "pipeline": pipeline_doc(lag, now), "input_lag": input_lag_doc(snap.input_lag_at(name, now)),
            **named(name)}
        tables.append({**doc, "replica_kinds": t.kinds, "max_lag_offsets": t.offsets, "max_lag_ms": t.ms,
                       "lag_unknown": t.lag_unknown,
                       "unserved_partitions": t.unserved + snap.tables[name].partitions - t.hosted,
                       "input_offset": sum(lag.offsets.values()) if lag is not None and lag.offsets else None,
                       "restoring": restores[:RESTORING_SHOWN], "restoring_total": len(restores)})
    return {"at_ms": now, "nodes": nodes, "tables": tables, "assignor": snap.assignor,
            "assignment_generation": snap.generation, "metadata": core.views.metadata_health(snap, now).to_dict()}


class ClusterViews:
    """The console's two views over one router's routing core."""

    def __init__(self, core: RoutingCore, clock_ms: Callable[[], int] = now_ms) -> None:
        self._core = core
        self._clock_ms = clock_ms
        self._summary: tuple[int, bytes] | None = None
        self._building: asyncio.Future[bytes] | None = None
        self.max_age_ms = SUMMARY_MAX_AGE_MS

    async def summary(self) -> bytes:
        """The cluster per node and per table, as JSON: the last one if it is recent enough, else a new one (one
        build at a time, shared by everyone asking meanwhile)."""
        now = self._clock_ms()
        cached = self._summary
        if cached is not None and 0 <= now - cached[0] < self.max_age_ms:
            return cached[1]
        if self._building is None:
            self._building = asyncio.ensure_future(self._build(now))
        return await asyncio.shield(self._building)

    async def _build(self, now: int) -> bytes:
        try:
            snap = self._core.metadata.current
            started = time.perf_counter()
            body = await asyncio.to_thread(lambda: orjson.dumps(summarise(self._core, snap, now)))
            took_ms = (time.perf_counter() - started) * 1000
            self.max_age_ms = max(SUMMARY_MAX_AGE_MS, int(took_ms * BUILD_SHARE))
            self._summary = (now, body)
            return body
        finally:
            self._building = None

    def table_replicas(self, table: str, query: dict[str, str]) -> dict[str, Any]:
        """One table's partitions from ``from`` (default 0), ``limit`` of them, each with every replica."""
        spec = self._core.table(table)
        start = parse_limit("from", query.get("from")) or 0
        limit = parse_limit("limit", query.get("limit")) or GRID_DEFAULT_LIMIT
        if limit > GRID_MAX_LIMIT:
            raise InvalidArgument(f"limit must be at most {GRID_MAX_LIMIT}", field="limit")
        now, snap = self._clock_ms(), self._core.metadata.current
        end = min(spec.partitions, start + limit)
        partitions = [{"partition": p, "replicas": [replica_doc(self._core.views.replica_info(r, now))
                                                    for r in snap.replicas_of(table, p)]} for p in range(start, end)]
        return {"table": table, "partitions_total": spec.partitions, "partitions": partitions,
                "next_from": end if end < spec.partitions else None, "at_ms": now}

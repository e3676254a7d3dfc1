"""What the operator's console reads besides the public API: the cluster summed up per node and per table (one small
answer however large the cluster), and one table's partitions with every replica, a page of partitions at a time.

The summary is built from the router's snapshot at most once per :data:`SUMMARY_MAX_AGE_MS` whatever the number of
consoles polling it, so consoles cannot add work that lookups would notice; the metadata it sums up is itself
refreshed about as often.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import orjson

from freshroute.errors import InvalidArgument
from freshroute.metadata import ReplicaState, Role, now_ms
from freshroute.routing.bound import parse_limit
from freshroute.routing.core import RoutingCore
from freshroute.routing.results import ReplicaInfo, pipeline_doc

SUMMARY_MAX_AGE_MS = 500
RESTORING_SHOWN = 20  # per table: the restores in progress the summary lists (it counts them all)
GRID_DEFAULT_LIMIT = 512
GRID_MAX_LIMIT = 4096


def replica_kind(info: ReplicaInfo) -> str:
    """What a replica is doing, as the console colours it: ``active``, ``standby``, ``restoring``, or ``pending``
    (assigned, not reported by its node yet)."""
    if info.state is None:
        return "pending"
    if info.state == ReplicaState.RESTORING.value:
        return "restoring"
    return "active" if info.role == Role.ACTIVE.value else "standby"


def replica_doc(info: ReplicaInfo) -> dict[str, Any]:
    return {**info.to_dict(), "kind": replica_kind(info)}


class ClusterViews:
    """The console's two views over one router's routing core."""

    def __init__(self, core: RoutingCore, clock_ms: Callable[[], int] = now_ms) -> None:
        self._core = core
        self._clock_ms = clock_ms
        self._summary: tuple[int, bytes] | None = None

    def summary(self) -> bytes:
        """The cluster per node and per table, as JSON (cached for :data:`SUMMARY_MAX_AGE_MS`)."""
        now = self._clock_ms()
        cached = self._summary
        if cached is None or not 0 <= now - cached[0] < SUMMARY_MAX_AGE_MS:
            cached = self._summary = (now, orjson.dumps(self._summarise(now)))
        return cached[1]

    def _summarise(self, now: int) -> dict[str, Any]:
        core, snap = self._core, self._core.metadata.current
        nodes = {node_id: {"node": node_id, "address": n.address, "read_address": n.read_address, "alive": n.alive,
                           "heartbeat_age_ms": snap.heartbeat_age_ms(node_id), "draining": n.draining,
                           "replicas": 0, "actives": 0, "restoring": 0, "max_lag_offsets": None, "max_lag_ms": None}
                 for node_id, n in snap.nodes.items()}
        kinds: dict[str, Counter] = {name: Counter() for name in snap.tables}
        worst: dict[str, dict[str, Any]] = {name: {"max_lag_offsets": None, "max_lag_ms": None, "lag_unknown": 0,
                                                   "unserved_partitions": 0, "hosted_partitions": 0, "restoring": []}
                                       for name in snap.tables}
        for (table, partition), replicas in snap.replicas.items():
            if table not in worst or partition >= snap.tables[table].partitions:
                continue
            worst[table]["hosted_partitions"] += 1
            serving = False
            for r in replicas:
                info = core.replica_info(r, now)
                kind = replica_kind(info)
                # A replica on a node known dead is dead; one assigned to a node never heard from is pending.
                kinds[table]["dead" if not info.alive and info.node in snap.nodes else kind] += 1
                node = nodes.get(info.node)
                if node is not None:
                    node["replicas"] += 1
                    node["actives"] += kind == "active"
                    node["restoring"] += kind == "restoring"
                if not info.alive or kind == "pending":
                    continue
                serving = serving or kind in ("active", "standby")
                if kind == "restoring":
                    worst[table]["restoring"].append({"partition": partition, "node": info.node,
                                                      "applied_offset": info.applied, "end_offset": info.end})
                if info.lag_offsets is None:
                    worst[table]["lag_unknown"] += 1
                for doc in (worst[table], node):
                    if doc is not None:
                        _raise(doc, "max_lag_offsets", info.lag_offsets)
                        _raise(doc, "max_lag_ms", info.lag_ms)
            worst[table]["unserved_partitions"] += not serving
        tables = []
        infos = {t.spec.name: t for t in core.list_tables()} if snap.loaded else {}
        for name in sorted(snap.tables):
            w = worst[name]
            restoring = sorted(w.pop("restoring"), key=lambda r: (r["partition"], r["node"]))
            w["unserved_partitions"] += snap.tables[name].partitions - w.pop("hosted_partitions")
            lag = snap.input_lag.get(name)
            doc = infos[name].to_dict(now) if name in infos else {"name": name, "pipeline": pipeline_doc(lag, now)}
            tables.append({**doc, **w, "replica_kinds": dict(kinds[name]),
                           "input_offset": sum(lag.offsets.values()) if lag is not None and lag.offsets else None,
                           "restoring": restoring[:RESTORING_SHOWN], "restoring_total": len(restoring)})
        return {"at_ms": now, "nodes": [nodes[n] for n in sorted(nodes)], "tables": tables,
                "assignor": snap.assignor, "assignment_generation": snap.generation,
                "metadata": {"loaded": snap.loaded, "age_ms": max(0, now - snap.built_ms) if snap.loaded else None,
                             "redis_ok": bool(getattr(core.metadata, "redis_ok", snap.loaded))}}

    def table_replicas(self, table: str, query: dict[str, str]) -> dict[str, Any]:
        """One table's partitions from ``from`` (default 0), ``limit`` of them, each with every replica."""
        spec = self._core.table(table)
        start = parse_limit("from", query.get("from")) or 0
        limit = parse_limit("limit", query.get("limit")) or GRID_DEFAULT_LIMIT
        if limit > GRID_MAX_LIMIT:
            raise InvalidArgument(f"limit must be at most {GRID_MAX_LIMIT}", field="limit")
        now, snap = self._clock_ms(), self._core.metadata.current
        end = min(spec.partitions, start + limit)
        partitions = [{"partition": p, "replicas": [replica_doc(self._core.replica_info(r, now))
                                                    for r in snap.replicas_of(table, p)]} for p in range(start, end)]
        return {"table": table, "partitions_total": spec.partitions, "partitions": partitions,
                "next_from": end if end < spec.partitions else None, "at_ms": now}


def _raise(doc: dict[str, Any], name: str, value: int | None) -> None:
    if value is not None and (doc[name] is None or value > doc[name]):
        doc[name] = value

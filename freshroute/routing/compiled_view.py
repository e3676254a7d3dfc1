"""The routing view and policy as the compiled read paths (``native/dataplane``) read them: the router's front and the
client's direct reads are pushed the same documents, so they route by the same view as the Python path beside them."""

from __future__ import annotations

from typing import Any

import orjson

from freshroute.metadata.table_versions import logical_of
from freshroute.routing.policy import RoutingPolicy
from freshroute.routing.snapshot import Snapshot


def policy_doc(policy: RoutingPolicy, cluster_secret: str) -> dict[str, Any]:
    """The routing policy's settings a compiled path follows, and the cluster secret it presents to store nodes."""
    return {
        "attempt_timeout_ms": policy.attempt_timeout_ms, "request_timeout_ms": policy.request_timeout_ms,
        "hedge": policy.hedge,
        "hedge_quantile": policy.hedge_quantile, "hedge_min_ms": float(policy.hedge_min_ms),
        "hedge_budget": policy.hedge_budget, "max_windows": policy.max_windows,
        "freshness_tolerance_offsets": policy.freshness_tolerance_offsets,
        "freshness_tolerance_ms": policy.freshness_tolerance_ms, "view_trust_ms": policy.view_trust_ms,
        "failure_backoff_ms": policy.failure_backoff_ms, "node_expiry_ms": policy.node_expiry_ms,
        "cluster_secret": cluster_secret,
    }


def snapshot_doc(snap: Snapshot, policy: RoutingPolicy) -> bytes:
    """The routing view the compiled path reads, as JSON: each table's partitions, whether the path serves its key
    lookups, or its keys' windows (the window's size, slide and retention), how long it keeps versions (for reads as
    of a time), its value format, its default bound (as
    :meth:`RoutingCore.bound_for` fills it in), its input lag, the table version it serves (which every answer
    names) and that version's own table (``physical``: what store reads and positions name), its input and changelog
    topics, its input marks and the input records the pipeline rejected (what a read after a write token needs); each
    replica's latest known lag (the heartbeat's, or the positions published since).

    A table is listed by its name as the version its record serves (:meth:`Snapshot.physical`): that version's own
    table's spec, input lag and replicas (listed under the table's name, which the path reads them by). A version's
    own name (``t-v2``) is left out, served or not, with the replicas of every version not served: the Python path
    answers a read of it, and a read naming a version by number."""
    tables: dict[str, dict[str, Any]] = {}
    served: dict[str, str] = {}  # the physical table served → the table whose reads it answers
    for name in dict.fromkeys(logical_of(n)[0] for n in snap.tables):
        record = snap.versions.get(name)
        physical = record.physical() if record is not None else name
        spec = snap.tables.get(physical)
        if spec is None:
            continue  # a version not placed yet, or a table retired: the Python path says which
        served[physical] = name
        override = policy.table_bounds.get(name)
        max_lag, max_ms = ((override.max_lag, override.max_staleness_ms) if override is not None
                           else (spec.default_max_lag, spec.default_max_staleness_ms))
        lag = snap.input_lag.get(physical)
        ends = snap.input_ends.get(spec.input_topic) if spec.input_topic else None
        w = spec.window if spec.key_format == "string" else None
        tables[name] = {
            "partitions": spec.partitions, "served": spec.window is None and spec.key_format == "string",
            "window": None if w is None else {"size_ms": w.size_ms, "slide_ms": w.slide_ms,
                                              "retention_ms": w.retention_ms},
            "history_retention_ms": spec.history_retention_ms if spec.versioned else None,
            "value_format": spec.value_format, "max_lag": max_lag, "max_staleness_ms": max_ms,
            "input_lag": None if lag is None else {"records": lag.records, "caught_up_ms": lag.caught_up_ms,
                                                   "at_ms": lag.at_ms, "alive_ms": lag.alive_ms,
                                                   "offsets": lag.offsets},
            "input_ends": None if ends is None else {"at_ms": ends.at_ms, "ends": ends.ends},
            "version": record.serving if record is not None else 1, "physical": physical,
            "input_topic": spec.input_topic, "changelog_topic": spec.topic,
            "marks": [(m.input, m.changelog) for m in snap.input_marks.get(physical, ())],
            "rejected": {p: list(rs) for p, rs in snap.rejected.get(spec.input_topic or "", {}).items()}}
    nodes = snap.nodes
    replicas = []
    for (table, partition), views in snap.replicas.items():
        read_as = served.get(table)
        if read_as is None:
            continue
        row = []
        for r in views:
            applied, end, staleness_ms, observed_ms = r.latest()
            node = nodes.get(r.node)
            row.append((r.node, node.read_address if node is not None else None, r.role.value,
                        r.state.value if r.state is not None else None, applied, end, staleness_ms, observed_ms,
                        r.alive, r.draining))
        replicas.append((read_as, partition, row))
    return orjson.dumps({"tables": tables, "replicas": replicas, "built_ms": snap.built_ms},
                        option=orjson.OPT_NON_STR_KEYS)

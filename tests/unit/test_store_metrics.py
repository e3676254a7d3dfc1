"""The store node's Prometheus collector: every hosted replica's lag, progress and counters at scrape time."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from freshroute.metadata.roles import Role
from store_node.replica import LagSnapshot
from store_node.metrics import ReplicaCollector
from store_node.replica import ReplicaCounters


def replica(table: str, partition: int, role: Role, applied: int, end: int | None, staleness_ms: int,
            restoring: bool, counters: ReplicaCounters, versioned: bool = False):
    snap = LagSnapshot(applied, end, staleness_ms, caught_up=end == applied)
    return SimpleNamespace(table=table, partition=partition, role=role, restoring=restoring, counters=counters,
                           snapshot=lambda now: snap, spec=SimpleNamespace(versioned=versioned))


def test_a_scrape_reports_each_replica_by_table_partition_and_role():
    hosted = {("t", 0): replica("t", 0, Role.ACTIVE, 90, 100, 250, False, ReplicaCounters(records_applied=90,
                                                                                           records_skipped=2,
                                                                                           versions_expired=7),
                                    versioned=True),
              ("t", 1): replica("t", 1, Role.STANDBY, 5, None, 0, True, ReplicaCounters(restores=1))}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReplicaCollector("node-1", lambda: hosted, lambda: 1_000))
    text = generate_latest(registry).decode()
    for line in ['freshroute_replica_lag_offsets{partition="0",role="active",table="t"} 10.0',
                 'freshroute_replica_lag_ms{partition="0",role="active",table="t"} 250.0',
                 'freshroute_replica_applied_offset{partition="1",role="standby",table="t"} 5.0',
                 'freshroute_replica_restoring{partition="1",role="standby",table="t"} 1.0',
                 'freshroute_replica_records_applied_total{partition="0",role="active",table="t"} 90.0',
                 'freshroute_replica_records_skipped_total{partition="0",role="active",table="t"} 2.0',
                 'freshroute_replica_restores_total{partition="1",role="standby",table="t"} 1.0',
                 'freshroute_replica_versions_expired_total{partition="0",role="active",table="t"} 7.0',
                 'freshroute_store_undecodable_records_total{table="t"} 2.0',
                 'freshroute_node_replicas{node="node-1",role="active"} 1.0',
                 'freshroute_node_replicas{node="node-1",role="standby"} 1.0']:
        assert line in text, line
    # A replica that has not learnt its end offset exports no end and no offset lag, never a lag of 0.
    assert 'freshroute_replica_end_offset{partition="1"' not in text
    assert 'freshroute_replica_lag_offsets{partition="1"' not in text
    assert 'freshroute_replica_versions_expired_total{partition="1"' not in text  # keeps no history

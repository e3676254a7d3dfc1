from dataclasses import replace

import pytest

from freshroute.lag import ReplicaLag
from freshroute.metadata.assignment import Assignment
from freshroute.metadata.reports import (MAX_REPORT_BYTES, NodePositions, NodeReport, OversizedReport, ReplicaReport,
                                         UnknownReportVersion)
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.schema import Keys
from freshroute.metadata.tables import TableSpec


def test_table_spec_round_trip():
    spec = TableSpec("sensor_stats", "sensor_stats-changelog", 8, "sensor", {"count": "bigint"}, 1, None, 5000)
    assert TableSpec.from_json(spec.to_json()) == spec


def test_replica_lag_is_clamped_at_zero():
    assert ReplicaLag(applied=10, end=7).offsets == 0
    assert ReplicaLag(applied=7, end=10).offsets == 3


def test_an_end_offset_not_learnt_yet_is_an_unknown_lag_in_reports_and_positions():
    assert ReplicaLag(applied=7, end=None).offsets is None
    r = ReplicaReport("t", 3, Role.STANDBY, ReplicaState.RESTORING, 5, None, 120)
    node = NodeReport("node-1", "127.0.0.1:7101", 1000, (r,))
    back = NodeReport.from_json(node.to_json())
    assert back == node and back.replicas[0].lag.offsets is None and not back.replicas[0].within(10**9)
    later = replace(node, heartbeat_ms=1200, replicas=(replace(r, applied=6),))
    p = NodePositions.from_bytes(NodePositions.of(later, report_ms=1000).to_bytes())
    assert p.replica(0) == (6, None, 120) and p.applied_to(node) == later


def test_node_report_round_trip():
    r = ReplicaReport("t", 3, Role.STANDBY, ReplicaState.RESTORING, 5, 9, 120)
    node = NodeReport("node-1", "127.0.0.1:7101", 1234, (r,), rack="a", draining=True)
    back = NodeReport.from_json(node.to_json())
    assert back == node
    assert back.replicas[0].lag.offsets == 4


def test_node_positions_round_trip_and_move_only_the_report_they_belong_to():
    node = NodeReport("node-1", "127.0.0.1:7101", 1000, (ReplicaReport("t", 3, Role.STANDBY, ReplicaState.STANDBY, 5, 9, 0),
                                                         ReplicaReport("t", 4, Role.ACTIVE, ReplicaState.ACTIVE, 7, 7, 0)))
    later = NodeReport("node-1", "127.0.0.1:7101", 1200, (replace(node.replicas[0], applied=9, end=12, staleness_ms=40),
                                                          replace(node.replicas[1], applied=8, end=8)))
    p = NodePositions.of(later, report_ms=1000)
    raw = p.to_bytes()
    assert NodePositions.from_bytes(raw) == p and tuple(p.values) == (9, 12, 40, 8, 8, 0)
    assert len(raw) == 24 + 24 * 2  # a tenth of the report's JSON, whatever the names
    assert raw[24:32] == (9).to_bytes(8, "little", signed=True)  # little-endian whatever the machine
    assert p.fits(node) and p.applied_to(node) == later
    assert p.applied_to(later) is later  # not its report
    assert NodePositions(1000, 900, p.values).applied_to(node) is node  # older than the report
    assert not NodePositions(1000, 1200, p.values[:3]).fits(node)  # another number of replicas
    with pytest.raises(ValueError):
        NodePositions.from_bytes(raw[:-1])
    with pytest.raises(UnknownReportVersion):
        NodePositions.from_bytes(b"\x02" + raw[1:])
    with pytest.raises(OversizedReport):
        NodePositions.from_bytes(bytes(24 * (MAX_REPORT_BYTES // 24 + 1)))


def test_assignment_roles_and_round_trip():
    a = Assignment(3, {("t", 0): ("n1", "n2"), ("t", 1): ("n2", "n3")})
    assert Assignment.from_json(a.to_json()) == a
    assert a.active("t", 1) == "n2"
    assert a.active("t", 9) is None
    assert a.hosted_by("n2") == {("t", 0): Role.STANDBY, ("t", 1): Role.ACTIVE}


def test_keys_are_namespaced():
    k = Keys("ns1")
    assert k.node("n1") == "ns1:node:n1"
    assert {k.tables, k.beats, k.reports, k.assignment, k.placements, k.assignor}.isdisjoint({Keys("ns2").tables})

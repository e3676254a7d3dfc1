from freshroute.metadata import (Assignment, Keys, NodeReport, ReplicaLag, ReplicaReport, ReplicaState, Role,
                                 TableSpec)


def test_table_spec_round_trip():
    spec = TableSpec("sensor_stats", "sensor_stats-changelog", 8, "sensor", {"count": "bigint"}, 1, None, 5000)
    assert TableSpec.from_json(spec.to_json()) == spec


def test_replica_lag_is_clamped_at_zero():
    assert ReplicaLag(applied=10, end=7).offsets == 0
    assert ReplicaLag(applied=7, end=10).offsets == 3


def test_node_report_round_trip():
    r = ReplicaReport("t", 3, Role.STANDBY, ReplicaState.RESTORING, 5, 9, 120)
    node = NodeReport("node-1", "127.0.0.1:7101", 1234, (r,), rack="a", draining=True)
    back = NodeReport.from_json(node.to_json())
    assert back == node
    assert back.replicas[0].lag.offsets == 4


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

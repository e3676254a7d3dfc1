"""Heartbeats and assignment following against an in-memory metadata store, including a Redis outage."""

from __future__ import annotations

import logging

from redis.exceptions import ConnectionError as RedisConnectionError

from freshroute.metadata import Assignment, ReplicaReport, ReplicaState, Role, TableSpec
from store_node.membership import Membership, desired_replicas
from store_node.settings import StoreNodeSettings

SPEC = TableSpec("t", "t-changelog", 4, "k", standby_replicas=1)


class FakeMetadata:
    def __init__(self):
        self.down = False
        self.published = []
        self.stored: Assignment | None = None
        self.lease: tuple[str, int] | None = None
        self.generation = 0

    def _check(self):
        if self.down:
            raise RedisConnectionError("Connection refused")

    def publish_node(self, report, ttl_ms):
        self._check()
        self.published.append((report, ttl_ms))

    def tables(self):
        self._check()
        return {"t": SPEC}

    def nodes(self):
        self._check()
        return {r.node_id: r for r, _ in self.published[-1:]}

    def assignment(self):
        self._check()
        return self.stored

    def try_acquire_assignor(self, node_id, lease_ms):
        self._check()
        if self.lease is None:
            self.generation += 1
            self.lease = (node_id, self.generation)
        return self.lease[1] if self.lease[0] == node_id else None

    def write_assignment(self, assignment, node_id, generation):
        self._check()
        if self.lease != (node_id, generation):
            return False
        self.stored = assignment
        return True

    def release_assignor(self, node_id, generation):
        self._check()
        if self.lease == (node_id, generation):
            self.lease = None

    def remove_node(self, node_id):
        self._check()


class Clock:
    def __init__(self):
        self.now = 10_000

    def __call__(self):
        return self.now


def make(metadata, clock=None):
    clock = clock or Clock()
    followed = []
    replicas = (ReplicaReport("t", 0, Role.ACTIVE, ReplicaState.ACTIVE, 5, 5, 0),)
    m = Membership(StoreNodeSettings(node_id="n1", rack="r1"), metadata, "127.0.0.1:7001", lambda now: replicas,
                   followed.append, clock)
    return m, followed, clock


def settle(m, clock):
    """First tick takes the lease; with no assignment yet it waits one expiry for heartbeats."""
    m.tick()
    clock.now += 2000
    m.tick()


def test_tick_heartbeats_assigns_and_follows():
    md = FakeMetadata()
    m, followed, clock = make(md)
    settle(m, clock)
    report, ttl = md.published[-1]
    assert (report.node_id, report.address, report.rack, report.heartbeat_ms) == ("n1", "127.0.0.1:7001", "r1", 12_000)
    assert report.replicas[0].applied == 5 and ttl == 5000
    assert md.stored is not None and m.assignor.generation == 1
    assert set(followed[-1]) == {("t", p) for p in range(4)}
    assert all(role is Role.ACTIVE for _, role in followed[-1].values())


def test_redis_outage_keeps_the_last_assignment_and_logs_once(caplog):
    md = FakeMetadata()
    m, followed, clock = make(md)
    settle(m, clock)
    before = m.assignment
    md.down = True
    with caplog.at_level(logging.INFO, logger="store_node.membership"):
        for _ in range(50):
            m.tick()
        md.down = False
        m.tick()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in x for x in lines) == 1
    assert sum("reachable again" in x for x in lines) == 1
    assert m.assignment == before and len(followed) == 2  # before the outage, and after it
    assert m.assignor.generation is None or md.generation == m.assignor.generation


def test_draining_node_stops_assigning_and_says_so():
    md = FakeMetadata()
    m, _, clock = make(md)
    settle(m, clock)
    m.drain()
    assert md.published[-1][0].draining
    assert md.lease is None


def test_desired_replicas_skips_unknown_tables_and_partitions():
    a = Assignment(3, {("t", 0): ("n1", "n2"), ("t", 9): ("n1",), ("gone", 0): ("n1",), ("t", 1): ("n2", "n1")})
    assert desired_replicas(a, {"t": SPEC}, "n1") == {("t", 0): (SPEC, Role.ACTIVE), ("t", 1): (SPEC, Role.STANDBY)}


def test_an_outage_voids_the_assignor_lease_even_when_only_the_heartbeat_failed():
    md = FakeMetadata()
    m, _, clock = make(md)
    settle(m, clock)
    assert m.assignor.generation == 1
    md.down = True
    m.tick()  # fails at the heartbeat, before the assignor runs
    assert m.assignor.generation is None


def test_the_assignment_is_polled_every_tick_and_the_heartbeat_at_its_own_period():
    md = FakeMetadata()
    m, followed, clock = make(md)  # heartbeat_ms 200, assignment_poll_ms 100
    settle(m, clock)
    beats = len(md.published)
    polls = len(followed)
    for _ in range(10):
        clock.now += 100
        m.tick()
    assert len(followed) - polls == 10
    assert len(md.published) - beats == 5

"""Heartbeats and assignment following against an in-memory metadata store, including a Redis outage."""

from __future__ import annotations

import logging
from dataclasses import replace

from freshroute.metadata.reports import NodePositions, NodeReport, ReplicaReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.tables import TableSpec
from store_node.membership import Membership, News, desired_replicas, news
from store_node.settings import StoreNodeSettings

from .memory_redis import MemoryRedis

SPEC = TableSpec("t", "t-changelog", 4, "k", standby_replicas=1)


class FakeMetadata(MetadataStore):
    """The real metadata code on an in-memory Redis, with a record of every round."""

    def __init__(self):
        self.memory = MemoryRedis()
        super().__init__(self.memory.sync, "ns")
        self.seen: list[tuple] = []  # (beat_ms, report, positions) of every round

    def rounds(self, requests):
        self.seen.extend((r.beat_ms, r.report, r.positions) for r in requests)
        return super().rounds(requests)

    @property
    def published(self) -> list[NodeReport]:
        return [NodeReport.from_json(r) for _, r, _ in self.seen if r]

    @property
    def moved(self) -> list[NodePositions]:
        return [NodePositions.from_bytes(p) for _, _, p in self.seen if p]

    @property
    def lease(self):
        return self.redis.get(self.keys.assignor)


class Clock:
    def __init__(self):
        self.now = 10_000

    def __call__(self):
        return self.now


def make(metadata, clock=None, replicas=None):
    clock = clock or Clock()
    followed = []
    replicas = replicas or [(ReplicaReport("t", 0, Role.ACTIVE, ReplicaState.ACTIVE, 5, 5, 0),)]
    metadata.register_tables([SPEC])
    m = Membership(StoreNodeSettings(node_id="n1", rack="r1"), metadata, "127.0.0.1:7001", lambda now: replicas[0],
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
    report = md.nodes()["n1"]
    assert (report.node_id, report.address, report.rack, report.heartbeat_ms) == ("n1", "127.0.0.1:7001", "r1", 10_000)
    assert md.beats() == {"n1": 12_000}  # beats are renewed; the unchanged report is not rewritten
    assert report.replicas[0].applied == 5 and 0 < md.redis.pttl(md.keys.node("n1")) <= 5000
    assert md.assignment() is not None and m.assignor.generation == 1
    assert set(followed[-1]) == {("t", p) for p in range(4)}
    assert all(role is Role.ACTIVE for _, role in followed[-1].values())


def test_redis_outage_keeps_the_last_assignment_and_logs_once(caplog):
    md = FakeMetadata()
    m, followed, clock = make(md)
    settle(m, clock)
    before = m.desired
    md.memory.down = True
    with caplog.at_level(logging.INFO, logger="store_node.membership"):
        for _ in range(50):
            m.tick()
        md.memory.down = False
        m.tick()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in x for x in lines) == 1
    assert sum("reachable again" in x for x in lines) == 1
    assert m.desired == before and len(followed) == 2  # before the outage, and after it


def test_draining_node_stops_assigning_and_says_so():
    md = FakeMetadata()
    m, _, clock = make(md)
    settle(m, clock)
    m.drain()
    assert md.published[-1].draining and md.nodes()["n1"].draining
    assert md.lease is None


def test_desired_replicas_skips_unknown_tables_and_partitions():
    hosted = {("t", 0): Role.ACTIVE, ("t", 9): Role.ACTIVE, ("gone", 0): Role.ACTIVE, ("t", 1): Role.STANDBY}
    assert desired_replicas(hosted, {"t": SPEC}) == {("t", 0): (SPEC, Role.ACTIVE), ("t", 1): (SPEC, Role.STANDBY)}


def test_an_outage_voids_the_assignor_lease_even_when_only_the_heartbeat_failed():
    md = FakeMetadata()
    m, _, clock = make(md)
    settle(m, clock)
    assert m.assignor.generation == 1
    md.memory.down = True
    m.tick()  # fails at the heartbeat, before the assignor runs
    assert m.assignor.generation is None


def test_the_assignment_is_followed_every_tick_the_heartbeat_at_its_period_and_the_report_when_it_changed():
    md = FakeMetadata()
    replicas = [(ReplicaReport("t", 0, Role.ACTIVE, ReplicaState.ACTIVE, 5, 5, 0),)]
    m, followed, clock = make(md, replicas=replicas)  # heartbeat_ms 200, assignment_poll_ms 100
    settle(m, clock)
    rounds, polls, reports = len(md.seen), len(followed), len(md.published)
    for _ in range(10):
        clock.now += 100
        m.tick()
    assert len(followed) - polls == 10 and len(md.seen) - rounds == 10
    assert sum(beat is not None for beat, _, _ in md.seen[rounds:]) == 5
    assert len(md.published) == reports and not md.moved  # nothing changed: beats only
    replicas[0] = (ReplicaReport("t", 0, Role.ACTIVE, ReplicaState.ACTIVE, 5, 9, 0),)  # now 4 behind, still warm
    clock.now += 200
    m.tick()
    # Only positions moved: they go out alone, tied to the report, and readers see them applied.
    assert len(md.published) == reports and tuple(md.moved[-1].values) == (5, 9, 0)
    assert md.moved[-1].report_ms == md.published[-1].heartbeat_ms
    assert md.nodes()["n1"].replicas[0].end == 9 and md.nodes()["n1"].heartbeat_ms == clock.now
    replicas[0] = (ReplicaReport("t", 0, Role.ACTIVE, ReplicaState.ACTIVE, 5, 500, 0),)  # 495 behind: cold
    clock.now += 200
    m.tick()
    assert len(md.published) == reports + 1 and len(md.moved) == 1  # warmth flipped: the whole report
    assert md.nodes()["n1"].replicas[0].end == 500
    replicas[0] = (ReplicaReport("t", 0, Role.ACTIVE, ReplicaState.ACTIVE, 5, 501, 0),)
    clock.now += 200
    m.tick()
    assert md.moved[-1].report_ms == md.published[-1].heartbeat_ms  # tied to the new report
    assert md.nodes()["n1"].replicas[0].end == 501


def test_positions_published_after_redis_lost_the_report_bring_the_report_back():
    md = FakeMetadata()
    replicas = [(ReplicaReport("t", 0, Role.ACTIVE, ReplicaState.ACTIVE, 5, 5, 0),)]
    m, _, clock = make(md, replicas=replicas)
    settle(m, clock)
    reports = len(md.published)
    md.redis.delete(md.keys.node("n1"))  # expired, or Redis lost it
    replicas[0] = (ReplicaReport("t", 0, Role.ACTIVE, ReplicaState.ACTIVE, 6, 6, 0),)
    for _ in range(4):
        clock.now += 100
        m.tick()
    assert len(md.published) == reports + 1 and md.nodes()["n1"].replicas[0].applied == 6


def test_a_report_redis_lost_is_published_again_in_full():
    md = FakeMetadata()
    m, _, clock = make(md)
    settle(m, clock)
    md.redis.flushall()  # a restarted Redis
    for _ in range(3):
        clock.now += 100
        m.tick()
    assert md.nodes()["n1"].replicas[0].applied == 5


def _report(t, *replicas):
    return NodeReport("n1", "a:1", t, tuple(ReplicaReport("t", p, Role.ACTIVE, ReplicaState.ACTIVE, a, e, s)
                                            for p, a, e, s in replicas))


def test_a_report_is_news_in_whole_when_its_shape_or_warmth_changes_and_in_positions_when_they_move():
    before = _report(1000, (0, 5, 5, 0), (1, 10, 12, 300))
    assert news(None, before, 200, 100) is News.REPORT
    assert news(before, _report(1200, (0, 5, 5, 0), (1, 10, 12, 500)), 200, 100) is News.NONE  # staleness grew with time
    assert news(before, _report(1200, (0, 5, 5, 0), (1, 10, 12, 2000)), 200, 100) is News.POSITIONS  # not as time explains
    assert news(before, _report(1200, (0, 5, 5, 0), (1, 12, 12, 0)), 200, 100) is News.POSITIONS  # caught up
    assert news(before, _report(1200, (0, 8, 8, 0), (1, 10, 12, 500)), 200, 100) is News.POSITIONS  # a position moved
    assert news(before, _report(1200, (0, 5, 5, 0)), 200, 100) is News.REPORT  # a replica gone
    assert news(before, replace(_report(1200, (0, 5, 5, 0), (1, 10, 12, 500)), draining=True), 200, 100) is News.REPORT
    assert news(before, _report(1200, (0, 5, 200, 0), (1, 10, 12, 500)), 200, 100) is News.REPORT  # now cold
    moved = _report(1200, (0, 5, 5, 0), (1, 10, 12, 300))
    assert news(before, replace(moved, replicas=(replace(moved.replicas[0], state=ReplicaState.RESTORING),
                                                 moved.replicas[1])), 200, 100) is News.REPORT

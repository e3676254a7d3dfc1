import asyncio
from dataclasses import replace

import orjson
import pytest

from freshroute.metadata.assignment import Assignment
from freshroute.metadata.reports import MAX_REPORT_BYTES, NodePositions, NodeReport, ReplicaReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.rounds import RoundRequest
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.tables import TableSpec

from freshroute.routing.refresher import MetadataRefresher
from freshroute.routing.snapshot import build_snapshot

from .memory_redis import MemoryRedis

T0 = 1_700_000_000_000
SPEC = TableSpec("sensor_stats", "sensor_stats-changelog", 2, "sensor_id", {"count": "long"}, 1)


def reports(heartbeat_ms):
    return [
        NodeReport("n1", "127.0.0.1:7001", heartbeat_ms, (
            ReplicaReport("sensor_stats", 0, Role.ACTIVE, ReplicaState.ACTIVE, 100, 100, 0),
            ReplicaReport("sensor_stats", 1, Role.STANDBY, ReplicaState.STANDBY, 40, 50, 300),
        )),
        NodeReport("n2", "127.0.0.1:7002", heartbeat_ms - 500, (
            ReplicaReport("sensor_stats", 0, Role.STANDBY, ReplicaState.RESTORING, 10, 100, 9000),
            ReplicaReport("sensor_stats", 1, Role.ACTIVE, ReplicaState.ACTIVE, 50, 50, 0),
        )),
    ]


ASSIGNMENT_JSON = (b'{"generation": 7, "replicas": [["sensor_stats", 0, ["n1", "n2"]], '
                   b'["sensor_stats", 1, ["n2", "n1", "n3"]]]}')


def test_build_from_node_reports_and_assignment_json():
    snap = build_snapshot({"sensor_stats": SPEC}, reports(T0), Assignment.from_json(ASSIGNMENT_JSON), T0 + 1000, 2000)
    assert snap.loaded and snap.generation == 7 and set(snap.tables) == {"sensor_stats"}
    p0 = snap.replicas_of("sensor_stats", 0)
    assert [(r.node, r.role, r.state, r.lag_offsets, r.address) for r in p0] == [
        ("n1", Role.ACTIVE, ReplicaState.ACTIVE, 0, "127.0.0.1:7001"),
        ("n2", Role.STANDBY, ReplicaState.RESTORING, 90, "127.0.0.1:7002")]
    p1 = snap.replicas_of("sensor_stats", 1)
    assert [r.node for r in p1] == ["n2", "n1", "n3"]
    n3 = p1[2]
    # Assigned but not reported: shown, never servable.
    assert (n3.reported, n3.alive, n3.role) == (False, False, Role.STANDBY)
    assert p1[1].staleness_ms == 300 and p1[1].observed_ms == T0
    assert snap.heartbeat_age_ms("n1") == 1000 and snap.heartbeat_age_ms("n2") == 1500
    assert snap.heartbeat_age_ms("n9") is None
    assert all(n.alive for n in snap.nodes.values())


def test_liveness_from_heartbeat_age():
    snap = build_snapshot({}, reports(T0), None, T0 + 1800, 2000)
    assert snap.nodes["n1"].alive and not snap.nodes["n2"].alive  # n2: 2.3 s since its heartbeat
    assert [r.alive for r in snap.replicas_of("sensor_stats", 0)] == [True, False]
    assert snap.generation is None


class FakeRedis(MemoryRedis):
    """The in-memory Redis, with the metadata a pipeline and store nodes would write to it."""

    def __init__(self, ns):
        super().__init__()
        self.md = MetadataStore(self.sync, ns)
        self.keys = self.md.keys
        self.client = self.aio

    def load(self, heartbeat_ms, tables=(SPEC,), assignment=ASSIGNMENT_JSON):
        """Everything anew, as after a Redis restart: tables, heartbeats and the assignment."""
        self.md.redis.flushall()
        self.md.register_tables(tables)
        for r in reports(heartbeat_ms):
            self.md.publish_node(r, ttl_ms=60_000)
        if assignment is not None:
            self.md.redis.set(self.keys.assignment, assignment)
            self.md.redis.incr(self.keys.assignment_version)


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def refresher(fake, clock, **kw):
    swaps = []
    r = MetadataRefresher(fake.client, "ns", refresh_ms=100, node_expiry_ms=2000, reset_grace_ms=kw.get("grace", 3000),
                          on_swap=swaps.append, clock_ms=clock)
    return r, swaps


def test_refresh_builds_and_swaps_whole_snapshot():
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, swaps = refresher(fake, clock)
    assert not r.current.loaded
    assert asyncio.run(r.refresh_once()) is True
    assert r.current.loaded and r.redis_ok and swaps == [r.current]
    assert [x.node for x in r.current.replicas_of("sensor_stats", 0)] == ["n1", "n2"]


def test_the_snapshot_names_the_assignor_lease_holder():
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, _ = refresher(fake, clock)
    asyncio.run(r.refresh_once())
    assert r.current.assignor is None  # nobody holds the lease
    fake.md.redis.set(fake.keys.assignor, "node-2:5")
    asyncio.run(r.refresh_once())
    assert r.current.assignor == "node-2"


def test_the_snapshot_reads_the_tables_versions_when_they_change_and_keeps_them_through_a_reset():
    from freshroute.metadata.version_store import TableVersionStore

    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, _ = refresher(fake, clock)
    asyncio.run(r.refresh_once())
    assert dict(r.current.versions) == {}  # no record: one version, as a topic served has
    versions = TableVersionStore(fake.sync, "ns")
    versions.adopt("sensor_stats", "fp1", T0)
    versions.begin("sensor_stats", "fp2", T0 + 1)
    asyncio.run(r.refresh_once())
    record = r.current.versions["sensor_stats"]
    assert record.summary() == "1 (2 building)" and record == versions.record("sensor_stats")
    fake.load(T0)  # Redis lost its state, and the pipeline registered the tables again before their versions
    clock.t = T0 + 100
    asyncio.run(r.refresh_once())
    assert r.current.versions["sensor_stats"] == record
    fake.md.register_tables([replace(SPEC, name="other", topic="other-changelog")])
    fake.md.remove_table("sensor_stats")  # a table removed takes its record with it
    asyncio.run(r.refresh_once())
    assert "sensor_stats" not in r.current.versions


def test_redis_down_keeps_last_snapshot_and_freezes_liveness():
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, swaps = refresher(fake, clock)
    asyncio.run(r.refresh_once())
    before = r.current
    fake.down = True
    clock.t = T0 + 60_000  # a minute of outage: every heartbeat would look expired
    for _ in range(5):
        assert asyncio.run(r.refresh_once()) is False
    assert r.current is before and not r.redis_ok and len(swaps) == 1
    assert all(n.alive for n in r.current.nodes.values())
    assert all(rep.alive for reps in r.current.replicas.values() for rep in reps if rep.reported)
    # Back up with fresh heartbeats: a new snapshot, liveness judged again.
    fake.down = False
    fake.load(T0 + 60_000)
    assert asyncio.run(r.refresh_once()) is True
    assert r.current is not before and r.redis_ok and r.current.nodes["n1"].alive


def test_redis_back_with_old_heartbeats_marks_nodes_dead():
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, _ = refresher(fake, clock)
    asyncio.run(r.refresh_once())
    clock.t = T0 + 10_000  # Redis answers, and the nodes truly stopped heartbeating
    asyncio.run(r.refresh_once())
    assert not any(n.alive for n in r.current.nodes.values())


def test_emptied_redis_is_ignored_for_the_grace_period():
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, _ = refresher(fake, clock, grace=3000)
    asyncio.run(r.refresh_once())
    before = r.current
    fake.md.redis.flushall()  # a restarted Redis: soft state not yet republished
    clock.t = T0 + 1000
    assert asyncio.run(r.refresh_once()) is False and r.current is before
    clock.t = T0 + 2500
    assert asyncio.run(r.refresh_once()) is False and r.current is before
    clock.t = T0 + 4500  # still no heartbeat past the grace: believe the nodes are gone
    assert asyncio.run(r.refresh_once()) is True
    assert r.current.loaded and not r.current.nodes
    assert set(r.current.tables) == {"sensor_stats"}  # tables are kept until registered again


def test_tables_survive_a_redis_restart_while_nodes_republish():
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, _ = refresher(fake, clock)
    asyncio.run(r.refresh_once())
    # Restarted Redis: the nodes have heartbeated again, the pipeline has not re-registered yet.
    clock.t = T0 + 1000
    fake.load(T0 + 1000, tables=(), assignment=None)
    assert asyncio.run(r.refresh_once()) is True
    assert set(r.current.tables) == {"sensor_stats"} and r.current.generation is None
    assert all(n.alive for n in r.current.nodes.values())


def test_a_partition_keeps_its_last_replicas_while_heartbeats_return_one_by_one():
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, _ = refresher(fake, clock, grace=3000)
    asyncio.run(r.refresh_once())
    # n1 now hosts only partition 0 and n2's heartbeat is not back yet: partition 1 has no
    # replica in Redis, but its last known ones are still routed to.
    clock.t = T0 + 1000
    only_p0 = NodeReport("n1", "127.0.0.1:7001", T0 + 1000,
                         (ReplicaReport("sensor_stats", 0, Role.ACTIVE, ReplicaState.ACTIVE, 100, 100, 0),))
    fake.md.publish_node(only_p0, ttl_ms=60_000)
    fake.md.remove_node("n2")
    assert asyncio.run(r.refresh_once()) is True
    assert [v.node for v in r.current.replicas_of("sensor_stats", 0) if v.reported] == ["n1"]
    assert [v.node for v in r.current.replicas_of("sensor_stats", 1) if v.reported] == ["n2", "n1"]
    assert "n2" in r.current.nodes  # carried with its replicas
    clock.t = T0 + 2500
    asyncio.run(r.refresh_once())
    assert [v.node for v in r.current.replicas_of("sensor_stats", 1) if v.reported] == ["n2", "n1"]
    clock.t = T0 + 4500  # past the grace: partition 1 really has no replica
    asyncio.run(r.refresh_once())
    assert not any(v.reported for v in r.current.replicas_of("sensor_stats", 1))
    clock.t = T0 + 5000
    asyncio.run(r.refresh_once())
    assert not any(v.reported for v in r.current.replicas_of("sensor_stats", 1))


def test_malformed_entries_are_skipped_not_fatal():
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    fake.md.redis.hset(fake.keys.tables, "broken", b'{"name": "broken"}')
    r, _ = refresher(fake, clock)
    fake.md.redis.incr(fake.keys.tables_version)
    for bad in (b"{not json", orjson.dumps({"v": 99, "node_id": "n2"}), b"x" * (MAX_REPORT_BYTES + 10),
                NodeReport("n1", "127.0.0.1:7009", T0).to_json()):  # and one naming another node
        fake.md.rounds([RoundRequest("n2", T0, 60_000, bad)])
        assert asyncio.run(r.refresh_once()) is True
        assert set(r.current.nodes) == {"n1"} and set(r.current.tables) == {"sensor_stats"}
    assert r.feed.rejections.counts == {"malformed": 2, "unknown-version": 1, "oversized": 1}
    # A good report again: the node is back.
    fake.md.publish_node(reports(T0)[1], ttl_ms=60_000)
    asyncio.run(r.refresh_once())
    assert set(r.current.nodes) == {"n1", "n2"}


def test_a_beat_under_a_name_that_is_no_node_id_is_skipped_and_counted():
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, _ = refresher(fake, clock)
    for bad in ("two words", b"\xff\xfe", "n1\n", ""):  # readers pass ids on space-separated
        fake.md.redis.hset(fake.keys.beats, bad, T0)
        fake.md.redis.zadd(fake.keys.reports, {bad: 10**15})
        fake.md.redis.zadd(fake.keys.positions, {bad: 10**15})
    assert asyncio.run(r.refresh_once()) is True
    assert set(r.current.nodes) == {"n1", "n2"} and set(r.feed.beats) == {"n1", "n2"}
    assert r.feed.rejections.counts == {"malformed": 4}


def test_positions_published_between_reports_move_the_views_lags_without_rebuilding_them():
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, _ = refresher(fake, clock)
    asyncio.run(r.refresh_once())
    before = r.current

    def publish(positions: bytes) -> None:
        fake.md.rounds([RoundRequest("n2", clock.t, 60_000, None, positions)])
        assert asyncio.run(r.refresh_once()) is True

    def n2_lags():
        return [v.latest() for tp in (("sensor_stats", 0), ("sensor_stats", 1))
                for v in r.current.replicas[tp] if v.node == "n2"]

    clock.t = T0 + 200  # n2's restoring standby caught up a little, its active moved on
    publish(NodePositions(T0 - 500, T0 + 200, (60, 120, 700, 70, 70, 0)).to_bytes())
    assert n2_lags() == [(60, 120, 700, T0 + 200), (70, 70, 0, T0 + 200)]
    assert r.current.replicas is before.replicas  # no view rebuilt, yet every one reads the news
    clock.t = T0 + 400
    for bad in (b"short", NodePositions(T0 - 500, T0 + 400, (1, 2, 3, 4, 5, 6)).to_bytes().replace(b"\x01", b"\x09", 1)):
        publish(bad)  # neither a whole number of replicas nor a known version: skipped and counted
    publish(NodePositions(T0 - 900, T0 + 400, (1, 1, 0, 1, 1, 0)).to_bytes())  # of an older report: not these views'
    publish(NodePositions(T0 - 500, T0 + 400, (1, 1, 0)).to_bytes())  # of fewer replicas than the report has
    assert n2_lags() == [(60, 120, 700, T0 + 200), (70, 70, 0, T0 + 200)]
    assert r.feed.rejections.counts == {"malformed": 1, "unknown-version": 1}
    # A new report replaces the positions: its own stand until newer ones are published for it.
    fake.md.publish_node(reports(T0 + 1000)[1], ttl_ms=60_000)
    asyncio.run(r.refresh_once())
    assert n2_lags() == [(10, 100, 9000, T0 + 500), (50, 50, 0, T0 + 500)]


@pytest.mark.parametrize("stop_after", [0.05])
def test_run_loop_refreshes_until_stopped(stop_after):
    fake, clock = FakeRedis("ns"), Clock(T0)
    fake.load(T0)
    r, swaps = refresher(fake, clock)

    async def main():
        stop = asyncio.Event()
        task = asyncio.create_task(r.run(stop))
        await asyncio.sleep(stop_after + 0.25)
        stop.set()
        await asyncio.wait_for(task, 1)

    asyncio.run(main())
    assert len(swaps) >= 2


@pytest.mark.parametrize("seed", range(5))
def test_each_incremental_snapshot_equals_one_built_whole(seed):
    """Random reports, deaths, removals and reassignments: the builder that redoes only what
    changed must always give what a build from scratch gives."""
    import random

    from freshroute.routing.snapshot import SnapshotBuilder

    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(6)]
    tables = {"t": TableSpec("t", "t-changelog", 12, "k")}
    builder = SnapshotBuilder(1000)
    reports: dict[str, NodeReport] = {}
    positions: dict[str, NodePositions] = {}
    assignment = None
    now = T0
    for _ in range(60):
        now += rng.choice([50, 300, 1500])
        for n in rng.sample(nodes, rng.randint(0, 3)):
            if rng.random() < 0.15:
                reports.pop(n, None)
                continue
            parts = rng.sample(range(12), rng.randint(0, 5))
            reports[n] = NodeReport(n, f"127.0.0.1:{7000 + nodes.index(n)}", now, tuple(
                ReplicaReport("t", p, rng.choice(list(Role)), rng.choice(list(ReplicaState)), 5, rng.randint(5, 9), 0)
                for p in parts), draining=rng.random() < 0.1)
        if rng.random() < 0.3:
            assignment = Assignment(rng.randint(1, 9), {("t", p): tuple(rng.sample(nodes, 2)) for p in range(12)
                                                        if rng.random() < 0.8})
        moved = set(rng.sample(sorted(reports), min(len(reports), rng.randint(0, 3))))
        for n in moved:
            r = reports[n]  # positions published since its report (a new report leaves older ones behind)
            positions[n] = NodePositions(r.heartbeat_ms, r.heartbeat_ms + rng.randint(0, 100),
                                         tuple(rng.randint(0, 99) for _ in range(3 * len(r.replicas))))
        heard = {n: r.heartbeat_ms for n, r in reports.items()}
        snap, dirty = builder.build(tables, reports, heard, assignment, now, positions, moved)
        whole = build_snapshot(tables, reports.values(), assignment, now, 1000)
        assert dict(snap.replicas) == dict(whole.replicas)
        assert dict(snap.nodes) == dict(whole.nodes)
        # Views read the positions published since their report as if it had been published with them.
        applied = build_snapshot(tables, [positions[n].applied_to(r) if n in positions else r
                                          for n, r in reports.items()], assignment, now, 1000)
        assert {tp: [v.latest() for v in vs] for tp, vs in snap.replicas.items()} == \
            {tp: [v.latest() for v in vs] for tp, vs in applied.replicas.items()}

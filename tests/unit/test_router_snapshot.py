import asyncio

import pytest
import redis.exceptions

from freshroute.metadata import Assignment, Keys, NodeReport, ReplicaReport, ReplicaState, Role, TableSpec

from freshroute.routing.snapshot import MetadataRefresher, build_snapshot

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
    assert snap.nodes["n1"].heartbeat_age_ms == 1000 and snap.nodes["n2"].heartbeat_age_ms == 1500
    assert all(n.alive for n in snap.nodes.values())


def test_liveness_from_heartbeat_age():
    snap = build_snapshot({}, reports(T0), None, T0 + 1800, 2000)
    assert snap.nodes["n1"].alive and not snap.nodes["n2"].alive  # n2: 2.3 s since its heartbeat
    assert [r.alive for r in snap.replicas_of("sensor_stats", 0)] == [True, False]
    assert snap.generation is None


class FakeRedis:
    """Just the calls the refresher makes, with a switch to make them fail."""

    def __init__(self, ns):
        self.keys = Keys(ns)
        self.data = {}
        self.down = False

    def load(self, heartbeat_ms, tables=(SPEC,), assignment=ASSIGNMENT_JSON):
        self.data = {self.keys.tables: {t.name.encode(): t.to_json() for t in tables},
                     self.keys.nodes: {r.node_id.encode() for r in reports(heartbeat_ms)} if tables else set(),
                     self.keys.assignment: assignment}
        for r in reports(heartbeat_ms) if tables else []:
            self.data[self.keys.node(r.node_id)] = r.to_json()

    def pipeline(self, transaction=False):
        return _Pipe(self)

    async def mget(self, keys):
        self._check()
        return [self.data.get(k) for k in keys]

    def _check(self):
        if self.down:
            raise redis.exceptions.ConnectionError("Connection refused")


class _Pipe:
    def __init__(self, r):
        self.r, self.ops = r, []

    def hgetall(self, k):
        self.ops.append(lambda: dict(self.r.data.get(k, {})))

    def smembers(self, k):
        self.ops.append(lambda: set(self.r.data.get(k, set())))

    def get(self, k):
        self.ops.append(lambda: self.r.data.get(k))

    async def execute(self):
        self.r._check()
        return [op() for op in self.ops]


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def refresher(fake, clock, **kw):
    swaps = []
    r = MetadataRefresher(fake, "ns", refresh_ms=100, node_expiry_ms=2000, reset_grace_ms=kw.get("grace", 3000),
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
    fake.data = {}  # a restarted Redis: soft state not yet republished
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
    fake.load(T0 + 1000)
    del fake.data[fake.keys.tables]
    del fake.data[fake.keys.assignment]
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
    fake.data[fake.keys.node("n1")] = only_p0.to_json()
    del fake.data[fake.keys.node("n2")]
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
    fake.data[fake.keys.node("n2")] = b"{not json"
    fake.data[fake.keys.tables][b"broken"] = b'{"name": "broken"}'
    r, _ = refresher(fake, clock)
    assert asyncio.run(r.refresh_once()) is True
    assert set(r.current.nodes) == {"n1"} and set(r.current.tables) == {"sensor_stats"}


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

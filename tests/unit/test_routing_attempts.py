"""The one attempt engine, through every kind of read: gets, batch groups and scan partitions alike."""

import time

import pytest

from freshroute.errors import NoReplicaWithinBound, ReplicaUnavailable
from freshroute.bound import Bound
from freshroute.metadata.roles import Role
from router.settings import RouterSettings

from .routing_support import TABLE, Cluster, part
from .routing_support import retries, strictly_ordered

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def hedging_cluster():
    return Cluster(RouterSettings(request_timeout_ms=3000, attempt_timeout_ms=2000, scan_timeout_ms=3000, hedge=True,
                                  hedge_min_ms=5, hedge_budget=1.0))


async def test_a_batch_group_hedges_to_the_next_replica_when_the_first_stalls():
    cluster = hedging_cluster()
    key = "sensor-11"
    first, second = strictly_ordered(cluster, key)
    for _ in range(64):  # learn what "usual" is for a group of this partition
        [r] = await cluster.router.batch_get(TABLE, [key])
        assert r.node == first.node
    first.delay_s = 1.0
    t0 = time.perf_counter()
    [r] = await cluster.router.batch_get(TABLE, [key])
    assert r.node == second.node and r.found
    assert time.perf_counter() - t0 < 0.5  # hedged after a few ms, not after the stalled node's second
    assert retries(cluster, "hedge") == 1


async def test_no_hedge_goes_to_a_replica_still_restoring_it_is_tried_only_when_the_attempt_times_out():
    # A restoring replica may hold nothing yet: a hedge there would answer "no such key" for a row the slow
    # replica has. Unbounded, it stays a candidate, tried once the attempt times out.
    cluster = Cluster(RouterSettings(request_timeout_ms=3000, attempt_timeout_ms=400, hedge=True, hedge_min_ms=5,
                                     hedge_budget=1.0))
    key = "sensor-11"
    first, second = strictly_ordered(cluster, key)
    second.replicas[(TABLE, part(key))].restoring = True
    cluster.refresh()
    for _ in range(64):
        r = await cluster.router.get(TABLE, key)
        assert r.node == first.node
    first.delay_s = 0.2  # far past the usual, within the attempt timeout
    t0 = time.perf_counter()
    r = await cluster.router.get(TABLE, key)
    assert (r.node, r.found) == (first.node, True) and time.perf_counter() - t0 >= 0.2
    assert retries(cluster, "hedge") == 0
    first.delay_s = 1.0  # past the attempt timeout: the restoring replica is asked, and answers
    r = await cluster.router.get(TABLE, key)
    assert r.node == second.node and r.role == Role.STANDBY.value
    assert (retries(cluster, "hedge"), retries(cluster, "slow")) == (0, 1)


async def test_a_scan_partition_hedges_to_the_next_replica_when_the_first_stalls():
    cluster = hedging_cluster()
    key = "sensor-11"
    first, second = strictly_ordered(cluster, key)
    for _ in range(64):
        await cluster.router.scans.rows(TABLE, prefix=key, limit=5)
    first.delay_s = 1.0
    t0 = time.perf_counter()
    page = await cluster.router.scans.rows(TABLE, prefix=key, limit=5)
    assert [k for k, _, _ in page.items] == ["sensor-11"]
    assert page.served_by[part(key)].node == second.node
    assert time.perf_counter() - t0 < 0.5
    assert retries(cluster, "hedge") >= 1


@pytest.mark.parametrize("kind", ["get", "batch", "scan"])
async def test_a_refusal_is_retried_on_the_next_replica(kind):
    # The view says both replicas are caught up; the active refuses (it fell behind since).
    cluster = Cluster(RouterSettings(hedge=False))
    key = "sensor-12"
    p = part(key)
    active, standby = strictly_ordered(cluster, key)
    active.replicas[(TABLE, p)].end += 50
    bound = Bound(max_lag=5)
    if kind == "get":
        r = await cluster.router.get(TABLE, key, bound)
        assert (r.node, r.found) == (standby.node, True)
    elif kind == "batch":
        [r] = await cluster.router.batch_get(TABLE, [key], bound)
        assert (r.node, r.found) == (standby.node, True)
    else:
        page = await cluster.router.scans.rows(TABLE, prefix=key, bound=bound)
        assert page.served_by[p].node == standby.node and [k for k, _, _ in page.items] == [key]
    assert retries(cluster, "too_stale") == 1


@pytest.mark.parametrize("kind", ["get", "batch", "scan"])
async def test_when_every_replica_refuses_the_error_carries_the_freshest_lag_they_reported(kind):
    cluster = Cluster(RouterSettings(hedge=False))
    key = "sensor-13"
    p = part(key)
    active, standby = strictly_ordered(cluster, key)
    active.replicas[(TABLE, p)].end += 40  # behind by 40 now
    standby.replicas[(TABLE, p)].end += 20  # behind by 21 now: the freshest
    bound = Bound(max_lag=10)
    with pytest.raises(NoReplicaWithinBound) as e:
        if kind == "get":
            await cluster.router.get(TABLE, key, bound)
        elif kind == "batch":
            [r] = await cluster.router.batch_get(TABLE, [key], bound)
            raise r
        else:
            await cluster.router.scans.rows(TABLE, prefix=key, bound=bound)
    freshest = e.value.details["freshest_lag"]
    assert (freshest["offsets"], freshest["node"]) == (21, standby.node)
    assert e.value.details["bound"]["max_lag"] == 10 and e.value.http_status == 503


async def test_a_batch_fails_only_the_keys_of_the_partition_no_replica_could_answer():
    cluster = Cluster(RouterSettings(hedge=False))
    down_key, up_key = "sensor-1", next(k for k in (f"sensor-{i}" for i in range(2, 40))
                                        if part(k) != part("sensor-1"))
    for node in (cluster.n1, cluster.n2):
        del node.replicas[(TABLE, part(down_key))]
    cluster.refresh()
    down, up = await cluster.router.batch_get(TABLE, [down_key, up_key])
    assert isinstance(down, NoReplicaWithinBound) or isinstance(down, ReplicaUnavailable)
    assert up.found and up.key == up_key


async def test_a_down_node_fails_a_scan_over_to_the_standby():
    cluster = Cluster(RouterSettings(hedge=False))
    cluster.n1.down = True
    page = await cluster.router.scans.rows(TABLE, limit=1000)
    assert len(page.items) == len({k for n in (cluster.n2,) for (_, _), r in n.replicas.items() for k in r.data})
    assert {who.node for who in page.served_by.values()} == {"n2"}
    assert all(who.role in (Role.ACTIVE.value, Role.STANDBY.value) for who in page.served_by.values())


async def test_a_read_behind_only_its_position_waits_for_a_replica_to_catch_up():
    # A session read right after a failover: the survivor is a few records short of the position the dead node
    # served. It tails the changelog, so it is asked again after a short wait instead of failing the read.
    import asyncio

    from freshroute.position import Position

    cluster = Cluster()
    key = "sensor-11"
    p = part(key)
    at = Bound(min_position=Position(TABLE, {p: 105}))
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, p)].end = 105
    cluster.refresh()

    async def catch_up(after_s: float) -> None:
        await asyncio.sleep(after_s)
        cluster.n2.replicas[(TABLE, p)].applied = 105

    task = asyncio.ensure_future(catch_up(0.03))
    r = await cluster.router.get(TABLE, key, at)
    await task
    assert (r.node, r.found, r.applied) == ("n2", True, 105)
    assert retries(cluster, "position") >= 1
    [g] = await cluster.router.batch_get(TABLE, [key], at)  # a batch group waits the same way
    assert g.found and g.applied == 105

    # Not when the replica is outside another limit too: that is no wait for a position.
    cluster.n2.replicas[(TABLE, p)].applied = 100
    before = retries(cluster, "position")
    with pytest.raises(NoReplicaWithinBound):
        await cluster.router.get(TABLE, key, Bound(max_lag=0, min_position=Position(TABLE, {p: 105})))
    assert retries(cluster, "position") == before
    # And a replica that never gets there fails the read by its deadline, with the freshest lag.
    t0 = time.perf_counter()
    with pytest.raises(NoReplicaWithinBound):
        await cluster.router.get(TABLE, key, at)
    assert time.perf_counter() - t0 < 2.0

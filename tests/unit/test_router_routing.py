import asyncio
import time

import pytest

from freshroute.errors import LookupTimeout, NoReplicaWithinBound
from freshroute.bound import Bound
from freshroute.position import Position
from freshroute.metadata.roles import Role

from freshroute.routing.results import decode_page_token, encode_page_token
from freshroute.routing.attempts import LatencyWindow
from router.settings import RouterSettings

from .routing_support import TABLE, Cluster, part, retries, strictly_ordered

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_hedge_goes_to_the_next_replica_when_the_first_is_slower_than_usual():
    cluster = Cluster(RouterSettings(request_timeout_ms=2000, attempt_timeout_ms=1000, hedge=True, hedge_min_ms=5,
                                     hedge_budget=1.0))
    key = "sensor-11"
    first, second = strictly_ordered(cluster, key)
    for _ in range(64):  # learn what "usual" latency is
        assert (await cluster.router.get(TABLE, key)).node == first.node
    first.delay_s = 0.5
    t0 = time.perf_counter()
    result = await cluster.router.get(TABLE, key)
    elapsed = time.perf_counter() - t0
    assert result.node == second.node and result.found
    assert elapsed < 0.2  # hedged after ~5 ms, not after the 500 ms the first replica takes
    assert retries(cluster, "hedge") == 1


async def test_without_hedging_a_slow_attempt_is_overtaken_after_the_attempt_timeout():
    cluster = Cluster(RouterSettings(request_timeout_ms=2000, attempt_timeout_ms=50, hedge=False))
    key = "sensor-12"
    first, second = strictly_ordered(cluster, key)
    first.delay_s = 1.0
    t0 = time.perf_counter()
    result = await cluster.router.get(TABLE, key)
    elapsed = time.perf_counter() - t0
    assert result.node == second.node and 0.04 < elapsed < 0.5
    assert retries(cluster, "slow") == 1 and retries(cluster, "hedge") == 0


async def test_slow_last_replica_is_waited_for_until_the_deadline():
    cluster = Cluster(RouterSettings(request_timeout_ms=1000, attempt_timeout_ms=30, hedge=False))
    key = "sensor-13"
    cluster.n1.delay_s = cluster.n2.delay_s = 0.1
    result = await cluster.router.get(TABLE, key)
    assert result.found  # both were slower than the attempt timeout; the first to answer won


async def test_deadline_raises_lookup_timeout_and_releases_in_flight_counts():
    cluster = Cluster(RouterSettings(request_timeout_ms=80, attempt_timeout_ms=20, hedge=False))
    cluster.n1.delay_s = cluster.n2.delay_s = 1.0
    with pytest.raises(LookupTimeout) as e:
        await cluster.router.get(TABLE, "sensor-1")
    assert e.value.http_status == 504 and e.value.details["partition"] == part("sensor-1")
    assert all(load.in_flight == 0 for load in cluster.router.load.snapshot().values())


async def test_a_read_begun_earlier_keeps_one_budget_counted_from_when_it_began():
    # A compiled attempt that gave up hands the read on: what remains of its budget, not a fresh one.
    cluster = Cluster(RouterSettings(request_timeout_ms=300, attempt_timeout_ms=100, hedge=False))
    cluster.n1.delay_s = cluster.n2.delay_s = 1.0
    t0 = time.monotonic()
    with pytest.raises(LookupTimeout):
        await cluster.router.get(TABLE, "sensor-1", since=t0 - 0.2)
    assert time.monotonic() - t0 < 0.2  # 100 ms left, not 300
    t0 = time.monotonic()
    batch = await cluster.router.batch_get(TABLE, ["sensor-1", "sensor-2"], since=t0 - 0.2)
    assert time.monotonic() - t0 < 0.2 and all(isinstance(r, LookupTimeout) for r in batch), batch
    with pytest.raises(LookupTimeout):
        await cluster.router.get(TABLE, "sensor-1", since=time.monotonic() - 1.0)  # spent: no replica is asked
    assert all(load.in_flight == 0 for load in cluster.router.load.snapshot().values())


async def test_response_lag_updates_the_overlay():
    cluster = Cluster()
    key = "sensor-14"
    p = part(key)
    active, standby = strictly_ordered(cluster, key)  # by the heartbeats: active lag 0, standby lag 1
    active.replicas[(TABLE, p)].end = 160  # the store now reports lag 60; heartbeats don't know yet
    result = await cluster.router.get(TABLE, key, Bound())
    assert (result.node, result.lag_offsets) == (active.node, 60)
    obs = cluster.router.overlay.get(active.node, TABLE, p)
    assert obs is not None and obs.end - obs.applied == 60
    # With max_lag=10 the router now knows the active is too far behind and goes to the standby directly.
    reads = active.reads
    result = await cluster.router.get(TABLE, key, Bound(max_lag=10))
    assert result.node == standby.node and active.reads == reads


async def test_no_candidates_raises_without_asking_anyone():
    cluster = Cluster()
    key = "sensor-15"
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, part(key))].end = 400
    cluster.refresh()
    with pytest.raises(NoReplicaWithinBound) as e:
        await cluster.router.get(TABLE, key, Bound(max_lag=3))
    assert e.value.details["freshest_lag"]["offsets"] == 300
    assert cluster.n1.reads + cluster.n2.reads == 0


async def test_a_position_ahead_of_the_view_is_asked_for_rather_than_refused():
    # A session read through this router at a position it saw through another router: this
    # router's view (its last heartbeats) has both replicas below it, though both have reached it.
    cluster = Cluster()
    key = "sensor-17"
    p = part(key)
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, p)].applied = node.replicas[(TABLE, p)].end = 97
    cluster.refresh()
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, p)].applied = node.replicas[(TABLE, p)].end = 100
    bound = Bound(min_position=Position(TABLE, {p: 100}))
    result = await cluster.router.get(TABLE, key, bound)
    assert result.found and result.applied == 100
    assert cluster.n1.reads + cluster.n2.reads == 1
    [batch] = await cluster.router.batch_get(TABLE, [key], bound)
    assert batch.found and batch.applied == 100
    # Beyond what any replica has reached: each refuses, and the caller hears their own lag.
    with pytest.raises(NoReplicaWithinBound) as e:
        await cluster.router.get(TABLE, key, Bound(min_position=Position(TABLE, {p: 120})))
    assert e.value.details["freshest_lag"]["offsets"] == 0
    assert cluster.n1.reads + cluster.n2.reads >= 3
    # With a lag bound the view says no replica meets, the read is still refused without asking anyone.
    cluster = Cluster()
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, p)].applied, node.replicas[(TABLE, p)].end = 97, 400
    cluster.refresh()
    with pytest.raises(NoReplicaWithinBound):
        await cluster.router.get(TABLE, key, Bound(max_lag=3, min_position=Position(TABLE, {p: 100})))
    assert cluster.n1.reads + cluster.n2.reads == 0


async def test_a_replica_the_view_puts_behind_is_asked_when_every_candidate_failed():
    # A session read at the offset the old active answered at; the active lets the partition
    # go (a drain) while the router's view still has the standby a few offsets behind it.
    cluster = Cluster()
    key = "sensor-16"
    p = part(key)
    active, standby = cluster.node_for(key, Role.ACTIVE), cluster.node_for(key, Role.STANDBY)
    standby.replicas[(TABLE, p)].applied = 97
    cluster.refresh()
    bound = Bound(min_position=Position(TABLE, {p: 100}))
    del active.replicas[(TABLE, p)]  # answers NOT_HOSTED from now on
    standby.replicas[(TABLE, p)].applied = 100  # caught up since its last heartbeat
    result = await cluster.router.get(TABLE, key, bound)
    assert (result.node, result.found, result.applied) == (standby.node, True, 100)
    [batch] = await cluster.router.batch_get(TABLE, [key], bound)
    assert batch.node == standby.node and batch.found
    # Still behind when asked: the caller is told so, with the lag the standby itself reported.
    standby.replicas[(TABLE, p)].applied = 98
    with pytest.raises(NoReplicaWithinBound) as e:
        await cluster.router.get(TABLE, key, bound)
    assert e.value.details["freshest_lag"]["node"] == standby.node


async def test_failover_keeps_working_under_concurrency_when_a_node_dies():
    cluster = Cluster(RouterSettings(hedge=False))
    cluster.n1.down = True
    results = await asyncio.gather(*(cluster.router.get(TABLE, f"sensor-{i % 24}") for i in range(300)))
    assert all(r.found and r.node == "n2" for r in results)


def test_latency_window_quantile():
    w = LatencyWindow(0.95, size=100, every=10, min_samples=20)
    for i in range(19):
        w.record(float(i))
    assert w.value_ms is None
    for i in range(81):
        w.record(float(i + 19))
    assert w.value_ms == 95.0


def test_page_token_round_trip_and_table_binding():
    token = encode_page_token("t", b"sensor-\x00\xff")
    assert decode_page_token("t", token) == b"sensor-\x00\xff"
    from freshroute.errors import InvalidArgument
    with pytest.raises(InvalidArgument):
        decode_page_token("other", token)


@pytest.mark.parametrize("bad", ["sensor-\ud800", 7, ("sensor-1",)])
async def test_a_key_that_is_not_unicode_text_is_an_invalid_argument_naming_it_and_reads_nothing(bad):
    """A lone surrogate has no UTF-8 form, and a key must be a string: the REST API's code, not an encoder's error."""
    from freshroute.errors import InvalidArgument

    cluster = Cluster()
    core = cluster.router
    with pytest.raises(InvalidArgument) as e:
        await core.get(TABLE, bad)
    assert e.value.details["field"] == "key"
    with pytest.raises(InvalidArgument) as e:
        await core.batch_get(TABLE, ["sensor-1", bad])
    assert e.value.details["field"] == "keys" and "keys[1]" in e.value.message
    with pytest.raises(InvalidArgument) as e:
        core.views.key_metadata(TABLE, bad)
    assert e.value.details["field"] == "key"
    if isinstance(bad, str):
        for field in ("prefix", "start", "end"):
            with pytest.raises(InvalidArgument) as e:
                await core.scans.rows(TABLE, **{field: bad})
            assert e.value.details["field"] == field
    assert cluster.n1.reads + cluster.n2.reads == 0
    assert (await core.get(TABLE, "sensor-1")).found  # the cache of key locations kept nothing of them

"""The synchronous client's driver: the attempt engine over blocking sockets, against real read ports on loopback.

Each fake node's answers are served as frames on a TCP port of its own (a thread), the
way a store node's read port serves them; a node can be told to misbehave.
"""

import socket
import time

import orjson
import pytest

from freshroute.client.blocking import BlockingStore, Request, run_blocking
from freshroute.errors import NoReplicaWithinBound, ReplicaUnavailable
from freshroute.bound import NO_BOUND, Bound
from freshroute.keys import serialize_key
from freshroute.metadata.roles import Role
from freshroute.wire import ReadStatus

from .read_port_support import ReadPort, tls_pair
from .routing_support import KEYS, TABLE, Cluster, part


@pytest.fixture
def world():
    from router.settings import RouterSettings

    cluster = Cluster(RouterSettings(request_timeout_ms=1000, attempt_timeout_ms=300, hedge=False))
    ports = {n.node: ReadPort(n) for n in (cluster.n1, cluster.n2)}
    cluster.refresh()
    store = BlockingStore(cluster.metadata)
    yield cluster, ports, store
    store.close()
    for p in ports.values():
        p.close()


def value(i):
    return orjson.dumps({"count": i, "avg": i / 2})


def get(cluster, store, key, bound=NO_BOUND):
    _, raw, plan = cluster.router.plan_get(TABLE, key, bound, time.monotonic())
    return run_blocking(store, [(plan, Request.get(TABLE, plan.partition, raw, plan.bound))])[0]


@pytest.mark.timeout(20)
def test_over_tls_each_read_is_answered_on_its_own_connection(tmp_path):
    from router.settings import RouterSettings

    tls, access = tls_pair(tmp_path)
    cluster = Cluster(RouterSettings(request_timeout_ms=1000, attempt_timeout_ms=300, hedge=False))
    ports = [ReadPort(n, tls=tls) for n in (cluster.n1, cluster.n2)]
    cluster.refresh()
    store = BlockingStore(cluster.metadata, access)
    try:
        for i in range(6):  # the connections kept, each with a session ticket read before an answer
            cand, r = get(cluster, store, KEYS[i])
            assert (r.status, r.value) == (ReadStatus.OK, value(i))
        assert sum(p.requests for p in ports) == 6
    finally:
        store.close()
        for p in ports:
            p.close()


def test_a_get_and_a_batch_read_every_key_from_the_read_ports(world):
    cluster, ports, store = world
    cand, r = get(cluster, store, KEYS[3])
    assert (r.status, r.value) == (ReadStatus.OK, value(3))
    cand, r = get(cluster, store, "nobody")
    assert r.status is ReadStatus.NOT_FOUND and r.replica.node == cand.replica.node
    _, bound, groups, raw = cluster.router.group_keys(TABLE, KEYS[:6] + ["nobody"], NO_BOUND)
    now = time.monotonic()
    jobs = [(cluster.router.plan_group(TABLE, p, bound, now, now + 1),
             Request.group(TABLE, p, [raw[i] for i in idx], bound)) for p, idx in groups.items()]
    answers = run_blocking(store, jobs)
    got = {}
    for (p, idx), (cand, group) in zip(groups.items(), answers):
        assert group.status is ReadStatus.OK and group.replica.node == cand.replica.node
        got.update({i: v for i, v in zip(idx, group.values)})
    assert [got[i] for i in range(7)] == [value(i) for i in range(6)] + [b""]
    # One request per group per read, over connections kept for the next read.
    assert sum(p.requests for p in ports.values()) == 2 + len(groups)


@pytest.mark.parametrize("mode", ["garbage", "close"])
def test_a_node_that_answers_garbage_or_closes_is_dropped_and_the_read_goes_on(world, mode):
    cluster, ports, store = world
    key = KEYS[5]
    active = cluster.node_for(key, Role.ACTIVE)
    cluster.node_for(key, Role.STANDBY).replicas[(TABLE, part(key))].end += 1  # the active is tried first
    cluster.refresh()
    ports[active.node].mode = mode
    cand, r = get(cluster, store, key)
    assert r.value == value(5) and cand.replica.node != active.node
    assert ports[active.node].requests == 1


def test_a_silent_node_is_given_up_on_after_the_attempt_timeout(world):
    cluster, ports, store = world
    key = KEYS[7]
    active = cluster.node_for(key, Role.ACTIVE)
    cluster.node_for(key, Role.STANDBY).replicas[(TABLE, part(key))].end += 1
    cluster.refresh()
    ports[active.node].mode = "silent"
    t0 = time.monotonic()
    cand, r = get(cluster, store, key)
    assert r.value == value(7) and cand.replica.node != active.node
    assert 0.25 < time.monotonic() - t0 < 0.9  # the attempt timeout (300 ms), not the request's


def test_a_group_every_replica_refuses_is_the_bound_error_with_the_freshest_lag(world):
    cluster, ports, store = world
    key = KEYS[2]
    p = part(key)
    for node, behind in ((cluster.n1, 4), (cluster.n2, 9)):
        node.replicas[(TABLE, p)].end += behind  # behind since the view was built
    now = time.monotonic()
    bound = Bound(max_lag=1)
    plan = cluster.router.plan_group(TABLE, p, bound, now, now + 1)
    [err] = run_blocking(store, [(plan, Request.group(TABLE, p, [serialize_key(key)], bound))])
    assert isinstance(err, NoReplicaWithinBound)
    assert err.details["freshest_lag"]["offsets"] == 4


def test_a_node_with_no_read_port_is_unavailable_not_a_hang(world):
    cluster, ports, store = world
    for n in (cluster.n1, cluster.n2):
        ports[n.node].close()
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        n.read_address = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there
        s.close()
    cluster.refresh()
    store.close()
    err = get(cluster, store, KEYS[1])
    assert isinstance(err, ReplicaUnavailable) and len(err.details["attempts"]) == 2


def test_a_windows_lookup_reads_its_key_range_over_a_blocking_connection():
    from router.settings import RouterSettings

    from .routing_support import WINDOWED, windowed_cluster

    cluster = windowed_cluster(RouterSettings(request_timeout_ms=1000, attempt_timeout_ms=300, hedge=False))
    ports = {n.node: ReadPort(n) for n in (cluster.n1, cluster.n2)}
    cluster.refresh()
    store = BlockingStore(cluster.metadata)
    try:
        r = cluster.router.plan_windows(WINDOWED, "s2", 0, 30_000, NO_BOUND, time.monotonic())
        plan = r.plan
        [(cand, answer)] = run_blocking(store, [(plan, Request.range(WINDOWED, plan.partition, r.lo, r.hi, r.limit,
                                                                     r.live, plan.bound))])
        result = r.result(cand, answer)
        assert [(w.start, orjson.loads(w.value), w.final) for w in result.windows] == [
            (0, {"count": 2}, True), (10_000, {"count": 3}, True), (20_000, {"count": 4}, False)]
        assert result.watermark_ms == 25_000 and result.node == cand.replica.node
    finally:
        store.close()
        for p in ports.values():
            p.close()

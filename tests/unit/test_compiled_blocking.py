"""The blocking client's key reads on the compiled path (freshroute.client.compiled_blocking), over read ports served by
threads on loopback: what it reads, and a node answering garbage, closing, or staying silent."""

from __future__ import annotations

import time

import orjson
import pytest

from freshroute.cluster_access import NodeAccess
from freshroute.bound import NO_BOUND, Bound
from freshroute.metadata.roles import Role

from .read_port_support import ReadPort, tls_pair
from .routing_support import KEYS, TABLE, Cluster, part

pytest.importorskip("freshroute_dataplane", reason="the compiled path is built by ./dev (native/dataplane)")


def value(i):
    return orjson.dumps({"count": i, "avg": i / 2})


@pytest.fixture
def world():
    yield from reads_over(None, NodeAccess(""))


@pytest.fixture
def tls_world(tmp_path):
    yield from reads_over(*tls_pair(tmp_path))


def reads_over(tls, access):
    from freshroute.client.compiled_blocking import blocking_compiled_reads
    from router.settings import RouterSettings

    cluster = Cluster(RouterSettings(request_timeout_ms=1000, attempt_timeout_ms=300, hedge=False))
    ports = {n.node: ReadPort(n, tls=tls) for n in (cluster.n1, cluster.n2)}
    cluster.refresh()
    reads = blocking_compiled_reads(cluster.router.policy, access, cluster.metadata, None, 1.0)
    assert reads is not None
    yield cluster, ports, reads
    reads.close()
    for p in ports.values():
        p.close()


def test_a_get_and_a_batch_read_their_keys_on_the_calling_thread(world):
    cluster, ports, reads = world
    got = reads.get(TABLE, TABLE, KEYS[3], NO_BOUND)
    assert got is not None and (got.key, got.found, got.raw_value, got.partition) == (KEYS[3], True, value(3),
                                                                                        part(KEYS[3]))
    assert got.node in ("n1", "n2") and got.lag_offsets == 0
    absent = reads.get(TABLE, TABLE, "nobody", Bound(max_lag=5))
    assert absent is not None and (absent.found, absent.raw_value) == (False, None)
    batch = reads.get_many(TABLE, TABLE, KEYS[:6] + ["nobody"], NO_BOUND)
    assert batch is not None
    assert [(x.key, x.raw_value) for x in batch] == [(k, value(i)) for i, k in enumerate(KEYS[:6])] + [("nobody", None)]
    # One connection per node, kept: a get's one frame, a batch's groups one frame per node they go to.
    assert sum(p.requests for p in ports.values()) == 2 + len({x.node for x in batch})


@pytest.mark.timeout(20)  # a blocking read of a ticket's bytes waits for ever
def test_over_tls_a_read_waits_only_on_data_not_on_the_bytes_a_session_ticket_sends(tls_world):
    # Every node's connection is open and waited on; those a read did not go to have only their tickets to read.
    _, ports, reads = tls_world
    t0 = time.monotonic()
    for i in range(4):
        got = reads.get(TABLE, TABLE, KEYS[i], NO_BOUND)
        assert got is not None and got.raw_value == value(i)
    batch = reads.get_many(TABLE, TABLE, KEYS[:6], NO_BOUND)
    assert batch is not None and [x.raw_value for x in batch] == [value(i) for i in range(6)]
    assert time.monotonic() - t0 < 0.25  # no attempt timed out (300 ms each)
    assert sum(p.requests for p in ports.values()) == 4 + len({x.node for x in batch})


def test_a_bound_it_does_not_judge_is_left_to_the_python_path(world):
    _, ports, reads = world
    assert reads.get(TABLE, TABLE, KEYS[1], Bound(wait_ms=100)) is None
    assert reads.get_many(TABLE, TABLE, KEYS[:2], Bound(version=1)) is None
    assert sum(p.requests for p in ports.values()) == 0


@pytest.mark.parametrize("mode", ["garbage", "close"])
def test_a_node_that_answers_garbage_or_closes_gives_the_read_to_the_python_path(world, mode):
    cluster, ports, reads = world
    key = KEYS[5]
    active = cluster.node_for(key, Role.ACTIVE)
    cluster.node_for(key, Role.STANDBY).replicas[(TABLE, part(key))].end += 1  # the active is the freshest
    cluster.refresh()
    ports[active.node].mode = mode
    assert reads.get(TABLE, TABLE, key, NO_BOUND) is None
    assert ports[active.node].requests == 1
    # The next view opens a new connection, and a node that answers again is read again.
    ports[active.node].mode = "ok"
    cluster.refresh()
    again = reads.get(TABLE, TABLE, key, NO_BOUND)
    assert again is not None and again.raw_value == value(5)


def test_a_silent_node_gives_the_read_to_the_python_path_at_the_attempt_timeout(world):
    cluster, ports, reads = world
    key = KEYS[7]
    active = cluster.node_for(key, Role.ACTIVE)
    cluster.node_for(key, Role.STANDBY).replicas[(TABLE, part(key))].end += 1
    cluster.refresh()
    ports[active.node].mode = "silent"
    t0 = time.monotonic()
    assert reads.get(TABLE, TABLE, key, NO_BOUND) is None
    assert 0.29 < time.monotonic() - t0 < 0.9  # the attempt timeout (300 ms), not the request's

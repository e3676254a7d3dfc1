"""The synchronous client's driver: the attempt engine over blocking sockets, against real read ports on loopback.

Each fake node's answers are served as frames on a TCP port of its own (a thread), the
way a store node's read port serves them; a node can be told to misbehave.
"""

import socket
import socketserver
import threading
import time

import orjson
import pytest

from freshroute.client.blocking import BlockingStore, Request, run_blocking
from freshroute.errors import NoReplicaWithinBound, ReplicaUnavailable
from freshroute.bound import NO_BOUND, Bound
from freshroute.keys import serialize_key
from freshroute.metadata.roles import Role
from freshroute.wire import FrameReader, ReadStatus, frame
from proto import store_pb2

from .routing_support import KEYS, TABLE, Cluster, part


def _status(s):
    return store_pb2.ReplicaStatus(node=s.node, role=store_pb2.ACTIVE if s.role is Role.ACTIVE else store_pb2.STANDBY,
                                   applied_offset=s.applied, end_offset=s.end, lag_offsets=s.lag_offsets,
                                   staleness_ms=s.staleness_ms)


def answer(node, batch):
    """What a store node answers: the fake node's data, on the wire."""
    out = store_pb2.ResultBatch()
    for r in batch.reads:
        got = node.answer(r.table, r.partition, r.key, NO_BOUND)
        out.results.add(id=r.id, status=int(got.status), value=got.value, replica=_status(got.replica))
    for g in batch.groups:
        bound = Bound(max_lag=g.bound.max_lag) if g.bound.HasField("max_lag") else NO_BOUND
        why = node.refusal(g.table, g.partition, bound)
        status = _status(node.status(g.table, g.partition))
        if why is not None:
            out.groups.add(id=g.id, status=store_pb2.TOO_STALE, replica=status, message=why)
            continue
        data = node.replicas[(g.table, g.partition)].data
        out.groups.add(id=g.id, status=store_pb2.OK, replica=status, values=[data.get(k, b"") for k in g.keys])
    for r in batch.ranges:
        from freshroute.windows import WATERMARK_KEY, live_starts, parse_watermark

        data = node.replicas[(r.table, r.partition)].data
        watermark = parse_watermark(data.get(WATERMARK_KEY))
        keep = live_starts(r.window.from_ms, r.window.to_ms, r.window.life_ms, watermark)
        rows = [(k, v) for k, v in sorted(data.items()) if r.start <= k < r.end and keep(k)][:r.limit]
        out.ranges.add(id=r.id, status=store_pb2.OK, replica=_status(node.status(r.table, r.partition)),
                       watermark_ms=-1 if watermark is None else watermark,
                       entries=[store_pb2.ScanEntry(key=k, value=v) for k, v in rows])
    return out


class ReadPort:
    """A thread serving one fake node's read port; ``mode`` is how it answers: ok, garbage, close or silent."""

    def __init__(self, node, mode="ok"):
        self.node, self.mode, self.requests = node, mode, 0
        port_self = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                frames = FrameReader()
                while data := self.request.recv(65536):
                    for payload in frames.feed(data):
                        port_self.requests += 1
                        if port_self.mode == "garbage":
                            self.request.sendall(frame(b"\xff\xff\xff"))
                        elif port_self.mode == "close":
                            return
                        elif port_self.mode == "ok":
                            batch = store_pb2.ReadBatch.FromString(payload)
                            self.request.sendall(frame(answer(port_self.node, batch).SerializeToString()))

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        node.read_address = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


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

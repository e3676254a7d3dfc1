"""The router as a real process, over real Redis, in front of three real store nodes (tests/integration/
router_deployment.py): REST and gRPC, two routers sharing the ports, a store node killed, Redis hung and lost."""

from __future__ import annotations

import json
import os
import signal
import time

import grpc
import httpx
import pytest
import redis

from freshroute.keys import partition_for, serialize_key
from freshroute.metadata.schema import Keys
from proto import router_pb2, router_pb2_grpc
from tests.integration.router_deployment import KEYS, LAYOUT, NODES, PARTITIONS, TABLE, Deployment, Procs, value_of
from tests.integration.stack_fixture import wait_until
from tools.local.services import free_port, start_redis

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no Spark, no shared stack: runs beside the others


@pytest.fixture
def deployment(tmp_path, broker, redis_url, namespace):
    procs = Procs(tmp_path)
    d = Deployment(procs, broker, redis_url, namespace)
    try:
        yield d
    finally:
        procs.stop_all()


def lookup_loop(d: Deployment, seconds: float, grpc_stub=None, during=None) -> tuple[list[str | None], list[str]]:
    """Look keys up for ``seconds``: the serving node of each lookup in order (None if it failed), and failures."""
    failures: list[str] = []
    served: list[str | None] = []
    end = time.monotonic() + seconds
    with httpx.Client(base_url=d.rest, timeout=10) as client:
        while time.monotonic() < end:
            n = len(served)
            i = n % KEYS
            if during:
                during(n)
            node = None
            try:
                if grpc_stub is not None and n % 2:
                    resp = grpc_stub.Get(router_pb2.GetRequest(table=TABLE, key=f"sensor-{i}"), timeout=10)
                    ok, value, node = resp.found, json.loads(resp.value_json), resp.served_by.node
                else:
                    r = client.get(f"/v1/tables/{TABLE}/keys/sensor-{i}")
                    body = r.json()
                    ok = r.status_code == 200
                    value, node = (body["value"], body["served_by"]["node"]) if ok else (body, None)
                if not ok or value != value_of(i):
                    failures.append(f"sensor-{i}: {value}")
                    node = None
            except (httpx.HTTPError, grpc.RpcError) as e:
                failures.append(f"sensor-{i}: {e}")
                node = None
            served.append(node)
    return served, failures


# ---- tests --------------------------------------------------------------------------------

def test_router_process_serves_rest_and_grpc(deployment):
    d = deployment
    d.up()
    with httpx.Client(base_url=d.rest, timeout=5) as c:
        for i in range(KEYS):
            r = c.get(f"/v1/tables/{TABLE}/keys/sensor-{i}")
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["value"] == value_of(i)
            assert body["partition"] == partition_for(serialize_key(f"sensor-{i}"), PARTITIONS)
            p = body["partition"]
            # Caught up: no offset behind; its time behind is known (a node confirms its end with each fetch
            # response, so it may say a second or so on a busy machine).
            assert body["served_by"]["node"] in LAYOUT[p] and body["lag"]["offsets"] == 0
            assert isinstance(body["lag"]["ms"], int) and 0 <= body["lag"]["ms"] < 10_000, body["lag"]
            assert body["served_by"]["role"] == ("active" if body["served_by"]["node"] == LAYOUT[p][0] else "standby")
        missing = c.get(f"/v1/tables/{TABLE}/keys/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "KEY_NOT_FOUND"
        assert missing.json()["error"]["partition"] == partition_for(b"nope", PARTITIONS)
        batch = c.post(f"/v1/tables/{TABLE}/keys:batchGet", json={"keys": ["sensor-1", "nope", "sensor-30"]}).json()
        assert [x["found"] for x in batch["results"]] == [True, False, True]
        assert batch["results"][2]["value"] == value_of(30)
        scan = c.get(f"/v1/tables/{TABLE}/scan", params={"limit": 1000}).json()
        assert [x["key"] for x in scan["items"]] == sorted(f"sensor-{i}" for i in range(KEYS))
        cluster = c.get("/v1/cluster").json()
        assert [(n["node"], n["alive"]) for n in cluster["nodes"]] == [(n, True) for n in NODES]
        assert cluster["assignment_generation"] == d.generation
        assert "freshroute_router_lookups_total" in c.get("/metrics").text
    with grpc.insecure_channel(f"127.0.0.1:{d.grpc_port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        for i in range(KEYS):
            resp = stub.Get(router_pb2.GetRequest(table=TABLE, key=f"sensor-{i}"), timeout=5)
            assert resp.found and json.loads(resp.value_json) == value_of(i)
        with pytest.raises(grpc.RpcError) as e:
            stub.Get(router_pb2.GetRequest(table=TABLE, key="nope"), timeout=5)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        trailer = dict(e.value.trailing_metadata())["freshroute-error"]
        assert json.loads(trailer)["error"]["code"] == "KEY_NOT_FOUND"
        with pytest.raises(grpc.RpcError) as e:
            stub.Get(router_pb2.GetRequest(table=TABLE, key="k", bound=router_pb2.Bound(max_lag=-2)), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert d.stop_router() == 0  # SIGTERM: graceful, clean exit
    assert "Traceback" not in d.procs.log("router")


def _established(pid: int, port: int) -> int:
    """TCP connections of process ``pid`` whose local port is ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "01":  # 01: ESTABLISHED
                    inodes.add(cols[9])
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        count += link.startswith("socket:[") and link[8:-1] in inodes
    return count


def _lookups_ok(url: str) -> int:
    from prometheus_client.parser import text_string_to_metric_families

    return int(sum(s.value for f in text_string_to_metric_families(httpx.get(url, timeout=5).text)
                   for s in f.samples if s.name == "freshroute_router_lookups_total" and s.labels["outcome"] == "ok"))


def test_routers_sharing_the_ports_both_serve_and_either_can_go(deployment):
    d = deployment
    d.nodes_up()
    metrics = [free_port(), free_port()]
    first = d.start_router("router", reuse_port=True, metrics_port=metrics[0])
    second = d.start_router("router-2", reuse_port=True, metrics_port=metrics[1])
    d.wait_caught_up()
    clients = [httpx.Client(base_url=d.rest, timeout=5) for _ in range(24)]
    try:
        for n, c in enumerate(clients):  # one connection each, kept open
            r = c.get(f"/v1/tables/{TABLE}/keys/sensor-{n}")
            assert r.status_code == 200 and r.json()["value"] == value_of(n)
        held = [_established(p.pid, d.rest_port) for p in (first, second)]
        # The kernel spreads new connections over both (24 all on one: a chance of 2 in 10⁷).
        assert sum(held) == len(clients) and min(held) > 0, held
        # Each process counts its own lookups on its own metrics port: together, every lookup once.
        served = [_lookups_ok(f"http://127.0.0.1:{port}/metrics") for port in metrics]
        assert served == held, (served, held)
    finally:
        for c in clients:
            c.close()
    first.send_signal(signal.SIGTERM)
    assert first.wait(15) == 0
    # The one left holds both ports alone.
    with httpx.Client(base_url=d.rest, timeout=5) as c:
        for i in range(KEYS):
            r = c.get(f"/v1/tables/{TABLE}/keys/sensor-{i}", headers={"connection": "close"})
            assert r.status_code == 200 and r.json()["value"] == value_of(i)
    with grpc.insecure_channel(f"127.0.0.1:{d.grpc_port}") as channel:
        resp = router_pb2_grpc.RouterStub(channel).Get(router_pb2.GetRequest(table=TABLE, key="sensor-7"), timeout=5)
        assert resp.found and json.loads(resp.value_json) == value_of(7)
    assert second.poll() is None


def test_lookups_fail_over_when_a_store_node_is_killed(deployment):
    d = deployment
    d.up()
    killed_at = 150

    def kill_n1(n):
        if n == killed_at:
            d.procs.procs["n1"].kill()

    with grpc.insecure_channel(f"127.0.0.1:{d.grpc_port}") as channel:
        served, failures = lookup_loop(d, 4.0, router_pb2_grpc.RouterStub(channel), during=kill_n1)
    assert len(served) > killed_at + 100, "too few lookups after the kill to say anything"
    assert failures == []
    assert "n1" in served[:killed_at]
    # Right after the kill, n1's partitions are served by their other replica.
    assert served[killed_at + 2:].count("n1") == 0
    assert {"n2", "n3"} <= set(served[killed_at + 2:])
    # The dead node's heartbeat expires (node_expiry_ms, 2 s): the router no longer lists it as alive. Waited for on its
    # own: the lookups above end 4 s after they start, whenever the kill came among them.
    def n1_alive() -> bool:
        cluster = httpx.get(f"{d.rest}/v1/cluster", timeout=5).json()
        return {x["node"]: x["alive"] for x in cluster["nodes"]}.get("n1", False)

    wait_until(lambda: n1_alive() is False, 10, "the router to list n1 as dead")
    d.procs.procs["n1"].wait(5)


def test_redis_outage_fails_no_lookup(tmp_path, broker, namespace):
    own_redis = start_redis(tmp_path / "redis")
    port = int(own_redis.address.rsplit(":", 1)[1].split("/")[0])
    procs = Procs(tmp_path)
    d = Deployment(procs, broker, own_redis.address, namespace)
    restarted = None
    try:
        # n2 and n3 heartbeat only once a second: after Redis comes back empty, partition 1
        # (on n2 and n3) has no heartbeat for up to a second while n1's is already back.
        d.up(slow_heartbeats=("n2", "n3"))
        served, failures = lookup_loop(d, 0.5)
        # 1. Redis hangs (SIGSTOP) for 3 s — longer than node_expiry_ms — then resumes.
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        try:
            served_a, failures_a = lookup_loop(d, 3.0)
            # Liveness was frozen at the last good refresh: nobody was declared dead.
            cluster = httpx.get(f"{d.rest}/v1/cluster", timeout=5).json()
            assert all(x["alive"] for x in cluster["nodes"]) and cluster["metadata"]["redis_ok"] is False
        finally:
            os.kill(own_redis.proc.pid, signal.SIGCONT)
        served_b, failures_b = lookup_loop(d, 1.5)
        # 2. Redis dies and comes back empty on the same port; the nodes republish their
        #    heartbeats, one of them takes the assignor lease the test's lease went with, and the tables are
        #    registered again a second later (as the pipeline does), for that node to assign.
        own_redis.stop()
        served_c, failures_c = lookup_loop(d, 2.0)
        restarted = start_redis(tmp_path / "redis-again", port=port)
        reregister_at = time.monotonic() + 1.0
        registered: list[bool] = []

        def reregister(_):
            if not registered and time.monotonic() > reregister_at:
                registered.append(True)
                d.register_tables()

        served_d, failures_d = lookup_loop(d, 3.0, during=reregister)
        assert failures + failures_a + failures_b + failures_c + failures_d == []
        assert min(len(served_a), len(served_c), len(served_d)) > 50
        assert set(served_a) == set(NODES) and set(served_d) == set(NODES)
        r = redis.Redis.from_url(restarted.address)
        assert r.hlen(Keys(namespace).beats) == 3  # the nodes did republish
        r.close()
        assert httpx.get(f"{d.rest}/readyz", timeout=5).status_code == 200
    finally:
        procs.stop_all()
        for svc in (own_redis, restarted):
            if svc is not None:
                if svc.proc.poll() is None:
                    os.kill(svc.proc.pid, signal.SIGCONT)
                svc.stop()



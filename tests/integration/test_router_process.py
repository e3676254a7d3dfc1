"""The router as a real process, over real Redis, in front of small in-memory store nodes.

The store nodes here are a few lines of asyncio answering a read port's frames from a dict
and heartbeating to Redis like a real node; each runs as its own process (started
with ``python -m tests.integration.test_router_process store ...``) so a test can kill it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
import redis

from freshroute.keys import partition_for, serialize_key
from tools.local.services import free_port, start_redis, wait_for_port
from freshroute.metadata import Assignment, Keys, MetadataStore, NodeReport, ReplicaReport, ReplicaState, Role, TableSpec
from freshroute.windows import tumbling
from proto import router_pb2, router_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no Spark, no shared stack: runs beside the others

ROOT = Path(__file__).resolve().parents[2]
TABLE = "sensor_stats"
PARTITIONS = 4
NODES = ("n1", "n2", "n3")
# Partition p: active on NODES[p % 3], standby on the next node.
LAYOUT = {p: (NODES[p % 3], NODES[(p + 1) % 3]) for p in range(PARTITIONS)}
KEYS = 40
APPLIED = 1000
# A windowed table beside it: every key has windows starting at 0, 10 s and 20 s; the watermark is at 15 s.
WINDOWED = "sensor_windows"
WINDOW_STARTS = (0, 10_000, 20_000)
WATERMARK_MS = 15_000


def value_of(i: int) -> dict:
    return {"count": i, "sum": i * 1.5}


# ---- the in-memory store node (runs in its own process) -----------------------------------

async def serve_store(node: str, port: int, redis_url: str, namespace: str, active: set[int], standby: set[int],
                      heartbeat_s: float) -> None:
    from freshroute.wire import FrameReader, frame
    from freshroute.windows import WATERMARK_KEY, live_starts, watermark_value, window_key
    from proto import store_pb2

    hosted = active | standby
    rows: dict[int, dict[bytes, bytes]] = {p: {} for p in hosted}
    windows: dict[int, dict[bytes, bytes]] = {p: {WATERMARK_KEY: watermark_value(WATERMARK_MS)} for p in hosted}
    for i in range(KEYS):
        key = serialize_key(f"sensor-{i}")
        p = partition_for(key, PARTITIONS)
        if p in hosted:
            rows[p][key] = orjson.dumps(value_of(i))
            for start in WINDOW_STARTS:
                windows[p][window_key(key, start)] = orjson.dumps({"count": i})

    def status(p: int) -> store_pb2.ReplicaStatus:
        act = p in active
        return store_pb2.ReplicaStatus(node=node, role=store_pb2.ACTIVE if act else store_pb2.STANDBY,
                                       state=store_pb2.SERVING_ACTIVE if act else store_pb2.SERVING_STANDBY,
                                       applied_offset=APPLIED, end_offset=APPLIED, lag_offsets=0, staleness_ms=0)

    def answer(r: store_pb2.KeyRead) -> store_pb2.KeyResult:
        if r.table != TABLE or r.partition not in rows:
            return store_pb2.KeyResult(id=r.id, status=store_pb2.NOT_HOSTED)
        if r.bound.min_offset > APPLIED:
            return store_pb2.KeyResult(id=r.id, status=store_pb2.TOO_STALE, replica=status(r.partition))
        value = rows[r.partition].get(r.key)
        if value is None:
            return store_pb2.KeyResult(id=r.id, status=store_pb2.NOT_FOUND, replica=status(r.partition))
        return store_pb2.KeyResult(id=r.id, status=store_pb2.OK, value=value, replica=status(r.partition))

    def answer_group(g: store_pb2.GroupRead) -> store_pb2.GroupResult:
        reads = [answer(store_pb2.KeyRead(id=g.id, table=g.table, partition=g.partition, key=k, bound=g.bound))
                 for k in g.keys]
        refused = next((r for r in reads if r.status not in (store_pb2.OK, store_pb2.NOT_FOUND)), None)
        if refused is not None:
            return store_pb2.GroupResult(id=g.id, status=refused.status, replica=refused.replica)
        return store_pb2.GroupResult(id=g.id, status=store_pb2.OK, replica=status(g.partition),
                                     values=[r.value for r in reads])

    def answer_range(r: store_pb2.RangeRead) -> store_pb2.RangeResult:
        held = {WINDOWED: windows, TABLE: rows}.get(r.table, {})
        if r.partition not in held:
            return store_pb2.RangeResult(id=r.id, status=store_pb2.NOT_HOSTED)
        if r.bound.min_offset > APPLIED:
            return store_pb2.RangeResult(id=r.id, status=store_pb2.TOO_STALE, replica=status(r.partition))
        keep = live_starts(r.window.from_ms, r.window.to_ms, r.window.life_ms, WATERMARK_MS) \
            if r.HasField("window") else (lambda _k: True)
        entries = [(k, v) for k, v in sorted(held[r.partition].items())
                   if k >= r.start and (not r.end or k < r.end) and keep(k)][:r.limit]
        return store_pb2.RangeResult(id=r.id, status=store_pb2.OK, replica=status(r.partition),
                                     watermark_ms=WATERMARK_MS,
                                     entries=[store_pb2.ScanEntry(key=k, value=v) for k, v in entries])

    def answer_batch(batch: store_pb2.ReadBatch) -> store_pb2.ResultBatch:
        return store_pb2.ResultBatch(results=[answer(r) for r in batch.reads],
                                     groups=[answer_group(g) for g in batch.groups],
                                     ranges=[answer_range(r) for r in batch.ranges])

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The read port: each ReadBatch frame answered by one ResultBatch frame, in order.
        frames = FrameReader()
        try:
            while data := await reader.read(65536):
                for payload in frames.feed(data):
                    writer.write(frame(answer_batch(store_pb2.ReadBatch.FromString(payload)).SerializeToString()))
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)  # noqa: F841 — serves while this runs
    md = MetadataStore.from_url(redis_url, namespace, timeout_s=0.3)
    while True:
        report = NodeReport(node, f"127.0.0.1:{port}", int(time.time() * 1000), tuple(
            ReplicaReport(table, p, Role.ACTIVE if p in active else Role.STANDBY,
                          ReplicaState.ACTIVE if p in active else ReplicaState.STANDBY, APPLIED, APPLIED, 0)
            for table in (TABLE, WINDOWED) for p in sorted(hosted)), read_address=f"127.0.0.1:{port}")
        try:
            await asyncio.to_thread(md.publish_node, report, int(heartbeat_s * 3000))
        except Exception:  # noqa: BLE001 — Redis may be down; a real node keeps serving too
            pass
        await asyncio.sleep(heartbeat_s)


def _store_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--node")
    p.add_argument("--port", type=int)
    p.add_argument("--redis-url")
    p.add_argument("--namespace")
    p.add_argument("--active", default="")
    p.add_argument("--standby", default="")
    p.add_argument("--heartbeat-s", type=float, default=0.1)
    a = p.parse_args(argv)
    ints = lambda text: {int(x) for x in text.split(",") if x}  # noqa: E731
    asyncio.run(serve_store(a.node, a.port, a.redis_url, a.namespace, ints(a.active), ints(a.standby),
                            a.heartbeat_s))


# ---- fixtures -----------------------------------------------------------------------------

class Procs:
    """Processes this test started, each ended by its own handle."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


class Deployment:
    def __init__(self, procs: Procs, redis_url: str, namespace: str) -> None:
        self.procs = procs
        self.redis_url = redis_url
        self.namespace = namespace
        self.store_ports: dict[str, int] = {}
        self.rest_port = free_port()
        self.grpc_port = free_port()
        self.rest = f"http://127.0.0.1:{self.rest_port}"

    def register(self) -> None:
        """What the pipeline and the assignor would publish."""
        meta = MetadataStore.from_url(self.redis_url, self.namespace)
        meta.register_tables([TableSpec(TABLE, f"{TABLE}-changelog", PARTITIONS, "sensor_id",
                                        {"count": "long", "sum": "double"}, 1),
                              TableSpec(WINDOWED, f"{WINDOWED}-changelog", PARTITIONS, "sensor_id", {"count": "long"},
                                        1, window=tumbling("10s"))])
        generation = self.generation = meta.try_acquire_assignor("test", 600_000)
        assert generation is not None
        meta.write_assignment(Assignment(generation, {(t, p): nodes for t in (TABLE, WINDOWED)
                                                      for p, nodes in LAYOUT.items()}), "test", generation)
        meta.redis.close()

    def start_store(self, node: str, heartbeat_s: float = 0.1) -> None:
        port = self.store_ports.setdefault(node, free_port())
        active = [p for p, nodes in LAYOUT.items() if nodes[0] == node]
        standby = [p for p, nodes in LAYOUT.items() if node in nodes[1:]]
        proc = self.procs.start(node, ["-m", "tests.integration.test_router_process", "store", "--node", node,
                                       "--port", str(port), "--redis-url", self.redis_url,
                                       "--namespace", self.namespace, "--active", ",".join(map(str, active)),
                                       "--standby", ",".join(map(str, standby)), "--heartbeat-s", str(heartbeat_s)])
        wait_for_port("127.0.0.1", port, 20, proc)

    def start_router(self, name: str = "router", reuse_port: bool = False, metrics_port: int | None = None
                     ) -> subprocess.Popen:
        env = {"FRESHROUTE_REDIS_URL": self.redis_url, "FRESHROUTE_NAMESPACE": self.namespace,
               "FRESHROUTE_HOST": "127.0.0.1", "FRESHROUTE_REST_PORT": str(self.rest_port),
               "FRESHROUTE_GRPC_PORT": str(self.grpc_port), "FRESHROUTE_REFRESH_MS": "100",
               "FRESHROUTE_NODE_EXPIRY_MS": "2000", "FRESHROUTE_REDIS_TIMEOUT_MS": "300",
               "FRESHROUTE_REUSE_PORT": "true" if reuse_port else "false",
               **({"FRESHROUTE_METRICS_PORT": str(metrics_port)} if metrics_port is not None else {})}
        proc = self.procs.start(name, ["-m", "router"], env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, self.procs.log(name)
            try:
                # With a shared port, the readiness answer may come from another router:
                # this one is also waited for by its own start-up line.
                r = httpx.get(f"{self.rest}/readyz", timeout=1)
                if (r.status_code == 200 and r.json()["nodes"] >= len(self.store_ports)
                        and "router serving" in self.procs.log(name)):
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{name} never became ready:\n" + self.procs.log(name))

    def up(self, slow_heartbeats: tuple[str, ...] = ()) -> None:
        self.register()
        for node in NODES:
            self.start_store(node, 1.0 if node in slow_heartbeats else 0.1)
        self.start_router()

    def stop_router(self) -> int:
        proc = self.procs.procs["router"]
        proc.send_signal(signal.SIGTERM)
        return proc.wait(15)


@pytest.fixture
def deployment(tmp_path, redis_url, namespace):
    procs = Procs(tmp_path)
    d = Deployment(procs, redis_url, namespace)
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
            assert body["served_by"]["node"] in LAYOUT[p] and body["lag"] == {"offsets": 0, "ms": 0}
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
    d.register()
    for node in NODES:
        d.start_store(node)
    metrics = [free_port(), free_port()]
    first = d.start_router("router", reuse_port=True, metrics_port=metrics[0])
    second = d.start_router("router-2", reuse_port=True, metrics_port=metrics[1])
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
    # The dead node's heartbeat has expired by now: the router no longer lists it as alive.
    cluster = httpx.get(f"{d.rest}/v1/cluster", timeout=5).json()
    assert {x["node"]: x["alive"] for x in cluster["nodes"]}.get("n1", False) is False
    d.procs.procs["n1"].wait(5)


def test_redis_outage_fails_no_lookup(tmp_path, namespace):
    own_redis = start_redis(tmp_path / "redis")
    port = int(own_redis.address.rsplit(":", 1)[1].split("/")[0])
    procs = Procs(tmp_path)
    d = Deployment(procs, own_redis.address, namespace)
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
        #    heartbeats, the tables are registered again a second later.
        own_redis.stop()
        served_c, failures_c = lookup_loop(d, 2.0)
        restarted = start_redis(tmp_path / "redis-again", port=port)
        reregister_at = time.monotonic() + 1.0
        registered: list[bool] = []

        def reregister(_):
            if not registered and time.monotonic() > reregister_at:
                registered.append(True)
                d.register()

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


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "store":
    _store_main(sys.argv[2:])

"""Freshest-replica routing with caller-set bounds, on the real stack (3 store nodes, 1 standby)."""

from __future__ import annotations

import random
import threading
import time

import grpc
import httpx
import orjson
import pytest

from freshroute.position import Position
from freshroute.keys import partition_for, serialize_key
from loadtest.readport import read_batch
from loadtest.scenario import Fault, LoadConfig, run
from proto import router_pb2, router_pb2_grpc, store_pb2, store_pb2_grpc
from tests.integration.stack_fixture import produce_and_serve, produce_readings, wait_until

SENSORS = 24


@pytest.fixture(scope="module")
def client(stack):
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def readings(stack):
    rng = random.Random(5)
    events = [{"sensor": f"sensor-{i % SENSORS}", "area": "engine", "reading": round(rng.uniform(0, 100), 2)}
              for i in range(600)]
    produce_and_serve(stack, events)
    return events


class Writer:
    """Keeps producing readings in the background until its block ends (at most ``duration_s``)."""

    def __init__(self, stack, rate: float, duration_s: float, seed: int, keys: int = SENSORS) -> None:
        self.stack, self.rate, self.duration_s, self.keys = stack, rate, duration_s, keys
        self.rng = random.Random(seed)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.stop = threading.Event()

    def _run(self) -> None:
        end = time.monotonic() + self.duration_s
        while time.monotonic() < end and not self.stop.is_set():
            batch = [{"sensor": f"sensor-{self.rng.randrange(self.keys)}", "area": "engine",
                      "reading": round(self.rng.uniform(0, 100), 2)} for _ in range(max(1, int(self.rate / 10)))]
            produce_readings(self.stack, batch)
            time.sleep(0.1)

    def __enter__(self) -> "Writer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)


def test_malformed_bounds_are_rejected(stack, client, readings):
    for params in ({"max_lag": "-1"}, {"max_lag": "abc"}, {"max_staleness_ms": "-5"}, {"max_staleness_ms": "1e3x"},
                   {"min_position": "garbage"}, {"min_position": "p1.!!"}):
        r = client.get("/v1/tables/sensor_stats/keys/sensor-1", params=params)
        assert r.status_code == 400, (params, r.text)
        assert r.json()["error"]["code"] == "INVALID_ARGUMENT", params
    with grpc.insecure_channel(stack.config.grpc_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        for bound in (router_pb2.Bound(max_lag=-1), router_pb2.Bound(max_staleness_ms=-1),
                      router_pb2.Bound(min_position="garbage")):
            with pytest.raises(grpc.RpcError) as e:
                stub.Get(router_pb2.GetRequest(table="sensor_stats", key="sensor-1", bound=bound), timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bound
            trailer = dict(e.value.trailing_metadata())["freshroute-error"]
            assert orjson.loads(trailer)["error"]["code"] == "INVALID_ARGUMENT"


def test_min_position_never_reads_backwards(stack, client, readings):
    """Each lookup passes the previous answer's position: counts and positions never go back."""
    sensor = "sensor-3"
    partition = partition_for(serialize_key(sensor), 8)
    token, last_count, last_offset, served = None, 0, 0, set()
    with Writer(stack, rate=60, duration_s=6, seed=9):
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            params = {"min_position": token} if token else {}
            r = client.get(f"/v1/tables/sensor_stats/keys/{sensor}", params=params)
            if r.status_code == 503:  # no replica reached that position yet: allowed, never an older value
                assert r.json()["error"]["code"] == "NO_REPLICA_WITHIN_BOUND"
                continue
            assert r.status_code == 200, r.text
            body = r.json()
            offset = Position.decode(body["position"]).offset_for(partition)
            assert offset >= last_offset, (offset, last_offset)
            assert body["value"]["count"] >= last_count, (body, last_count)
            token, last_count, last_offset = body["position"], body["value"]["count"], offset
            served.add(body["served_by"]["node"])
    assert last_count > 0 and len(served) >= 1


def test_lagging_replica_serves_only_bounds_it_meets(stack, client, readings, tmp_path):
    """A node that applies slowly is never chosen for max_lag=0 and still answers loose bounds."""
    victim = "store-node-3"
    stack.stop(victim)
    stack.start(victim, "--apply-rate-limit", "1")
    node_id = stack.components[victim].addresses["node_id"]
    address = stack.components[victim].addresses["address"]

    def victim_lag() -> int:
        cluster = client.get("/v1/cluster").json()
        node = next((n for n in cluster["nodes"] if n["node"] == node_id), None)
        if not node or not node.get("alive"):
            return -1
        # A replica that has not learnt its end offset yet (just restarted) has no offset lag to count.
        return max((r["lag"]["offsets"] for r in node["replicas"] if r["lag"]["offsets"] is not None), default=-1)

    try:
        strict_by_node: dict[str, int] = {}
        cfg = LoadConfig(keys=SENSORS, protocol="both", concurrency=4, rate=60.0, duration_s=5.0, timeout_s=5.0,
                         bound_mix="max_lag=0:3,none:1", seed=4)
        # Many distinct keys, so that every micro-batch puts many records on the changelog.
        with Writer(stack, rate=150, duration_s=40, seed=10, keys=3000):
            wait_until(lambda: victim_lag() >= 10, 90, f"{victim} to fall behind")
            summary = run(stack, cfg, [], tmp_path / "lagging", check=True, plots=False, title="lagging-replica")
            # Direct to the lagging node: it refuses max_lag=0, and answers a bound it meets.
            with grpc.insecure_channel(address) as channel:
                store = store_pb2_grpc.StoreNodeStub(channel)
                status = store.Status(store_pb2.StatusRequest(), timeout=5)
                lagging = [name for r, name in zip(status.replicas, status.tables) if r.lag_offsets > 0]
                assert lagging, "the rate-limited node should lag on some partition"
            answered = []
            for name in lagging:
                table, part = name.split("/")
                key = next(f"sensor-{i}" for i in range(10_000) if partition_for(serialize_key(f"sensor-{i}"), 8) == int(part))
                strict, loose = read_batch(stack.components[victim].addresses["read_address"], store_pb2.ReadBatch(reads=[
                    store_pb2.KeyRead(id=1, table=table, partition=int(part), key=key.encode(),
                                      bound=store_pb2.ReadBound(max_lag=0)),
                    store_pb2.KeyRead(id=2, table=table, partition=int(part), key=key.encode(),
                                      bound=store_pb2.ReadBound(max_lag=1_000_000))])).results
                assert strict.status == store_pb2.TOO_STALE, (name, strict)
                if "loading its changelog into an empty store" in loose.message:
                    continue  # a replica the restart gave this node anew: read by no bound until caught up
                assert loose.status in (store_pb2.OK, store_pb2.NOT_FOUND), (name, loose)
                assert loose.replica.lag_offsets > 0, (name, loose)
                answered.append(name)
            assert answered, f"none of {victim}'s lagging replicas {lagging} answered a loose bound"

        records = [orjson.loads(line) for line in (tmp_path / "lagging" / "requests.jsonl").read_bytes().splitlines()]
        for rec in records:
            if rec.get("bound", {}).get("max_lag") == 0 and rec.get("outcome") in ("ok", "not_found"):
                assert rec["lag"]["offsets"] == 0, rec
                node = rec["served_by"]["node"]
                strict_by_node[node] = strict_by_node.get(node, 0) + 1
        assert sum(strict_by_node.values()) > 0
        assert summary["consistency"]["ok"], summary["consistency"]
    finally:  # the stack is shared: the node applies at full speed again for the modules after this one
        stack.stop(victim)
        stack.start(victim)
    wait_until(lambda: victim_lag() == 0, 60, f"{victim} restarted and caught up", stack=stack)


def test_redis_stopped_for_10s_under_lookups(stack, client, readings, tmp_path):
    # Redis stopped 2 s in, started again 10 s later, and 3 s of lookups with it back.
    cfg = LoadConfig(keys=SENSORS, protocol="both", concurrency=6, rate=80.0, duration_s=15.0, timeout_s=5.0,
                     bound_mix="none:2,max_lag=100000:1,max_staleness_ms=120000:1,session:2", seed=8)
    summary = run(stack, cfg, [Fault(2.0, "redis-outage", "redis", 10.0)], tmp_path / "redis", check=True,
                  plots=False, title="redis-outage")
    assert any(f["event"].startswith("stop redis") for f in summary["faults"])
    assert summary["requests"] >= 650, summary
    assert summary["failed"] == 0, (summary["errors_by_code"], summary["first_failures"])
    assert summary["consistency"]["ok"], summary["consistency"]

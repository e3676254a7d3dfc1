"""The spine on real parts: readings → PySpark → changelog → store nodes → router (REST and gRPC)."""

from __future__ import annotations

import random

import grpc
import httpx
import orjson
import pytest

from freshroute.keys import partition_for, serialize_key
from proto import router_pb2, router_pb2_grpc
from tests.integration.cluster_support import fully_replicated, metadata, scrape
from tests.integration.stack_fixture import (FIRST_DATA_TIMEOUT_S, all_sensors_served, expected_sensor_stats,
                                             produce_readings, produced, same_stats, wait_until)

SENSORS = 40
NODES = {"node-1", "node-2", "node-3"}


@pytest.fixture(scope="module")
def readings(stack):
    """Everything produced to the shared stack, this module's 2,000 readings last."""
    rng = random.Random(11)
    events = [{"sensor": f"sensor-{rng.randrange(SENSORS)}", "area": "wheel", "reading": round(rng.uniform(0, 100), 2)}
              for _ in range(2000)]
    produce_readings(stack, events)
    return list(produced(stack))


def test_every_sensor_matches_recomputation_via_rest_and_grpc(stack, readings):
    expected = expected_sensor_stats(readings)
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
        wait_until(lambda: all_sensors_served(client, expected), FIRST_DATA_TIMEOUT_S, "every sensor's stats to be served", stack=stack)
        for sensor, want in expected.items():
            body = client.get(f"/v1/tables/sensor_stats/keys/{sensor}").json()
            assert same_stats(body["value"], want), (sensor, body, want)
            assert body["partition"] == partition_for(serialize_key(sensor), 8)
            assert body["served_by"]["node"].startswith("node-")
            assert body["served_by"]["role"] in {"active", "standby"}
            assert body["lag"]["offsets"] >= 0 and body["lag"]["ms"] >= 0
            assert body["position"]

        tables = client.get("/v1/tables").json()
        names = {t["name"] for t in tables["tables"]}
        assert "sensor_stats" in names

    with grpc.insecure_channel(stack.config.grpc_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        assert "sensor_stats" in {t.name for t in stub.ListTables(router_pb2.ListTablesRequest()).tables}
        for sensor, want in expected.items():
            resp = stub.Get(router_pb2.GetRequest(table="sensor_stats", key=sensor), timeout=10)
            assert resp.found
            assert same_stats(orjson.loads(resp.value_json), want), sensor
            assert resp.partition == partition_for(serialize_key(sensor), 8)
            assert resp.served_by.node.startswith("node-")


def test_errors_are_typed(stack, readings):
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
        wait_until(lambda: client.get("/v1/tables/sensor_stats/keys/sensor-1").status_code in (200, 404), FIRST_DATA_TIMEOUT_S,
                   "the table to be served", stack=stack)
        r = client.get("/v1/tables/no_such_table/keys/x")
        assert r.status_code == 404 and r.json()["error"]["code"] == "TABLE_NOT_FOUND"
        r = client.get("/v1/tables/sensor_stats/keys/never-seen-sensor")
        assert r.status_code == 404
        body = r.json()["error"]
        assert body["code"] == "KEY_NOT_FOUND"
        assert body["partition"] == partition_for(serialize_key("never-seen-sensor"), 8)
        r = client.get("/v1/tables/sensor_stats/keys/sensor-1", params={"max_lag": "-1"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_ARGUMENT"
    with grpc.insecure_channel(stack.config.grpc_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Get(router_pb2.GetRequest(table="no_such_table", key="x"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as e:
            stub.Get(router_pb2.GetRequest(table="sensor_stats", key="sensor-1",
                                           bound=router_pb2.Bound(min_position="garbage")), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_client_reads_the_recomputed_values_straight_from_the_store_nodes(stack, readings):
    """Client (Redis-bootstrapped, no router) and AsyncClient (router-bootstrapped): gets, batches, scans, metadata."""
    import asyncio

    from freshroute.client import AsyncClient, Client, InvalidArgument, TableNotFound

    expected = expected_sensor_stats(readings)
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as http:
        wait_until(lambda: all_sensors_served(http, expected), FIRST_DATA_TIMEOUT_S, "every sensor's stats to be served", stack=stack)
    from prometheus_client import CollectorRegistry

    c = stack.config
    registry = CollectorRegistry()
    with Client(redis_url=c.redis_url, namespace=c.namespace, metrics=registry) as client:
        for sensor, want in expected.items():
            r = client.get("sensor_stats", sensor)
            assert r.found and same_stats(r.value, want), (sensor, r, want)
            assert r.partition == partition_for(serialize_key(sensor), 8)
            assert r.node.startswith("node-") and r.role in {"active", "standby"}
            assert r.lag_offsets >= 0 and r.lag_ms >= 0 and r.position.startswith("p1.")
        # The client counts what it did, when asked: every get found, by the role that served it; no fallback.
        ok = sum(registry.get_sample_value("freshroute_client_lookups_total", {"outcome": "ok", "role": role}) or 0
                 for role in ("active", "standby"))
        assert ok == len(expected)
        assert registry.get_sample_value("freshroute_client_lookup_seconds_count") == len(expected)
        assert registry.get_sample_value("freshroute_client_router_fallbacks_total", {"operation": "get"}) is None
        names = sorted(expected)
        many = client.get_many("sensor_stats", [*names, "no-such-sensor"], max_staleness_ms=60_000)
        assert [m.key for m in many] == [*names, "no-such-sensor"]
        assert all(m.found and same_stats(m.value, expected[m.key]) for m in many[:-1])
        assert not many[-1].found and many[-1].value is None
        scanned = {r.key: r.value for r in client.scan("sensor_stats", prefix="sensor-", page_size=7)}
        assert set(scanned) == set(expected)
        assert all(same_stats(scanned[s], expected[s]) for s in expected)
        assert [r.key for r in client.scan("sensor_stats", prefix="sensor-", limit=5, page_size=2)] == sorted(expected)[:5]
        loc = client.key_metadata("sensor_stats", "sensor-1")
        assert loc.partition == partition_for(b"sensor-1", 8) and loc.active is not None and loc.standbys
        # A replica the assignment moved away serves on for a while (moved_replica_serve_ms, 10 s), listed as a
        # standby: then the table's one standby is what remains.
        wait_until(lambda: len(client.key_metadata("sensor_stats", "sensor-1").standbys) == 1, 30,
                   "sensor-1 to have the table's one standby", stack=stack)
        assert "sensor_stats" in {t.spec.name for t in client.tables()}
        with pytest.raises(TableNotFound):
            client.get("no_such_table", "k")
        with pytest.raises(InvalidArgument) as e:
            client.get("sensor_stats", "sensor-1", min_position="garbage")
        assert e.value.details["field"] == "min_position"

    async def via_router() -> None:
        async with AsyncClient(router=c.rest_url) as aclient:
            got = await aclient.get_many("sensor_stats", sorted(expected))
            assert all(g.found and same_stats(g.value, expected[g.key]) for g in got)
            # Reads still go to the store nodes directly: the router only described the cluster.
            assert all(g.node.startswith("node-") for g in got)
            rows = [r.key async for r in aclient.scan("sensor_stats", prefix="sensor-1")]
            assert rows == sorted(s for s in expected if s.startswith("sensor-1"))

    asyncio.run(via_router())


def test_locust_users_rest_grpc_and_client_all_answer(stack, readings, tmp_path):
    """The locustfile itself, headless for a few seconds: every kind of user answers, none fails. Each run lasts 6 s:
    two users of each kind at 10 lookups/s, about 120 lookups a kind where 10 are asked for (4 s runs got 5-14 a kind
    once, in a suite run whose other lane held the machine)."""
    import csv
    import subprocess
    import sys
    from pathlib import Path

    c = stack.config
    locust = Path(sys.executable).parent / "locust"
    cmd = [str(locust), "-f", "loadtest/locustfile.py", "--headless", "-u", "6", "-r", "6", "-t", "6s",
           "--host", c.rest_url, "--grpc-target", c.grpc_address, "--redis-url", c.redis_url,
           "--namespace", c.namespace, "--keys", str(SENSORS), "--user-rps", "10", "--csv", str(tmp_path / "lt"),
           "--only-summary", "RestUser", "GrpcUser", "ClientUser"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    with open(tmp_path / "lt_stats.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["Name"] != "Aggregated"]
    by_type: dict[str, int] = {}
    for r in rows:
        by_type[r["Type"]] = by_type.get(r["Type"], 0) + int(r["Request Count"])
        assert int(r["Failure Count"]) == 0, (r, done.stderr[-2000:])
    assert set(by_type) == {"GET", "grpc", "client"} and min(by_type.values()) >= 10, (by_type, done.stderr[-2000:])

    # The same users reading the demo's windowed table: each lookup a key's windows of the last 30 minutes.
    windowed = [*cmd[:cmd.index("--csv")], "--csv", str(tmp_path / "lw"), "--table", "sensor_windows",
                "--window-span", str(30 * 60 * 1000), *cmd[cmd.index("--only-summary"):]]
    done = subprocess.run(windowed, capture_output=True, text=True, timeout=120)
    with open(tmp_path / "lw_stats.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["Name"] != "Aggregated"]
    assert {r["Name"].split(" (")[0] for r in rows} == {"GET /v1/tables/sensor_windows/keys/[key]/windows",
                                                         "Router.GetWindows", "Client.windows"}, rows
    assert all(int(r["Failure Count"]) == 0 and int(r["Request Count"]) > 0 for r in rows), (rows,
                                                                                             done.stderr[-2000:])


def placed_as_assigned(md) -> bool:
    """Every node hosts exactly the replicas the assignment places on it, each serving in its role: none moved away
    and serving on, none still to be opened or restored."""
    if not fully_replicated(md, NODES):
        return False
    assignment, reports = md.assignment(), md.nodes()
    return all(n in reports and {(r.table, r.partition): r.role for r in reports[n].replicas} ==
               assignment.hosted_by(n) for n in NODES)


def test_store_nodes_and_the_pipeline_expose_prometheus_metrics(stack, readings):
    """Every replica's lag and progress from each node, and each table's last micro-batch from the pipeline."""
    expected = expected_sensor_stats(readings)
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
        wait_until(lambda: all_sensors_served(client, expected, max_lag=0), FIRST_DATA_TIMEOUT_S,
                   "every sensor's final stats to be served", stack=stack)
    # The replicas counted below are every partition's, not the sensors': their placement is waited for on its own. A
    # replica the assignment moved away (the start's balancing, another module's restart) serves on as a standby for
    # moved_replica_serve_ms, and would be counted as a second one.
    md = metadata(stack)
    wait_until(lambda: placed_as_assigned(md), 60, "each node to host exactly the replicas assigned to it", stack=stack)

    components = stack.status()["components"]
    nodes = [c for c in components if c["role"] == "store-node"]
    assert len(nodes) == 3 and all(c["metrics"].endswith("/metrics") for c in nodes)
    applied: dict[tuple[str, str], list[float]] = {}
    actives: dict[str, float] = {}
    for c in nodes:
        for s in scrape(c["metrics"]):
            if s.name == "freshroute_replica_applied_offset" and s.labels["table"] == "sensor_stats":
                applied.setdefault((s.labels["partition"], s.labels["role"]), []).append(s.value)
            if s.name == "freshroute_node_replicas" and s.labels["role"] == "active":
                actives[s.labels["node"]] = s.value
    # Every partition of the table: one active and one standby, over the three nodes, each holding the changelog.
    assert sorted({p for p, _ in applied}) == [str(p) for p in range(8)]
    assert all(len(applied.get((str(p), role), [])) == 1 for p in range(8) for role in ("active", "standby"))
    assert sum(v[0] for (p, role), v in applied.items() if role == "active") >= len(expected)
    assert sorted(actives) == ["node-1", "node-2", "node-3"] and sum(actives.values()) == 24  # 3 tables × 8

    pipeline = next(c for c in components if c["role"] == "pipeline")

    def batches() -> dict[str, float]:
        return {s.labels["table"]: s.value for s in scrape(pipeline["metrics"])
                if s.name == "freshroute_pipeline_batch_id"}

    # A batch is counted once it has ended: a Real-time query's at its checkpoint, a minute after its start
    # (realtime_checkpoint_interval), which a stack that started quickly may not have reached yet.
    wait_until(lambda: set(batches()) == {"sensor_stats", "area_counts", "sensor_windows"}, 90,
               "every table's last batch in the metrics", stack=stack)
    rows = {s.labels["table"]: s.value for s in scrape(pipeline["metrics"])
            if s.name == "freshroute_pipeline_batch_input_rows"}
    # The last batch seen may have had no input (a windowed table's publishes its watermark; any table's once the
    # source saw its end offsets move without records): the gauges are there, none negative.
    assert set(rows) == set(batches()) and all(b >= 0 for b in batches().values()) and \
        all(r >= 0 for r in rows.values()), rows

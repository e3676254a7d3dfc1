"""The spine on real parts: readings → PySpark → changelog → store nodes → router (REST and gRPC)."""

from __future__ import annotations

import random

import grpc
import httpx
import orjson
import pytest

from freshroute.keys import partition_for, serialize_key
from proto import router_pb2, router_pb2_grpc
from tests.integration.stack_fixture import (FIRST_DATA_TIMEOUT_S, all_sensors_served, expected_sensor_stats, produce_readings, same_stats, start_stack,
                                             wait_until)

SENSORS = 40


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("e2e"))
    yield s
    s.down()


@pytest.fixture(scope="module")
def readings(stack):
    rng = random.Random(11)
    events = [{"sensor": f"sensor-{rng.randrange(SENSORS)}", "area": "wheel", "reading": round(rng.uniform(0, 100), 2)}
              for _ in range(2000)]
    produce_readings(stack, events)
    return events


def test_every_sensor_matches_recomputation_via_rest_and_grpc(stack, readings):
    expected = expected_sensor_stats(readings)
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
        wait_until(lambda: all_sensors_served(client, expected), FIRST_DATA_TIMEOUT_S, "every sensor's stats to be served")
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
                   "the table to be served")
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

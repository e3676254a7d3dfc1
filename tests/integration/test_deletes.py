"""Deletes: a user's table with ``delete_when``, run by the real pipeline, served by a real store node and router.

A key whose latest row matches ``delete_when`` (or whose value columns are all null) is written
as a tombstone: it answers KEY_NOT_FOUND through REST, gRPC and the direct client, and still does
after its store node restores the table from the changelog into an empty directory.
"""

from __future__ import annotations

import os
import textwrap

import grpc
import httpx
import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from freshroute.client import Client
from freshroute.errors import FreshrouteError
from tools.local.services import free_port
from pipeline.topics import ensure_topic
from proto import router_pb2, router_pb2_grpc

from .pipeline_support import PipelineProcess, Processes, read_topic
from .stack_fixture import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.beside]

TABLES = textwrap.dedent('''
    from pyspark.sql import functions as F

    from pipeline.tables import source, sql_table, table

    source("devices", schema="device STRING, status STRING, battery DOUBLE", topic="devices")

    # A device's latest report; one reporting status "retired" leaves the table.
    @table(name="device_status", key="device", source="devices", delete_when="status = 'retired'")
    def device_status(devices):
        return devices.groupBy("device").agg(F.max_by("status", "offset").alias("status"),
                                             F.max_by("battery", "offset").alias("battery"))

    # The latest battery reading; a report without one (null) leaves the table: every value column is null.
    sql_table(name="device_battery", key="device", source="devices",
              sql="SELECT device, max_by(battery, offset) AS battery FROM devices GROUP BY device")
''')


@pytest.mark.timeout(600)
def test_deleted_keys_answer_key_not_found_on_every_path_and_after_a_restore(broker, redis_url, namespace, tmp_path):
    tables_file = tmp_path / "devices.py"
    tables_file.write_text(TABLES)
    topic = f"{namespace}devices"
    ensure_topic(AdminClient({"bootstrap.servers": broker}), topic, 2)
    env = {**os.environ, "FRESHROUTE_BOOTSTRAP_SERVERS": broker, "FRESHROUTE_REDIS_URL": redis_url,
           "FRESHROUTE_NAMESPACE": namespace, "FRESHROUTE_TOPIC_PREFIX": namespace,
           "FRESHROUTE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "FRESHROUTE_CHANGELOG_PARTITIONS": "4",
           "FRESHROUTE_TABLES_FILE": str(tables_file), "FRESHROUTE_TRIGGER_MS": "200",
           "FRESHROUTE_STANDBY_REPLICAS": "0"}
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 5})

    def report(device: str, status: str, battery: float | None) -> None:
        producer.produce(topic, key=device.encode(), value=orjson.dumps(
            {"device": device, "status": status, "battery": battery}))
        assert producer.flush(10) == 0

    for i in range(6):
        report(f"d{i}", "ok", 50.0 + i)
    pipeline = PipelineProcess(env, tmp_path / "pipeline.log")
    procs = Processes(tmp_path, env)
    rest_port, grpc_port = free_port(), free_port()
    rest = f"http://127.0.0.1:{rest_port}"
    try:
        procs.start("node", "store-node", "--node-id", "n1", "--data-dir", str(tmp_path / "n1-a"))
        procs.start("router", "router", "--rest-port", str(rest_port), "--grpc-port", str(grpc_port))
        with httpx.Client(base_url=rest, timeout=5) as http:
            def status(table: str, key: str) -> int:
                try:
                    return http.get(f"/v1/tables/{table}/keys/{key}", params={"max_lag": 0}).status_code
                except httpx.TransportError:
                    return 0

            wait_until(lambda: all(status(t, f"d{i}") == 200 for t in ("device_status", "device_battery")
                                   for i in range(6)), 240, "every device to be served",
                       check=lambda: (pipeline.check(), procs.check()))
            report("d1", "retired", 10.0)  # delete_when
            report("d2", "ok", None)  # every value column of device_battery null; device_status keeps it
            report("d3", "retired", None)  # both
            wait_until(lambda: status("device_status", "d1") == 404 and status("device_battery", "d2") == 404
                       and status("device_status", "d3") == 404 and status("device_battery", "d3") == 404,
                       60, "the deletes to be served")

            gone = {("device_status", "d1"), ("device_status", "d3"), ("device_battery", "d2"),
                    ("device_battery", "d3")}

            def check_every_path() -> None:
                for table in ("device_status", "device_battery"):
                    for i in range(6):
                        deleted = (table, f"d{i}") in gone
                        r = http.get(f"/v1/tables/{table}/keys/d{i}", params={"max_lag": 0})
                        assert r.status_code == (404 if deleted else 200), (table, i, r.text)
                        if deleted:
                            assert r.json()["error"]["code"] == "KEY_NOT_FOUND"
                with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                    stub = router_pb2_grpc.RouterStub(channel)
                    with pytest.raises(grpc.RpcError) as e:
                        stub.Get(router_pb2.GetRequest(table="device_status", key="d1"), timeout=5)
                    assert e.value.code() is grpc.StatusCode.NOT_FOUND
                    got = stub.BatchGet(router_pb2.BatchGetRequest(table="device_battery",
                                                                   keys=["d0", "d2", "d3", "d4"]), timeout=5)
                    assert [r.found for r in got.results] == [True, False, False, True]
                with Client(redis_url=redis_url, namespace=namespace) as client:
                    assert not client.get("device_status", "d1", max_lag=0).found
                    assert client.get("device_status", "d2", max_lag=0).value["status"] == "ok"
                    assert client.get("device_status", "d2").value["battery"] is None
                    assert [k.key for k in client.scan("device_battery", max_lag=0)] == ["d0", "d1", "d4", "d5"]

            check_every_path()
            # The changelog holds the tombstones (what compaction and a restore go by).
            log = read_topic(broker, f"{namespace}device_status-changelog")
            assert {k for _p, _o, _t, k, v in log if v is None} == {b"d1", b"d3"}

            # The node again, from an empty directory: it restores both tables from their changelogs.
            procs.stop("node")
            procs.start("node", "store-node", "--node-id", "n1", "--data-dir", str(tmp_path / "n1-b"))
            # Strict reads are refused (503) until every replica of both tables has caught up: the keys' partitions,
            # and through a strict scan every partition (no key of d0-d5 is in partition 3) — by the router, and by a
            # new client, as the check makes one, whose view has only the node's heartbeats until it reads (one may
            # still say it restores).
            def client_reads() -> bool:
                try:
                    with Client(redis_url=redis_url, namespace=namespace) as client:
                        for t in ("device_status", "device_battery"):
                            list(client.scan(t, max_lag=0))
                            for i in range(6):
                                client.get(t, f"d{i}", max_lag=0)
                except FreshrouteError:
                    return False
                return True

            wait_until(lambda: all(status(t, f"d{i}") in (200, 404) for t in ("device_status", "device_battery")
                                   for i in range(6))
                       and all(http.get(f"/v1/tables/{t}/scan", params={"max_lag": 0}).status_code == 200
                               for t in ("device_status", "device_battery"))
                       and client_reads(),
                       120, "the restored node to serve every partition of both tables")
            check_every_path()
    finally:
        procs.stop_all()
        pipeline.proc.terminate()
        pipeline.wait_exit(60)

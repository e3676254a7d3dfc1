"""Serving a compacted topic you already have: ``freshroute table add`` on the shared stack's real broker, Redis,
store nodes and router. No component restarts; the tables are served through REST, gRPC and the client as the
topics hold them (latest value per key, tombstones deleted), in each key and value format; what cannot be served
is refused naming why; ``table remove`` stops serving a table and leaves its topic alone."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time

import grpc
import httpx
import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from freshroute.client import Client
from pipeline.topics import ensure_topic
from proto import router_pb2, router_pb2_grpc
from tests.integration.cluster_support import metadata, scrape
from tests.integration.pipeline_support import REPO
from tests.integration.stack_fixture import wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 4
USERS = 60


def freshroute_table(stack, *args: str) -> subprocess.CompletedProcess:
    c = stack.config
    return subprocess.run([sys.executable, "-m", "tools.cli", "table", "--redis-url", c.redis_url, "--namespace",
                           c.namespace, *args], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "FRESHROUTE_BOOTSTRAP_SERVERS": c.bootstrap})


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]], partitioner: str = "murmur2_random"):
    # murmur2: Kafka's Java default partitioner, as Kafka Streams, ksqlDB and most producers place keys.
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": partitioner, "linger.ms": 5})
    for key, value in records:
        p.produce(topic, key=key, value=value)
    assert p.flush(30) == 0


def blob_key(i: int) -> str:
    """The blobs topic's key i as a lookup names it: base64url."""
    return base64.urlsafe_b64encode(bytes([0, i, 255])).decode().rstrip("=")


@pytest.fixture(scope="module")
def topics(stack):
    c = stack.config
    md = metadata(stack)  # the pipeline's tables are there, whichever module ran first
    wait_until(lambda: "sensor_stats" in md.tables(), 120, "the pipeline to register its tables", stack=stack)
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    names = {n: f"{c.topic_prefix}{n}" for n in ("users", "blobs", "orders", "events", "scattered")}
    for n, topic in names.items():
        ensure_topic(admin, topic, PARTITIONS, {} if n == "events" else {"cleanup.policy": "compact"})
    # users: string keys, JSON values, each key written twice (the second wins), every 10th deleted afterwards.
    users = [(f"user-{i}".encode(), orjson.dumps({"name": f"u{i}", "v": 1})) for i in range(USERS)]
    users += [(f"user-{i}".encode(), orjson.dumps({"name": f"u{i}", "v": 2})) for i in range(USERS)]
    users += [(f"user-{i}".encode(), None) for i in range(0, USERS, 10)]
    produce(c.bootstrap, names["users"], users)
    # blobs: bytes keys, bytes values (not UTF-8 at all).
    produce(c.bootstrap, names["blobs"], [(bytes([0, i, 255]), bytes([i]) * 5 + b"\xff\x00") for i in range(20)])
    # orders: JSON keys (as a JSON serde writes them), string values.
    produce(c.bootstrap, names["orders"], [(orjson.dumps({"id": i}), f"order {i} of plain text".encode())
                                           for i in range(20)])
    produce(c.bootstrap, names["events"], [(b"e1", b'{"x":1}')])  # not compacted
    produce(c.bootstrap, names["scattered"], [(f"k{i}".encode(), b"{}") for i in range(40)],
            partitioner="consistent_random")  # librdkafka's CRC32: not where Kafka's default puts keys
    yield names
    # The stack goes back as it was for the other modules (whose replication checks cover every table).
    for table in ("users", "blobs", "orders", "events"):
        if table in md.tables():
            md.remove_table(table)


def test_a_compacted_topic_is_served_in_each_format_with_no_restart(stack, topics):
    pids = {name: comp.pid for name, comp in stack.components.items()}
    started = time.monotonic()
    added = freshroute_table(stack, "add", "users", "--topic", topics["users"])
    assert added.returncode == 0 and "table users added" in added.stdout, added.stderr
    assert freshroute_table(stack, "add", "blobs", "--topic", topics["blobs"], "--key-format", "bytes",
                            "--value-format", "bytes", "--standby-replicas", "0").returncode == 0
    assert freshroute_table(stack, "add", "orders", "--topic", topics["orders"], "--key-format", "json",
                            "--value-format", "string").returncode == 0
    listed = json.loads(freshroute_table(stack, "list", "--json").stdout)["tables"]
    by_name = {t["name"]: t for t in listed}
    assert by_name["users"] == {"name": "users", "topic": topics["users"], "partitions": PARTITIONS, "origin": "topic",
                                "key_format": "string", "value_format": "json", "standby_replicas": 1,
                                "windowed": False, "history_retention_ms": 0, "version": 1, "versions": []}
    assert by_name["sensor_stats"]["origin"] == "pipeline"
    # The pipeline's tables have a version record: one version, served, of the definition the pipeline runs.
    served, = by_name["sensor_stats"]["versions"]
    assert by_name["sensor_stats"]["version"] == 1 and (served["version"], served["state"]) == (1, "serving")
    assert len(served["fingerprint"]) == 16 and served["switched_ms"] == served["created_ms"] > 0

    c = stack.config
    with httpx.Client(base_url=c.rest_url, timeout=10) as http:
        def served(table: str, key: str) -> httpx.Response:
            return http.get(f"/v1/tables/{table}/keys/{key}")

        wait_until(lambda: served("users", "user-1").status_code == 200 and served("blobs", blob_key(1)).status_code == 200
                   and served("orders", '{"id":3}').status_code == 200, 60, "the three tables to be served",
                   stack=stack)
        print(f"SERVED: three tables added and served {time.monotonic() - started:.1f} s after the first add")

        def caught_up(table: str, copies: int) -> bool:
            """Every partition of ``table`` with its ``copies`` replicas, each serving at its topic's end: a key
            served says nothing of another partition's replicas, and a replica serves once within
            caught_up_threshold of its end."""
            r = http.get(f"/v1/cluster/tables/{table}")
            parts = r.json()["partitions"] if r.status_code == 200 else []
            return len(parts) == PARTITIONS and all(
                len(p["replicas"]) >= copies and all(x["alive"] and x["kind"] in ("active", "standby")
                                                     and x["lag"]["offsets"] == 0 for x in p["replicas"])
                for p in parts)

        # Each table read below, every partition of it: the reads that follow go to any of a partition's replicas.
        for table, copies in (("users", 2), ("blobs", 1), ("orders", 2)):
            wait_until(lambda table=table, copies=copies: caught_up(table, copies), 60,
                       f"every replica of {table} at its topic's end", stack=stack)
        for i in range(USERS):
            r = served("users", f"user-{i}")
            if i % 10 == 0:
                assert r.status_code == 404 and r.json()["error"]["code"] == "KEY_NOT_FOUND", r.text
            else:
                assert r.status_code == 200 and r.json()["value"] == {"name": f"u{i}", "v": 2}, r.text
        batch = http.post("/v1/tables/users/keys:batchGet", json={"keys": ["user-1", "user-10"]}).json()["results"]
        assert [(x["found"], x.get("value")) for x in batch] == [(True, {"name": "u1", "v": 2}), (False, None)]
        blob = served("blobs", blob_key(7)).json()
        assert "value" not in blob and base64.b64decode(blob["value_b64"]) == bytes([7]) * 5 + b"\xff\x00"
        # A JSON key is named by its JSON text, however it is spaced.
        order = served("orders", '{ "id" : 3 }').json()
        assert order["value"] == "order 3 of plain text" and order["key"] == '{ "id" : 3 }'
        bad = served("orders", "not-json")
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_ARGUMENT", bad.text
        page = http.get("/v1/tables/blobs/scan", params={"limit": 100}).json()["items"]
        assert len(page) == 20 and all("value_b64" in item for item in page)
        tables = {t["name"]: t for t in http.get("/v1/tables").json()["tables"]}
        assert (tables["blobs"]["key_format"], tables["blobs"]["value_format"], tables["blobs"]["origin"]) == \
            ("bytes", "bytes", "topic")

    with grpc.insecure_channel(c.grpc_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        got = stub.Get(router_pb2.GetRequest(table="blobs", key=blob_key(7)), timeout=5)
        assert got.found and got.value_bytes == bytes([7]) * 5 + b"\xff\x00" and got.value_json == ""
        got = stub.Get(router_pb2.GetRequest(table="users", key="user-3"), timeout=5)
        assert orjson.loads(got.value_json) == {"name": "u3", "v": 2}

    with Client(c.redis_url, namespace=c.namespace) as client:
        wait_until(lambda: client.get("blobs", blob_key(7)).found, 10, "the client to see the new tables", stack=stack)
        assert client.get("blobs", blob_key(7)).value == bytes([7]) * 5 + b"\xff\x00"
        assert client.get("orders", '{"id":4}').value == "order 4 of plain text"
        assert client.get("users", "user-4").value == {"name": "u4", "v": 2}
        assert [r.found for r in client.get_many("users", ["user-5", "user-20"])] == [True, False]
    assert {name: comp.pid for name, comp in stack.components.items()} == pids  # nothing restarted

    # A record that breaks the table's formats after it was added: skipped and counted, the key keeps its value.
    produce(c.bootstrap, topics["users"], [(b"user-1", b"not json")])

    def undecodable() -> int:
        # Only the nodes running: another module may have started and stopped some (scaling out and back).
        return sum(int(s.value) for name in stack.store_node_names() if stack.components[name].alive()
                   for s in scrape(stack.components[name].addresses["metrics"])
                   if s.name == "freshroute_store_undecodable_records_total" and s.labels == {"table": "users"})

    wait_until(lambda: undecodable() >= 2, 20, "the active and the standby to count the record", stack=stack)
    assert httpx.get(f"{c.rest_url}/v1/tables/users/keys/user-1").json()["value"] == {"name": "u1", "v": 2}

    removed = freshroute_table(stack, "remove", "orders")
    assert removed.returncode == 0, removed.stderr
    with httpx.Client(base_url=c.rest_url, timeout=10) as http:
        wait_until(lambda: http.get("/v1/tables/orders/keys/%7B%22id%22%3A3%7D").status_code == 404, 10,
                   "the removed table to be gone", stack=stack)
        assert http.get("/v1/tables/orders/keys/x").json()["error"]["code"] == "TABLE_NOT_FOUND"


@pytest.mark.parametrize("args, says", [
    (["add", "ghost", "--topic", "no-such-topic-anywhere"], "does not exist"),
    (["add", "sensor_stats", "--topic", "{users}"], "exists already (served from the pipeline)"),
    (["add", "bad name", "--topic", "{users}"], "must be a plain identifier"),
    (["add", "ev", "--topic", "{events}"], "is not compacted (cleanup.policy=delete)"),
    (["add", "wrongkeys", "--topic", "{users}", "--key-format", "json"], "key is not JSON (given --key-format json)"),
    (["add", "wrongvalues", "--topic", "{blobs}", "--key-format", "bytes", "--value-format", "json"],
     "value is not JSON (given --value-format json)"),
    (["add", "scattered", "--topic", "{scattered}"], "where Kafka's default partitioner would not put it"),
    (["remove", "sensor_stats"], "computed by the pipeline"),
    (["remove", "nothing_here"], "no table 'nothing_here'"),
])
def test_what_cannot_be_served_is_refused_naming_why(stack, topics, args, says):
    refused = freshroute_table(stack, *[a.format(**topics) for a in args])
    assert refused.returncode == 2 and says in refused.stderr, (refused.stdout, refused.stderr)
    assert "Traceback" not in refused.stderr


def test_an_uncompacted_topic_is_served_when_asked_with_a_warning(stack, topics):
    added = freshroute_table(stack, "add", "events", "--topic", topics["events"], "--allow-uncompacted")
    assert added.returncode == 0 and "warning: topic" in added.stderr and "not compacted" in added.stderr
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as http:
        wait_until(lambda: http.get("/v1/tables/events/keys/e1").status_code == 200, 60, "events to be served",
                   stack=stack)
        assert http.get("/v1/tables/events/keys/e1").json()["value"] == {"x": 1}
    assert freshroute_table(stack, "remove", "events").returncode == 0

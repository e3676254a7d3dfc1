"""Versioned tables on the shared stack's real broker, Redis, store nodes and router: a compacted topic added with a
history retention answers a key as of any time within it — through REST, gRPC, the client and the CLI — exactly as
the topic's records say by their Kafka timestamps (late ones included), lists a key's versions page by page, refuses
what it cannot answer naming why, expires exactly the versions replaced longer ago than the retention, and keeps every
version through a store node's kill -9 and an empty-disk restore."""

from __future__ import annotations

import datetime as dt
import os
import random
import shutil
import signal
import socket
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
from freshroute.bound import NO_BOUND
from freshroute.keys import partition_for, serialize_key
from freshroute.topics import topic_config
from freshroute.wire import FrameReader, VersionFilter, frame, range_result, range_read
from pipeline.topics import ensure_topic
from proto import router_pb2, router_pb2_grpc, store_pb2
from tests.integration.browser import browser_page
from tests.integration.cluster_support import fully_replicated, metadata, node_id, node_status, scrape
from tests.integration.pipeline_support import REPO
from tests.integration.stack_fixture import wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 4
KEYS = 24
DAY_MS = 86_400_000
NODES = {"node-1", "node-2", "node-3"}


def freshroute(stack, *args: str) -> subprocess.CompletedProcess:
    c = stack.config
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**os.environ, "FRESHROUTE_BOOTSTRAP_SERVERS": c.bootstrap,
                                         "FRESHROUTE_REDIS_URL": c.redis_url, "FRESHROUTE_NAMESPACE": c.namespace,
                                         "FRESHROUTE_ROUTER_URL": c.rest_url})


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None, int]]) -> None:
    """Records (key, value or None for a delete, Kafka timestamp) in order, keyed as Kafka's default partitioner."""
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 5})
    for key, value, at in records:
        p.produce(topic, key=key, value=value, timestamp=at)
    assert p.flush(30) == 0


class Model:
    """A key's versions recomputed from the records: one per timestamp (the later record of a time wins), each valid
    until the next."""

    def __init__(self, records: list[tuple[bytes, bytes | None, int]]) -> None:
        self.at: dict[str, dict[int, bytes | None]] = {}
        for key, value, t in records:
            self.at.setdefault(key.decode(), {})[t] = value

    def versions(self, key: str) -> list[tuple[int, int | None, object]]:
        """(valid_from, valid_to, value decoded or None for a delete), newest first."""
        times = sorted(self.at.get(key, {}))
        out = [(t, n, None if self.at[key][t] is None else orjson.loads(self.at[key][t]))
               for t, n in zip(times, times[1:] + [None])]
        return list(reversed(out))

    def as_of(self, key: str, t: int) -> tuple[int, int | None, object] | None:
        return next(((f, to, v) for f, to, v in self.versions(key) if f <= t and (to is None or t < to)), None)


@pytest.fixture(scope="module")
def prices(stack):
    """A compacted topic of price versions over the last hour — late records, deletes and same-time rewrites among
    them — added as table ``prices`` keeping a week of history."""
    c = stack.config
    md = metadata(stack)
    wait_until(lambda: "sensor_stats" in md.tables(), 120, "the pipeline to register its tables", stack=stack)
    topic = f"{c.topic_prefix}prices"
    ensure_topic(AdminClient({"bootstrap.servers": c.bootstrap}), topic, PARTITIONS, {"cleanup.policy": "compact"})
    rng = random.Random(64)
    base = int(time.time() * 1000) - 3_600_000
    records = []
    for i in range(KEYS):
        key = f"pair-{i}".encode()
        t = base + rng.randrange(60_000)
        for v in range(rng.randrange(1, 7)):
            deleted = v > 0 and rng.random() < 0.15
            records.append((key, None if deleted else orjson.dumps({"price": i * 100 + v}), t))
            t += rng.randrange(1, 300_000)
        if i % 5 == 0:  # late: older than the key's latest version, written after it
            records.append((key, orjson.dumps({"price": -i, "late": True}), t - rng.randrange(2, 200_000)))
        if i % 7 == 0:  # the same time written again: the later record wins
            records.append((key, orjson.dumps({"price": i, "again": True}), records[-1][2]))
    produce(c.bootstrap, topic, records)
    added = freshroute(stack, "table", "add", "prices", "--topic", topic, "--history-retention", "7d")
    assert added.returncode == 0 and "history kept 604800000 ms" in added.stdout, (added.stdout, added.stderr)
    assert f"min.compaction.lag.ms set to {8 * DAY_MS}" in added.stderr, added.stderr
    model = Model(records)
    last = {key: model.versions(key)[0] for key in model.at}
    with httpx.Client(base_url=c.rest_url, timeout=10) as http:
        def caught_up() -> bool:
            for key, (_, _, value) in last.items():
                r = http.get(f"/v1/tables/prices/keys/{key}")
                if (r.status_code, r.json().get("value")) != ((404, None) if value is None else (200, value)):
                    return False
            return True

        wait_until(caught_up, 90, "every key of prices to be served at its newest version", stack=stack)
    yield topic, model
    if "prices" in md.tables():
        md.remove_table("prices")


def test_a_key_as_of_any_time_is_the_version_its_records_say_on_every_way_in(stack, prices):
    topic, model = prices
    c = stack.config
    config = topic_config(AdminClient({"bootstrap.servers": c.bootstrap}), topic)
    assert config["min.compaction.lag.ms"] == str(8 * DAY_MS)  # compaction keeps the history a restore reads
    rng = random.Random(7)
    now = int(time.time() * 1000)
    checked = finals = 0
    with httpx.Client(base_url=c.rest_url, timeout=10) as http:
        for key in model.at:
            versions = model.versions(key)
            times = {f for f, _, _ in versions} | {f - 1 for f, _, _ in versions}
            times |= {rng.randrange(versions[-1][0] - 60_000, now) for _ in range(6)}
            for t in sorted(times):
                r = http.get(f"/v1/tables/prices/keys/{key}", params={"as_of": t})
                want = model.as_of(key, t)
                body = r.json()
                if want is None or want[2] is None:
                    assert r.status_code == 404 and body["error"]["code"] == "KEY_NOT_FOUND", (key, t, body)
                    assert body["error"]["as_of"] == t
                else:
                    assert r.status_code == 200, (key, t, body)
                    assert (body["valid_from"], body["valid_to"], body["value"]) == want, (key, t, body)
                    assert body["as_of"] == t and body["partition"] == partition_for(serialize_key(key), PARTITIONS)
                    finals += body["final"]
                    # The past, read from a caught-up replica, is final (the last seconds may be not yet).
                    assert body["final"] or t > now - 5_000, (key, t, body)
                checked += 1
            # Its versions, newest first, in pages of two joined, are the records' versions.
            pages, token = [], None
            while True:
                page = http.get(f"/v1/tables/prices/keys/{key}/versions",
                                params={"limit": 2, **({"page_token": token} if token else {})}).json()
                pages += [(v["valid_from"], v["valid_to"], v["value"]) for v in page["versions"]]
                assert all(v["deleted"] == (v["value"] is None) for v in page["versions"])
                token = page["next_page_token"]
                if token is None:
                    break
            assert pages == versions, key
            # The plain lookup answers the newest version (never a late record).
            plain = http.get(f"/v1/tables/prices/keys/{key}")
            assert (plain.json().get("value") if plain.status_code == 200 else None) == versions[0][2]
        # Every key as of a time, page by page across partitions: the keys present then, in key order.
        for t in sorted(rng.randrange(min(model.versions(k)[-1][0] for k in model.at), now) for _ in range(4)):
            want = []
            for k in sorted(model.at):
                held = model.as_of(k, t)
                if held is not None and held[2] is not None:
                    want.append((k, held[2], held[0], held[1]))
            got, token, finals_of_scan = [], None, []
            while True:
                page = http.get("/v1/tables/prices/scan", params={"as_of": t, "limit": 7,
                                                                  **({"page_token": token} if token else {})}).json()
                got += [(i["key"], i["value"], i["valid_from"], i["valid_to"]) for i in page["items"]]
                finals_of_scan.append(page["final"])
                token = page["next_page_token"]
                if token is None:
                    break
            assert got == want, t
            assert all(finals_of_scan), t
            checked += 1
        print(f"AS_OF: {checked} reads, {finals} found answers final")
        assert finals > 0
        # Every answer of the past from a caught-up replica is final; one of the future is the latest, not final.
        key = "pair-1"
        past = http.get(f"/v1/tables/prices/keys/{key}", params={"as_of": model.versions(key)[0][0]}).json()
        assert past["final"] is True
        future = http.get(f"/v1/tables/prices/keys/{key}", params={"as_of": now + 3_600_000}).json()
        assert future["final"] is False and future["value"] == model.versions(key)[0][2]
        # RFC 3339 names the same time.
        t = model.versions(key)[-1][0]
        text = dt.datetime.fromtimestamp(t / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")
        assert http.get(f"/v1/tables/prices/keys/{key}", params={"as_of": text}).json()["valid_from"] == t
        window = http.get(f"/v1/tables/prices/keys/{key}/versions", params={"from": t, "to": t + 1}).json()
        assert [v["valid_from"] for v in window["versions"]] == [t]

    key = "pair-3"
    want_from, want_to, want_value = model.versions(key)[-1]
    with grpc.insecure_channel(c.grpc_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        got = stub.Get(router_pb2.GetRequest(table="prices", key=key, bound=router_pb2.Bound(as_of=want_from)),
                       timeout=5)
        assert got.found and orjson.loads(got.value_json) == want_value and got.valid_from == want_from
        assert (got.valid_to if got.HasField("valid_to") else None) == want_to and got.final
        scanned = list(stub.Scan(router_pb2.ScanRequest(table="prices", start=key, end=key + "\x00",
                                                        bound=router_pb2.Bound(as_of=want_from)), timeout=5))
        assert [(i.key, orjson.loads(i.value_json), i.valid_from) for i in scanned[:-1]] == [(key, want_value, want_from)]
        assert scanned[-1].summary.final
        listed = stub.GetVersions(router_pb2.VersionsRequest(table="prices", key=key), timeout=5)
        assert [(v.valid_from, v.valid_to if v.HasField("valid_to") else None,
                 None if v.deleted else orjson.loads(v.value_json)) for v in listed.versions] == model.versions(key)

    with Client(c.redis_url, namespace=c.namespace) as client:
        wait_until(lambda: "prices" in {t.spec.name for t in client.tables()}, 10, "the client to see prices", stack=stack)
        got = client.get("prices", key, as_of=want_from)
        assert (got.found, got.value, got.valid_from_ms, got.valid_to_ms, got.final) == \
            (True, want_value, want_from, want_to, True)
        aware = dt.datetime.fromtimestamp(want_from / 1000, dt.timezone.utc)
        assert client.get("prices", key, as_of=aware).valid_from_ms == want_from
        listed = client.versions("prices", key)
        assert [(v.valid_from_ms, v.valid_to_ms, v.value) for v in listed.versions] == model.versions(key)
        # Many keys and a scan as of the same time, read from the store nodes.
        many = client.get_many("prices", [key, "no-such-pair"], as_of=want_from)
        assert [(r.found, r.value, r.valid_from_ms, r.final) for r in many] == \
            [(True, want_value, want_from, True), (False, None, None, True)]
        scanned = list(client.scan("prices", start=key, end=key + "\x00", as_of=want_from))
        assert [(r.lookup.key, r.value, r.valid_from_ms, r.valid_to_ms, r.final) for r in scanned] == \
            [(key, want_value, want_from, want_to, True)]

    cli = freshroute(stack, "lookup", "prices", key, "--as-of", str(want_from))
    assert cli.returncode == 0 and orjson.loads(cli.stdout)["value"] == want_value, cli.stderr
    cli = freshroute(stack, "lookup", "prices", key, "--versions")
    assert cli.returncode == 0 and len(orjson.loads(cli.stdout)["versions"]) == len(model.versions(key)), cli.stderr


def test_what_a_versioned_read_cannot_answer_is_refused_naming_why(stack, prices):
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as http:
        r = http.get("/v1/tables/sensor_stats/keys/sensor-1", params={"as_of": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "TABLE_NOT_VERSIONED", r.text
        assert http.get("/v1/tables/sensor_stats/keys/sensor-1/versions").json()["error"]["code"] == \
            "TABLE_NOT_VERSIONED"
        old = int(time.time() * 1000) - 8 * DAY_MS
        r = http.get("/v1/tables/prices/keys/pair-1", params={"as_of": old})
        body = r.json()["error"]
        assert r.status_code == 404 and body["code"] == "VERSION_NOT_RETAINED", r.text
        assert old + DAY_MS - 60_000 < body["oldest_retained"] <= int(time.time() * 1000) - 7 * DAY_MS
        for bad in ("yesterday", "2026-11-29T10:00:00", "-5"):  # no offset: ambiguous
            r = http.get("/v1/tables/prices/keys/pair-1", params={"as_of": bad})
            assert r.status_code == 400 and r.json()["error"]["field"] == "as_of", (bad, r.text)
        r = http.get("/v1/tables/prices/keys/pair-1/versions", params={"from": 10, "to": 5})
        assert r.status_code == 400 and r.json()["error"]["field"] == "from"
    refused = freshroute(stack, "table", "add", "p2", "--topic", prices[0], "--history-retention", "-5")
    assert refused.returncode == 2 and "--history-retention" in refused.stderr and "Traceback" not in refused.stderr


def test_the_console_asks_as_of_a_time_and_draws_a_keys_versions(stack, prices):
    _, model = prices
    key = "pair-5"
    versions = model.versions(key)
    with browser_page(f"{stack.config.rest_url}/console") as console:
        page = console.page
        console.wait_for(lambda: page.evaluate("document.querySelectorAll('#nodes tbody tr').length") > 0, 20,
                         "the console to draw the cluster")
        page.fill("#lookup-table", "prices")
        page.dispatch_event("#lookup-table", "input")
        assert page.is_visible("#lookup-as-of") and not page.is_visible("#lookup-from")
        page.fill("#lookup-key", key)
        # The oldest version, asked for by its time in the page's own time zone.
        at = versions[-1][0]
        local = page.evaluate(f"new Date({at} - new Date({at}).getTimezoneOffset() * 60000).toISOString().slice(0, 23)")
        page.fill("#lookup-as-of", local)
        page.click("#lookup-form button[type=submit]")
        page.wait_for_selector("#lookup-as-of-answer", timeout=10_000)
        answer = page.evaluate("""() => { const p = document.querySelector('#lookup-as-of-answer');
            return [Number(p.dataset.validFrom), p.dataset.final, JSON.parse(
                document.querySelector('#lookup-json').textContent).value]; }""")
        assert answer == [at, "true", versions[-1][2]]
        page.check("#lookup-versions")
        page.click("#lookup-form button[type=submit]")
        page.wait_for_selector("svg.versions rect", timeout=10_000)
        drawn = page.evaluate("[...document.querySelectorAll('svg.versions rect')].map(r => "
                              "[Number(r.dataset.validFrom), r.getAttribute('class')])")
        want = [[f, "deleted" if v is None else "latest" if to is None else "final"] for f, to, v in versions]
        assert drawn == want


def node_versions(read_address: str, table: str, key: str) -> list[tuple[int, int | None, bytes | None]] | None:
    """A key's versions straight from one store node's read port, every one it holds (no retention cut); None while
    its replica cannot be read (restoring)."""
    raw = serialize_key(key)
    read = range_read(1, table, partition_for(raw, PARTITIONS), raw, b"", 1000, VersionFilter(0, 1 << 62), NO_BOUND)
    host, port = read_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(frame(store_pb2.ReadBatch(ranges=[read]).SerializeToString()))
        reader, payloads = FrameReader(), []
        while not payloads:
            payloads = reader.feed(s.recv(1 << 20))
    answer = range_result(store_pb2.ResultBatch.FromString(payloads[0]).ranges[0])
    if answer.status != 0:
        return None
    return [(v.valid_from_ms, v.valid_to_ms, v.value) for v in answer.versions]


def hosts(stack, name: str, table: str, key: str) -> bool:
    partition = partition_for(serialize_key(key), PARTITIONS)
    return f"{table}/{partition}" in node_status(stack.components[name].addresses["address"]).tables


def test_versions_expire_exactly_when_replaced_longer_ago_than_the_retention(stack):
    c = stack.config
    topic = f"{c.topic_prefix}quotes"
    ensure_topic(AdminClient({"bootstrap.servers": c.bootstrap}), topic, PARTITIONS, {"cleanup.policy": "compact"})
    now = int(time.time() * 1000)
    # Kept 40 s after replaced. q1: replaced 120 s ago (expires at once), then 22 s ago (expires 18 s from now: time
    # enough to see it held first, which takes 3-5 s); q2: one version, never expires; q3: deleted 90 s ago (a delete
    # that old reads as never held).
    records = [(b"q1", b'{"v":1}', now - 150_000), (b"q1", b'{"v":2}', now - 120_000), (b"q1", b'{"v":3}', now - 22_000),
               (b"q2", b'{"v":1}', now - 300_000), (b"q3", b'{"v":1}', now - 200_000), (b"q3", None, now - 90_000)]
    produce(c.bootstrap, topic, records)
    md = metadata(stack)
    added = freshroute(stack, "table", "add", "quotes", "--topic", topic, "--history-retention", "40s")
    assert added.returncode == 0, added.stderr
    try:
        holders = lambda key: [n for n in stack.store_node_names() if stack.components[n].alive()  # noqa: E731
                               and hosts(stack, n, "quotes", key)]
        wait_until(lambda: len(holders("q1")) == 2 and len(holders("q3")) == 2, 60, "both copies of quotes",
                   stack=stack)

        def held(key: str) -> list[list[int] | None]:
            return [[f for f, _, _ in got] if (got := node_versions(stack.components[n].addresses["read_address"],
                                                                    "quotes", key)) is not None else None
                    for n in holders(key)]

        # Replaced more than 40 s ago: q1's first version, q3's first and its delete; nothing else.
        wait_until(lambda: held("q1") == [[now - 22_000, now - 120_000]] * 2 and held("q3") == [[]] * 2, 18,
                   "the expired versions to go from both copies", stack=stack)
        # q2's partition is not q1's or q3's: its two copies are waited for on their own (placed and readable).
        wait_until(lambda: len(holders("q2")) == 2 and None not in held("q2"), 60, "both copies of q2's partition",
                   stack=stack)
        assert held("q2") == [[now - 300_000]] * 2

        def expired_total() -> int:
            return sum(int(s.value) for n in stack.store_node_names() if stack.components[n].alive()
                       for s in scrape(stack.components[n].addresses["metrics"])
                       if s.name == "freshroute_replica_versions_expired_total" and s.labels.get("table") == "quotes")

        assert expired_total() == 2 * 3
        # q1's second version was replaced 22 s before the start: it goes 40 s after that, and q1 keeps its latest.
        wait_until(lambda: held("q1") == [[now - 22_000]] * 2, 60, "q1's second version to expire", stack=stack)
        assert expired_total() == 2 * 4
        with httpx.Client(base_url=c.rest_url, timeout=10) as http:
            assert http.get("/v1/tables/quotes/keys/q1").json()["value"] == {"v": 3}
            assert http.get("/v1/tables/quotes/keys/q2", params={"as_of": now - 1_000}).json()["value"] == {"v": 1}
    finally:
        if "quotes" in md.tables():
            md.remove_table("quotes")


def test_versions_survive_a_kill_9_and_an_empty_disk_restore(stack, prices):
    _, model = prices
    md = metadata(stack)
    victim = "store-node-2"
    vid = node_id(victim)
    mine = [k for k in model.at if hosts(stack, victim, "prices", k)]
    assert mine

    def serves_the_model() -> bool:
        address = stack.components[victim].addresses["read_address"]
        try:
            return all([(f, to, None if v is None else orjson.loads(v)) for f, to, v in
                        node_versions(address, "prices", k) or []] == model.versions(k) for k in mine
                       if hosts(stack, victim, "prices", k))
        except (OSError, grpc.RpcError):  # the node is starting again
            return False

    wait_until(serves_the_model, 30, f"{vid} to hold every version of its keys", stack=stack)
    stack.signal(victim, signal.SIGKILL)
    stack.start(victim)
    wait_until(lambda: fully_replicated(md, NODES), 120, "the cluster fully replicated after the kill", stack=stack)
    wait_until(serves_the_model, 60, f"{vid} to hold every version again after kill -9", stack=stack)
    stack.stop(victim)
    shutil.rmtree(stack.config.home / "data" / vid)
    stack.start(victim)
    wait_until(lambda: fully_replicated(md, NODES), 180, "the cluster fully replicated after the restore", stack=stack)
    wait_until(serves_the_model, 60, f"{vid} to hold every version after restoring an empty disk", stack=stack)
    log = (stack.config.home / "logs" / f"{victim}.log").read_text()
    assert "restoring from the start of changelog" in log

"""Store nodes as real processes against the real broker and Redis, queried over gRPC.

Each test registers its own table in its own namespace, creates its changelog topic with 8
partitions, produces the changelog itself (keys placed with ``partition_for``, as the
pipeline does), starts store nodes with ``python -m store_node`` and checks what they serve.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import grpc
import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from grpc_health.v1 import health_pb2, health_pb2_grpc

from freshroute import input_position
from freshroute.keys import partition_for, serialize_key
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.tables import TableSpec
from loadtest.readport import read_batch
from proto import store_pb2, store_pb2_grpc
from tools.local.services import free_port, start_broker

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 8

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no Spark, no shared stack: runs beside the others


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except grpc.RpcError as e:  # a node still starting
            last_error = e
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last error: {last_error})")


class Changelog:
    """One table's changelog topic, and what a correct replica should hold."""

    def __init__(self, bootstrap: str, redis_url: str, namespace: str, standby_replicas: int = 1,
                 topic_config: dict[str, str] | None = None) -> None:
        self.topic_config = {"cleanup.policy": "compact", **(topic_config or {})}
        self.spec = TableSpec("counts", f"{namespace}.counts.changelog", PARTITIONS, "key",
                              standby_replicas=standby_replicas)
        self.bootstrap = bootstrap
        self.metadata = MetadataStore.from_url(redis_url, namespace)
        self.expected: dict[str, bytes | None] = {}
        self.per_partition: dict[int, int] = defaultdict(int)  # records produced per partition
        self.create_topic()
        self.metadata.register_tables([self.spec])
        # Not auto-creating: after a broker restart it would make the topic (4 partitions) before the test does.
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                                   "allow.auto.create.topics": False})

    def create_topic(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(self.spec.topic, PARTITIONS, 1, config=self.topic_config)])
        futures[self.spec.topic].result(30)

    def produce(self, key: str, value: dict | None | bytes, position: list[int | None] | None = None) -> None:
        """A row of ``key``; ``position``: the input position it reflects (freshroute.input_position), if any."""
        raw = value if isinstance(value, bytes) or value is None else json.dumps(value).encode()
        p = self.partition(key)
        headers = None if position is None else [(input_position.HEADER, input_position.encode(position))]
        self._producer.produce(self.spec.topic, key=serialize_key(key), value=raw, partition=p, headers=headers)
        self.per_partition[p] += 1
        if raw is None or isinstance(value, dict):
            self.expected[key] = raw

    def flush(self) -> None:
        assert self._producer.flush(30) == 0

    def close(self) -> None:
        """Drop the producer now, while its broker is still up (it would otherwise retry until exit)."""
        self._producer = None
        self.metadata.redis.close()

    @staticmethod
    def partition(key: str) -> int:
        return partition_for(serialize_key(key), PARTITIONS)


class NodeProcess:
    """One ``python -m store_node`` process this test started (stopped by its own pid only)."""

    def __init__(self, node_id: str, data_dir: Path, env: dict[str, str], log_dir: Path,
                 command: list[str] | None = None) -> None:
        self.node_id = node_id
        self.command = command or [sys.executable, "-m", "store_node"]
        self.data_dir = data_dir
        self.env = env
        self.log_path = log_dir / f"{node_id}.log"
        self.proc: subprocess.Popen | None = None
        self.address: str | None = None
        self.read_address: str | None = None
        self._channel: grpc.Channel | None = None

    def start(self, timeout_s: float = 60.0) -> "NodeProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command, cwd=REPO, env=self.env,
                                     stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        text = line[0].decode() if line else ""
        if "listening on" not in text:
            self.stop()
            raise AssertionError(f"{self.node_id} did not start: {text!r}; log:\n{self.log()[-3000:]}")
        # "store-node ID listening on HOST:PORT, read port HOST:PORT"
        self.address, self.read_address = text.split(" listening on ")[1].strip().split(", read port ")
        self._channel = grpc.insecure_channel(self.address)
        return self

    @property
    def stub(self) -> store_pb2_grpc.StoreNodeStub:
        return store_pb2_grpc.StoreNodeStub(self._channel)

    def status(self) -> store_pb2.NodeStatus:
        return self.stub.Status(store_pb2.StatusRequest(), timeout=5)

    def read(self, batch: store_pb2.ReadBatch) -> store_pb2.ResultBatch:
        """``batch`` answered on the node's read port."""
        return read_batch(self.read_address, batch, timeout_s=30)

    def health(self) -> int:
        return health_pb2_grpc.HealthStub(self._channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                timeout=5).status

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode


@pytest.fixture
def cluster(broker, redis_url, namespace, tmp_path):
    """Starts store nodes on demand; stops every one it started, by pid, at the end."""
    started: list[NodeProcess] = []
    changelogs: list[Changelog] = []

    class Cluster:
        def changelog(self, standby_replicas: int = 1, bootstrap: str | None = None,
                      topic_config: dict[str, str] | None = None) -> Changelog:
            changelogs.append(Changelog(bootstrap or broker, redis_url, namespace, standby_replicas, topic_config))
            return changelogs[-1]

        def node(self, node_id: str, bootstrap: str | None = None, command: list[str] | None = None,
                 **settings) -> NodeProcess:
            env = {k: v for k, v in os.environ.items() if not k.startswith("FRESHROUTE_")}
            env.update({"FRESHROUTE_NODE_ID": node_id, "FRESHROUTE_BOOTSTRAP_SERVERS": bootstrap or broker,
                        "FRESHROUTE_REDIS_URL": redis_url, "FRESHROUTE_NAMESPACE": namespace,
                        "FRESHROUTE_DATA_DIR": str(tmp_path / node_id), "FRESHROUTE_PORT": "0",
                        "PYTHONPATH": str(REPO)})
            env.update({f"FRESHROUTE_{k.upper()}": str(v) for k, v in settings.items()})
            proc = NodeProcess(node_id, tmp_path / node_id, env, tmp_path, command)
            started.append(proc)
            return proc.start()

    yield Cluster()
    for proc in started:
        proc.stop()
    for changelog in changelogs:
        changelog.close()


def caught_up(node: NodeProcess, changelog: Changelog, replicas: int = PARTITIONS):
    """The node's Status if it hosts ``replicas`` replicas, all serving and at the changelog's end."""
    st = node.status()
    if len(st.replicas) != replicas:
        return None
    ends = {int(t.split("/")[1]): r for t, r in zip(st.tables, st.replicas)}
    for p, r in ends.items():
        if r.state == store_pb2.RESTORING or not r.HasField("lag_offsets") or r.lag_offsets != 0 \
                or r.applied_offset < changelog.per_partition[p]:
            return None
    return st


def settled(metadata: MetadataStore, changelog: Changelog, *nodes: NodeProcess):
    """The assignment if it places 1 active + 1 standby per partition on distinct nodes, actives
    balanced, every node caught up and following it; else None."""
    assignment = metadata.assignment()
    if assignment is None or len(assignment.replicas) != PARTITIONS:
        return None
    if any(len(set(ns)) != 2 for ns in assignment.replicas.values()):
        return None
    actives = [ns[0] for ns in assignment.replicas.values()]
    counts = [actives.count(n.node_id) for n in nodes]
    if max(counts) - min(counts) > 1:
        return None
    for node in nodes:
        st = caught_up(node, changelog)
        if not st:
            return None
        roles = {t: r.role for t, r in zip(st.tables, st.replicas)}
        for (table, p), ns in assignment.replicas.items():
            if roles[f"{table}/{p}"] != (store_pb2.ACTIVE if ns[0] == node.node_id else store_pb2.STANDBY):
                return None
    return assignment if assignment == metadata.assignment() else None  # and nothing moved meanwhile


def read_all(node: NodeProcess, keys: list[str], **bound) -> dict[str, store_pb2.KeyResult]:
    reads = [store_pb2.KeyRead(id=i, table="counts", partition=Changelog.partition(k), key=serialize_key(k),
                               bound=store_pb2.ReadBound(**bound)) for i, k in enumerate(keys)]
    results = node.read(store_pb2.ReadBatch(reads=reads)).results
    return {keys[r.id]: r for r in results}


def test_serves_latest_values_tombstones_and_scans(cluster):
    changelog = cluster.changelog(standby_replicas=0)
    keys = [f"user-{i}" for i in range(400)]
    for round_ in range(5):
        for i, k in enumerate(keys):
            changelog.produce(k, {"key": k, "round": round_, "n": i})
    for k in keys[::7]:
        changelog.produce(k, None)  # deleted
    changelog.produce("poison", b"{not json")
    changelog.flush()

    metrics_port = free_port()
    node = cluster.node("solo", metrics_port=metrics_port)
    st = wait_until(lambda: caught_up(node, changelog), 90, "the node to restore every partition")
    wait_until(lambda: node.health() == health_pb2.HealthCheckResponse.SERVING, 10, "health SERVING")
    assert all(r.role == store_pb2.ACTIVE and r.state == store_pb2.SERVING_ACTIVE for r in st.replicas)
    assert sum(c.records_skipped for c in st.counters) == 1
    assert sum(c.records_applied for c in st.counters) == sum(changelog.per_partition.values()) - 1
    assert f"restoring {PARTITIONS} partition(s) of {changelog.spec.topic} in bulk" in node.log()

    # The same, as Prometheus scrapes it.
    from prometheus_client.parser import text_string_to_metric_families

    scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    samples = {(s.name, s.labels.get("partition"), s.labels.get("role")): s.value
               for family in text_string_to_metric_families(scraped) for s in family.samples}
    parts = [str(p) for p in range(PARTITIONS)]
    assert [samples[("freshroute_replica_lag_offsets", p, "active")] for p in parts] == [0] * PARTITIONS
    assert [samples[("freshroute_replica_restoring", p, "active")] for p in parts] == [0] * PARTITIONS
    assert [samples[("freshroute_replica_applied_offset", p, "active")] for p in parts] == [
        changelog.per_partition[int(p)] for p in parts]
    assert sum(samples[("freshroute_replica_records_applied_total", p, "active")] for p in parts) == \
        sum(changelog.per_partition.values()) - 1
    assert sum(samples[("freshroute_replica_records_skipped_total", p, "active")] for p in parts) == 1
    assert samples[("freshroute_node_replicas", None, "active")] == PARTITIONS

    results = read_all(node, keys + ["poison", "never-written"], max_lag=0)
    for k in keys:
        want = changelog.expected[k]
        got = results[k]
        if want is None:
            assert got.status == store_pb2.NOT_FOUND, k
        else:
            assert got.status == store_pb2.OK and json.loads(got.value) == json.loads(want), k
        assert got.replica.node == "solo" and got.replica.lag_offsets == 0
        assert got.replica.applied_offset == changelog.per_partition[Changelog.partition(k)]
    assert results["poison"].status == store_pb2.NOT_FOUND
    assert results["never-written"].status == store_pb2.NOT_FOUND

    # A group: one partition's keys answered together, in order (empty: no such key).
    p = Changelog.partition("user-1")
    group_keys = [k for k in keys if Changelog.partition(k) == p][:20]
    [group] = node.read(store_pb2.ReadBatch(groups=[store_pb2.GroupRead(
        id=1, table="counts", partition=p, keys=[serialize_key(k) for k in group_keys])])).groups
    assert group.status == store_pb2.OK
    assert list(group.values) == [changelog.expected[k] or b"" for k in group_keys]

    # A range of one partition in key order (a scan's page), bounded and limited.
    live = sorted(k.encode() for k, v in changelog.expected.items() if v is not None and Changelog.partition(k) == p)
    [ranged, limited] = node.read(store_pb2.ReadBatch(ranges=[
        store_pb2.RangeRead(id=1, table="counts", partition=p, start=b"user-", end=b"user.", limit=10_000),
        store_pb2.RangeRead(id=2, table="counts", partition=p, limit=3)])).ranges
    assert ranged.status == store_pb2.OK and [e.key for e in ranged.entries] == live
    assert [e.key for e in limited.entries] == live[:3]

    # Server reflection lists the store API and the health service.
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    services = ProtoReflectionDescriptorDatabase(node._channel).get_services()
    assert "freshroute.store.v1.StoreNode" in services and "grpc.health.v1.Health" in services

    [not_hosted] = node.read(store_pb2.ReadBatch(reads=[store_pb2.KeyRead(table="other", partition=0,
                                                                             key=b"x")])).results
    assert not_hosted.status == store_pb2.NOT_HOSTED
    assert node.stop() == 0  # SIGTERM: drained and closed cleanly
    assert "stopped" in node.log()


def test_empty_changelog_is_served_at_once_via_the_cli(cluster):
    changelog = cluster.changelog(standby_replicas=0)
    node = cluster.node("cli", command=[sys.executable, "-m", "tools.cli", "store-node", "--heartbeat-ms", "150"])
    wait_until(lambda: caught_up(node, changelog), 60, "every (empty) replica to serve")
    wait_until(lambda: node.health() == health_pb2.HealthCheckResponse.SERVING, 10, "health SERVING")
    r = read_all(node, ["anything"], max_lag=0, max_staleness_ms=2000)["anything"]
    assert r.status == store_pb2.NOT_FOUND and r.replica.end_offset == 0 and r.replica.staleness_ms == 0


def test_restart_resumes_from_the_stored_offset(cluster):
    changelog = cluster.changelog(standby_replicas=0)
    keys = [f"k{i}" for i in range(300)]
    for k in keys:
        changelog.produce(k, {"v": 1})
    changelog.flush()
    node = cluster.node("n1")
    before = wait_until(lambda: caught_up(node, changelog), 90, "the first restore")
    applied_before = {t: r.applied_offset for t, r in zip(before.tables, before.replicas)}
    assert node.stop() == 0

    produced_before = dict(changelog.per_partition)
    for k in keys[:100]:
        changelog.produce(k, {"v": 2})
    for k in keys[100:120]:
        changelog.produce(k, None)
    changelog.flush()
    new_records = {p: changelog.per_partition[p] - produced_before.get(p, 0) for p in range(PARTITIONS)}

    node = cluster.node("n1")
    after = wait_until(lambda: caught_up(node, changelog), 90, "the node to catch up after its restart")
    for table, r, c in zip(after.tables, after.replicas, after.counters):
        p = int(table.split("/")[1])
        assert c.resumed_from == applied_before[table]  # resumed from its checkpoint, not from 0
        assert c.records_applied == new_records[p]  # and applied only what was new
        assert c.restores == 0
        assert r.applied_offset == changelog.per_partition[p]
    results = read_all(node, keys, max_lag=0)
    for k in keys:
        want = changelog.expected[k]
        assert (results[k].status == store_pb2.NOT_FOUND) if want is None else (results[k].value == want)
    assert "resuming changelog" in node.log()


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "record-by-record"])
def test_a_restore_from_a_changelog_holding_a_replays_older_rows_serves_the_newer_ones(cluster, bulk):
    # What a Real-time query's changelog holds after a crash: each key's row as served (count 9 at input offset 9),
    # then the replay's older rows of it (count 4 at 4); for half the keys the replay has caught up (count 10 at 10).
    changelog = cluster.changelog(standby_replicas=0)
    keys = [f"k{i}" for i in range(200)]
    for k in keys:
        changelog.produce(k, {"count": 9}, position=[None, 9])
    for k in keys:
        changelog.produce(k, {"count": 4}, position=[None, 4])
    for k in keys[:100]:
        changelog.produce(k, {"count": 10}, position=[None, 10])
    changelog.produce("plain", {"count": 1})  # a row without a position: applied, as a micro-batch pipeline's
    changelog.produce("plain", {"count": 2})
    changelog.flush()
    metrics_port = free_port()
    node = cluster.node("n1", bulk_restore=str(bulk).lower(), metrics_port=metrics_port)
    wait_until(lambda: caught_up(node, changelog), 90, "the restore")
    assert ("read in bulk" in node.log()) is bulk
    results = read_all(node, [*keys, "plain"], max_lag=0)
    served = {k: json.loads(r.value)["count"] for k, r in results.items()}
    assert served == {**{k: 10 for k in keys[:100]}, **{k: 9 for k in keys[100:]}, "plain": 2}
    scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    counted = {name: sum(float(line.rsplit(" ", 1)[1]) for line in scraped.splitlines()
                         if line.startswith(f"freshroute_replica_records_{name}_total{{"))
               for name in ("superseded", "unpositioned")}
    assert counted == {"superseded": 200, "unpositioned": 2}

    # Restarted, it resumes from its checkpoint with the positions the restore left: a late replayed row is skipped.
    assert node.stop() == 0
    changelog.produce(keys[0], {"count": 5}, position=[None, 5])
    changelog.produce(keys[150], {"count": 11}, position=[None, 11])
    changelog.flush()
    node = cluster.node("n1")
    wait_until(lambda: caught_up(node, changelog), 90, "the node to catch up after its restart")
    results = read_all(node, [keys[0], keys[150]], max_lag=0)
    assert [json.loads(results[k].value)["count"] for k in (keys[0], keys[150])] == [10, 11]


def test_lagging_replica_refuses_a_zero_lag_bound(cluster):
    changelog = cluster.changelog(standby_replicas=0)
    for i in range(4000):
        changelog.produce(f"k{i % 500}", {"i": i})
    changelog.flush()
    # Throttled restore: records come partition by partition, so even the first partition (~500 records) stays far
    # behind for many seconds after the slowest step of this test.
    node = cluster.node("slow", apply_rate_limit=25)

    def lagging():
        st = node.status()
        return len(st.replicas) == PARTITIONS and all(r.lag_offsets > 0 for r in st.replicas) and st

    wait_until(lagging, 60, "the replicas to know their end offsets")
    assert node.health() == health_pb2.HealthCheckResponse.NOT_SERVING  # still restoring
    keys = [f"k{i}" for i in range(500)]
    tight = read_all(node, keys, max_lag=0)
    assert all(r.status == store_pb2.TOO_STALE for r in tight.values())
    assert all(r.replica.lag_offsets > 0 and r.replica.state == store_pb2.RESTORING for r in tight.values())
    assert all(not r.value for r in tight.values())
    # Loading its changelog into an empty store, a replica answers no caller until caught up (its memtable cannot
    # serve a lookup), saying so with how far behind it is; one come within caught_up_threshold since is reopened for
    # reads and answers.
    loose = read_all(node, keys)
    loading = [r for r in loose.values() if r.replica.state == store_pb2.RESTORING]
    assert len(loading) > len(keys) // 2  # throttled: most are still far behind
    assert all(r.status == store_pb2.TOO_STALE and "loading its changelog into an empty store" in r.message
               and r.replica.lag_offsets > 0 for r in loading)
    assert all(r.status in (store_pb2.OK, store_pb2.NOT_FOUND) for r in loose.values() if r not in loading)
    # A position beyond what the replica applied is refused too.
    r = read_all(node, ["k1"], min_offset=changelog.per_partition[Changelog.partition("k1")])["k1"]
    assert r.status == store_pb2.TOO_STALE


def test_a_replica_resuming_behind_its_changelog_answers_unbounded_reads_labelled(cluster):
    changelog = cluster.changelog(standby_replicas=0)
    keys = [f"k{i}" for i in range(500)]
    for i, k in enumerate(keys):
        changelog.produce(k, {"i": i})
    changelog.flush()
    node = cluster.node("n1")
    wait_until(lambda: caught_up(node, changelog), 90, "the first restore")
    assert node.stop() == 0
    for i in range(4000):
        changelog.produce(keys[i % 500], {"i": 500 + i})
    changelog.flush()
    node = cluster.node("n1", apply_rate_limit=200)  # resumes from its checkpoint, throttled: behind for seconds

    def lagging():
        st = node.status()
        return len(st.replicas) == PARTITIONS and all(r.lag_offsets > 0 for r in st.replicas) and st

    wait_until(lagging, 60, "the replicas to know their end offsets")
    loose = read_all(node, keys)
    # Every key was there before the restart: answered from the rows it holds, labelled with how far behind it is.
    assert all(r.status == store_pb2.OK and r.value for r in loose.values())
    assert all(r.replica.lag_offsets > 0 and r.replica.state == store_pb2.RESTORING for r in loose.values())
    assert all(r.status == store_pb2.TOO_STALE for r in read_all(node, keys, max_lag=0).values())


def test_two_nodes_place_active_and_standby_apart_and_fail_over(cluster, redis_url, namespace):
    changelog = cluster.changelog(standby_replicas=1)
    keys = [f"item-{i}" for i in range(200)]
    for k in keys:
        changelog.produce(k, {"k": k})
    changelog.flush()
    a = cluster.node("a")
    b = cluster.node("b")
    metadata = MetadataStore.from_url(redis_url, namespace)

    wait_until(lambda: settled(metadata, changelog, a, b), 120,
               "an active and a standby of every partition on distinct nodes, roles followed")
    # The standby answers too, with its own status.
    for node in (a, b):
        results = read_all(node, keys, max_lag=0)
        assert all(results[k].value == changelog.expected[k] for k in keys)
        assert {r.replica.node for r in results.values()} == {node.node_id}
        assert {r.replica.role for r in results.values()} == {store_pb2.ACTIVE, store_pb2.STANDBY}

    # Kill a (no drain, no goodbye): its heartbeat expires and b takes every active.
    a.stop(signal.SIGKILL)
    t0 = time.monotonic()

    def b_has_everything():
        st = b.status()
        return len(st.replicas) == PARTITIONS and all(r.role == store_pb2.ACTIVE for r in st.replicas)

    wait_until(b_has_everything, 60, "b to take over every active")
    failover_s = time.monotonic() - t0
    assert failover_s < 30
    results = read_all(b, keys, max_lag=0)
    assert all(results[k].value == changelog.expected[k] for k in keys)
    print(f"failover after SIGKILL took {failover_s:.1f}s")


def test_a_recreated_changelog_makes_replicas_wipe_and_restore(cluster, broker):
    """A changelog deleted and created again is another topic: replicas must not keep serving the old one."""
    changelog = cluster.changelog(standby_replicas=0)
    for i in range(200):
        changelog.produce(f"old-{i}", {"gen": 1})
    changelog.flush()
    node = cluster.node("n1")
    wait_until(lambda: caught_up(node, changelog), 90, "the first restore")

    admin = AdminClient({"bootstrap.servers": broker})
    admin.delete_topics([changelog.spec.topic])[changelog.spec.topic].result(30)
    wait_until(lambda: changelog.spec.topic not in admin.list_topics(timeout=5).topics, 30, "the topic to go")
    wait_until(lambda: _created(changelog), 30, "the topic to be created again")
    changelog.expected.clear()
    changelog.per_partition.clear()
    for i in range(20):
        changelog.produce(f"new-{i}", {"gen": 2})
    changelog.flush()

    def restored():
        st = caught_up(node, changelog)
        return st and all(c.restores >= 1 for c in st.counters) and st

    st = wait_until(restored, 120, "every replica to be wiped and restored from the new changelog")
    assert all(r.applied_offset == changelog.per_partition[int(t.split("/")[1])]
               for t, r in zip(st.tables, st.replicas))
    results = read_all(node, [f"old-{i}" for i in range(200)] + [f"new-{i}" for i in range(20)])
    assert all(results[f"old-{i}"].status == store_pb2.NOT_FOUND for i in range(200))
    assert all(results[f"new-{i}"].value == b'{"gen": 2}' for i in range(20))
    assert "wiping it and restoring" in node.log()  # found out of range, or by the new topic id


def _created(changelog: Changelog) -> bool:
    """Create the topic; False while the broker still finishes deleting its previous incarnation."""
    from confluent_kafka import KafkaException

    try:
        changelog.create_topic()
        return True
    except KafkaException:
        return False


def test_a_broker_restart_keeps_the_changelog_and_replicas_resume_without_restoring(cluster, tmp_path):
    from tools.local.services import free_port

    port = free_port()
    own = start_broker(tmp_path / "own-broker", port=port)
    try:
        changelog = cluster.changelog(standby_replicas=0, bootstrap=own.address)
        for i in range(200):
            changelog.produce(f"k-{i}", {"gen": 1})
        changelog.flush()
        node = cluster.node("n1", bootstrap=own.address)
        wait_until(lambda: caught_up(node, changelog), 90, "the first restore")

        own.stop()
        own = start_broker(tmp_path / "own-broker", port=port)  # the same storage
        for i in range(0, 200, 2):
            changelog.produce(f"k-{i}", {"gen": 2})
        changelog.flush()
        st = wait_until(lambda: caught_up(node, changelog), 90, "the replicas to apply the writes after the restart")
        assert [c.restores for c in st.counters] == [0] * PARTITIONS
        assert sum(r.applied_offset for r in st.replicas) == 300
        results = read_all(node, [f"k-{i}" for i in range(200)])
        assert [results[f"k-{i}"].value for i in range(200)] == [
            b'{"gen": 2}' if i % 2 == 0 else b'{"gen": 1}' for i in range(200)]
    finally:
        own.stop()


def test_a_compacted_changelog_restores_only_its_distinct_keys_and_its_tail(cluster):
    """Kafka's cleaner compacts the closed segments: an empty replica reads one record per key there, plus the tail."""
    changelog = cluster.changelog(standby_replicas=0, topic_config={"segment.ms": "1000",
                                                                     "min.cleanable.dirty.ratio": "0.01"})
    keys = [f"user-{i}" for i in range(80)]
    for round_ in range(25):
        for k in keys:
            changelog.produce(k, {"key": k, "round": round_})
    changelog.flush()
    time.sleep(1.5)  # past segment.ms: the next record of each partition rolls a new segment
    for k in keys:
        changelog.produce(k, {"key": k, "round": "tail"})
    changelog.flush()
    written = sum(changelog.per_partition.values())
    assert written == 26 * len(keys)

    def compacted() -> int | None:
        from freshroute.changelog_reader import consume_to_end

        count, _, _ = consume_to_end(changelog.bootstrap, changelog.spec.topic, timeout_s=30)
        return count if count <= 2 * len(keys) else None

    held = wait_until(compacted, 90, "the cleaner to compact the closed segments", interval_s=2)
    node = cluster.node("fresh")
    st = wait_until(lambda: caught_up(node, changelog), 90, "the restore of the compacted changelog")
    applied = sum(c.records_applied for c in st.counters)
    # At most one record per key in the cleaned segments, and the tail (one per key).
    assert len(keys) <= applied <= held <= 2 * len(keys), (applied, held, written)
    assert sum(r.applied_offset for r in st.replicas) == written  # positions are offsets, gaps and all
    results = read_all(node, keys)
    assert {k: results[k].value for k in keys} == {k: changelog.expected[k] for k in keys}
    assert all(json.loads(changelog.expected[k])["round"] == "tail" for k in keys)


def test_graceful_stop_hands_actives_over_without_waiting_for_expiry(cluster):
    changelog = cluster.changelog(standby_replicas=1)
    for i in range(100):
        changelog.produce(f"k{i}", {"i": i})
    changelog.flush()
    # An expiry far above the hand-over time shows that the hand-over does not wait for one.
    slow = {"node_expiry_ms": 5000, "assignor_lease_ms": 5000}
    a = cluster.node("a", drain_timeout_ms=3000, **slow)
    b = cluster.node("b", **slow)

    def both_serving_actives():
        sa, sb = caught_up(a, changelog), caught_up(b, changelog)
        return sa and sb and any(r.role == store_pb2.ACTIVE for r in sa.replicas) and \
            any(r.role == store_pb2.ACTIVE for r in sb.replicas)

    wait_until(both_serving_actives, 120, "both nodes to hold actives")
    a.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    # While a drains it says so, answers NOT_SERVING, and b takes every active.
    wait_until(lambda: a.status().draining, 10, "a to report draining")
    assert a.health() == health_pb2.HealthCheckResponse.NOT_SERVING
    wait_until(lambda: all(r.role == store_pb2.ACTIVE for r in b.status().replicas), 10, "b to take every active")
    handover_s = time.monotonic() - t0
    assert handover_s < 2.0  # well under the 5 s heartbeat expiry: no waiting for a to be declared dead
    assert a.proc.wait(30) == 0
    print(f"hand-over on SIGTERM took {handover_s:.2f}s")


def test_redis_loss_loses_no_data_and_no_placement(cluster, broker, tmp_path, namespace):
    """Redis holds soft state only: while it is down nodes keep serving; a restarted, empty Redis is rebuilt."""
    from tools.local.services import free_port, start_redis

    port = free_port()
    redis_svc = start_redis(tmp_path / "own-redis", port=port)
    try:
        changelog = Changelog(broker, redis_svc.address, namespace, standby_replicas=1)
        for i in range(200):
            changelog.produce(f"k{i}", {"i": i})
        changelog.flush()
        a = cluster.node("a", redis_url=redis_svc.address)
        b = cluster.node("b", redis_url=redis_svc.address)
        wait_until(lambda: settled(changelog.metadata, changelog, a, b), 120, "a settled assignment")
        before = {n.node_id: {t: r.role for t, r in zip(n.status().tables, n.status().replicas)} for n in (a, b)}

        redis_svc.stop()
        for i in range(200, 220):
            changelog.produce(f"k{i}", {"i": i})  # the changelog keeps flowing
        changelog.flush()
        time.sleep(3)  # longer than the heartbeat expiry: nobody may be declared dead without Redis
        for node in (a, b):
            st = wait_until(lambda: caught_up(node, changelog), 30, "the nodes to keep applying without Redis")
            assert {t: r.role for t, r in zip(st.tables, st.replicas)} == before[node.node_id]
            results = read_all(node, [f"k{i}" for i in range(220)], max_lag=0)
            assert all(results[f"k{i}"].value == changelog.expected[f"k{i}"] for i in range(220))

        redis_svc = start_redis(tmp_path / "own-redis", port=port)  # empty: soft state lost
        changelog.metadata = MetadataStore.from_url(redis_svc.address, namespace)
        changelog.metadata.register_tables([changelog.spec])  # the pipeline re-registers its tables
        rebuilt = wait_until(changelog.metadata.assignment, 30, "the assignment to be rebuilt")
        wait_until(lambda: len(changelog.metadata.nodes()) == 2, 10, "both heartbeats")
        for node in (a, b):
            st = node.status()
            assert {t: r.role for t, r in zip(st.tables, st.replicas)} == before[node.node_id]
            assert all(c.restores == 0 for c in st.counters)
        assert {ns for ns in rebuilt.replicas.values()} == {
            tuple(sorted(("a", "b"), key=lambda n: before[n][f"{t}/{p}"] != store_pb2.ACTIVE))
            for (t, p) in rebuilt.replicas}
        for line in ("unreachable", "reachable again"):
            assert a.log().count(f"metadata store (Redis) {line}") == 1
    finally:
        redis_svc.stop()

"""What failover and scaling tests watch on a running stack: writes, placements, strict reads, liveness.

Everything here only reads (Redis, the router, store nodes' gRPC API) or produces input
readings; faults are injected by the tests through the stack, by pid.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import httpx
import orjson

from freshroute.lag import now_ms
from freshroute.keys import partition_for, serialize_key
from freshroute.metadata.assignment import Assignment
from freshroute.metadata.reports import NodeReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.store import MetadataStore
from freshroute.settings import kafka_client_config
from loadtest.readport import read_batch
from proto import store_pb2, store_pb2_grpc
from tools.local.stack import Stack
from tests.integration.stack_fixture import produced, wait_until

TABLE = "sensor_stats"


def metadata(stack: Stack) -> MetadataStore:
    return MetadataStore.at(stack.config.redis_location(), stack.config.namespace)


def scrape(url: str) -> list:
    """Every sample a Prometheus endpoint exposes (name, labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [s for f in text_string_to_metric_families(httpx.get(url, timeout=5).text) for s in f.samples]


def node_id(name: str) -> str:
    """Component name → node id (store-node-3 → node-3), as the local stack names them."""
    return f"node-{name.rsplit('-', 1)[1]}"


def component(node: str) -> str:
    return f"store-node-{node.rsplit('-', 1)[1]}"


class Readings:
    """Produces sensor readings at a steady rate on a thread, keeping every event for recomputation (its own in
    ``events``, and in ``produced(stack)`` with everything else produced to the stack)."""

    def __init__(self, stack: Stack, sensors: int, rate: float, seed: int = 7) -> None:
        from confluent_kafka import Producer

        from tools.local.demo import ensure_topic

        self.topic = f"{stack.config.topic_prefix}readings"
        ensure_topic(stack.config.bootstrap, self.topic)
        self.sensors = sensors
        self.rate = rate
        self.events: list[dict] = []
        self._produced = produced(stack)
        self._rng = random.Random(seed)
        self._producer = Producer(kafka_client_config(stack.config.bootstrap, **{"enable.idempotence": True,
                                                                                 "linger.ms": 5}))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _one(self, sensor: int) -> None:
        e = {"sensor": f"sensor-{sensor}", "area": f"area-{sensor % 4}",
             "reading": round(self._rng.uniform(0, 100), 2)}
        self.events.append(e)
        self._produced.append(e)
        self._producer.produce(self.topic, key=e["sensor"].encode(), value=orjson.dumps(e))
        self._producer.poll(0)

    def start(self) -> "Readings":
        for i in range(self.sensors):  # every key exists before any lookup load starts
            self._one(i)
        assert self._producer.flush(30) == 0
        self._thread = threading.Thread(target=self._run, name="readings", daemon=True)
        self._thread.start()
        return self

    def burst(self, keys: int, prefix: str = "bulk-") -> list[str]:
        """One reading for each of ``keys`` new sensors at once: a changelog large enough to restore visibly."""
        names = [f"{prefix}{i}" for i in range(keys)]
        for name in names:
            e = {"sensor": name, "area": "bulk", "reading": round(self._rng.uniform(0, 100), 2)}
            self.events.append(e)
            self._produced.append(e)
            self._producer.produce(self.topic, key=name.encode(), value=orjson.dumps(e))
            self._producer.poll(0)
        assert self._producer.flush(30) == 0
        return names

    def _run(self) -> None:
        interval = 1.0 / self.rate
        while not self._stop.wait(interval):
            self._one(self._rng.randrange(self.sensors))

    def stop(self) -> list[dict]:
        """Stop producing, wait until every reading is acknowledged; returns all events."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        assert self._producer.flush(30) == 0
        return list(self.events)


def assert_clean_load(summary: dict, per_s: float) -> None:
    """A lookup load's summary (``loadtest.scenario.run``): at least ``per_s`` lookups a second of load, none failed,
    and every answer checked against the changelog and consistent with it."""
    assert summary["requests"] >= per_s * summary["duration_s"], summary
    assert summary["failed"] == 0, (summary["errors_by_code"], summary["first_failures"])
    consistency = summary["consistency"]
    assert consistency["ok"], orjson.dumps(consistency, option=orjson.OPT_INDENT_2).decode()
    assert consistency["values_checked"] == summary["requests"]


def wait_every_sensor_served(stack: Stack, sensors: int, timeout_s: float = 120.0) -> None:
    """Until ``sensor-0`` … ``sensor-{sensors-1}`` are all served (any freshness)."""
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
        wait_until(lambda: all(client.get(f"/v1/tables/{TABLE}/keys/sensor-{i}").status_code == 200
                               for i in range(sensors)), timeout_s, "every sensor to be served", stack=stack)


def keys_by_partition(sensors: int, partitions: int) -> dict[int, str]:
    """One sensor key per partition (the first that hashes there)."""
    out: dict[int, str] = {}
    for i in range(sensors):
        out.setdefault(partition_for(serialize_key(f"sensor-{i}"), partitions), f"sensor-{i}")
    return out


def spread(assignment: Assignment) -> tuple[Counter, Counter]:
    """Replicas and actives per node over every table-partition (what the assignor balances)."""
    replicas: Counter = Counter()
    actives: Counter = Counter()
    for ns in assignment.replicas.values():
        replicas.update(ns)
        actives[ns[0]] += 1
    return replicas, actives


def balanced(assignment: Assignment, nodes: set[str]) -> bool:
    """Every node holds replicas and actives within one of every other's, and only ``nodes`` hold any."""
    replicas, actives = spread(assignment)
    if set(replicas) - nodes:
        return False
    r = [replicas.get(n, 0) for n in nodes]
    a = [actives.get(n, 0) for n in nodes]
    return max(r) - min(r) <= 1 and max(a) - min(a) <= 1


def fully_replicated(md: MetadataStore, nodes: set[str], copies: int = 2) -> bool:
    """Every table-partition has one active and copies-1 standbys on distinct ``nodes``, each serving in its role."""
    assignment = md.assignment()
    tables = md.tables()
    reports = md.nodes()
    if assignment is None or not tables:
        return False
    for name, spec in tables.items():
        for p in range(spec.partitions):
            ns = assignment.replicas.get((name, p), ())
            if len(ns) != min(copies, len(nodes)) or len(set(ns)) != len(ns) or not set(ns) <= nodes:
                return False
            for i, n in enumerate(ns):
                report = reports.get(n)
                if report is None or not _serves(report, name, p, Role.ACTIVE if i == 0 else Role.STANDBY):
                    return False
    return True


def _serves(report: NodeReport, table: str, partition: int, role: Role) -> bool:
    want = ReplicaState.ACTIVE if role is Role.ACTIVE else ReplicaState.STANDBY
    return any(r.table == table and r.partition == partition and r.role is role and r.state is want
               for r in report.replicas)


def lease_holder(md: MetadataStore) -> tuple[str, int] | None:
    raw = md.redis.get(md.keys.assignor)
    if raw is None:
        return None
    holder, _, generation = raw.decode().rpartition(":")
    return holder, int(generation)


@dataclass
class Watch:
    """Polls Redis every ``period_s``: when placements change, and which nodes the assignment dropped."""

    md: MetadataStore
    period_s: float = 0.02
    changes: list[tuple[float, Assignment]] = field(default_factory=list)
    dropped: list[tuple[float, str]] = field(default_factory=list)  # (time, node) a node left the assignment
    max_heartbeat_gap_ms: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watch", daemon=True)
        self._last_beat: dict[str, int] = {}
        self._ignored: dict[str, int] = {}  # node → wall-clock ms it was silenced at

    def start(self) -> "Watch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        last: Assignment | None = None
        while not self._stop.wait(self.period_s):
            try:
                a = self.md.assignment()
                beats = self.md.beats()
            except Exception:  # noqa: BLE001 - a test may stop Redis on purpose
                continue
            now = time.monotonic()
            for n, beat in beats.items():
                before = self._last_beat.get(n)
                if n in self._ignored:
                    if beat > self._ignored[n]:
                        del self._ignored[n]  # heard from again: gaps count from here on
                elif before is not None and beat > before:
                    gap = beat - before
                    self.max_heartbeat_gap_ms[n] = max(self.max_heartbeat_gap_ms.get(n, 0), gap)
                self._last_beat[n] = beat
            if a is not None and (last is None or a.replicas != last.replicas):
                if last is not None:
                    gone = {n for ns in last.replicas.values() for n in ns} - \
                        {n for ns in a.replicas.values() for n in ns}
                    self.dropped.extend((now, n) for n in sorted(gone))
                self.changes.append((now, a))
                last = a

    def forget_gaps(self, node: str) -> None:
        """A node killed or stopped on purpose: its silence until it heartbeats again is no heartbeat gap."""
        self._ignored[node] = now_ms()


class StrictProbe:
    """Strict reads (``max_lag=0``) through the router: one partition after another, every ``period_s``.

    One thread, so that the probe does not starve the load generator sharing this process.
    """

    def __init__(self, rest_url: str, keys: dict[int, str], period_s: float = 0.01) -> None:
        self.keys = keys
        self.log: dict[int, list[tuple[float, float, int, str, str]]] = {p: [] for p in keys}
        self._url = rest_url
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="strict-probe", daemon=True)

    def start(self) -> "StrictProbe":
        self._thread.start()
        return self

    def _run(self) -> None:
        with httpx.Client(base_url=self._url, timeout=5) as client:
            while not self._stop.is_set():
                for partition, key in self.keys.items():
                    if self._stop.wait(self._period):
                        return
                    sent = time.monotonic()
                    try:
                        r = client.get(f"/v1/tables/{TABLE}/keys/{key}", params={"max_lag": 0})
                        status = r.status_code
                        body = r.json()
                    except (httpx.HTTPError, ValueError):
                        status, body = 0, {}
                    served = body.get("served_by") or {}
                    self.log[partition].append((sent, time.monotonic(), status, served.get("node", ""),
                                                served.get("role", "")))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def first_ok_after(self, t0: float, not_node: str = "") -> dict[int, float | None]:
        """Per partition: seconds from ``t0`` until a strict read sent after ``t0`` was answered by a node
        other than ``not_node``."""
        out: dict[int, float | None] = {}
        for p, entries in self.log.items():
            out[p] = next((done - t0 for sent, done, status, node, _ in entries
                           if sent >= t0 and status == 200 and node != not_node), None)
        return out

    def first_active_after(self, t0: float, not_node: str) -> dict[int, float | None]:
        """Per partition: seconds from ``t0`` until a strict read was answered by a new active."""
        return {p: next((done - t0 for sent, done, status, node, role in entries
                         if sent >= t0 and status == 200 and node != not_node and role == "active"), None)
                for p, entries in self.log.items()}

    def failures_after(self, t0: float) -> int:
        return sum(1 for entries in self.log.values() for sent, _, status, _, _ in entries
                   if sent >= t0 and status != 200)


def read_from_node(read_address: str, keys: list[str], partitions: int) -> dict[str, store_pb2.KeyResult]:
    """Read keys straight from one store node's read port (no router), unbounded."""
    reads = [store_pb2.KeyRead(id=i, table=TABLE, key=serialize_key(k),
                               partition=partition_for(serialize_key(k), partitions))
             for i, k in enumerate(keys)]
    batch = read_batch(read_address, store_pb2.ReadBatch(reads=reads))
    return {keys[r.id]: r for r in batch.results}


def node_status(address: str) -> store_pb2.NodeStatus:
    with grpc.insecure_channel(address) as channel:
        return store_pb2_grpc.StoreNodeStub(channel).Status(store_pb2.StatusRequest(), timeout=5)

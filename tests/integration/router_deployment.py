"""Routers as real processes in front of three real store nodes (their read ports over RocksDB in a temp directory),
over the session's broker and Redis, with no pipeline: the test writes the tables' changelogs itself, as the pipeline
would, and holds the assignor lease so that the layout stays the one it wrote (a partition's active on one node, its
standby on the next).

Used by the router-process, transport-conformance and REST-schema modules.
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from freshroute.keys import partition_for, serialize_key
from freshroute.metadata.assignment import Assignment
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.tables import TableSpec
from freshroute.windows import WATERMARK_KEY, tumbling, watermark_value, window_key
from loadtest.restore import start_node
from tools.local.services import free_port

ROOT = Path(__file__).resolve().parents[2]
TABLE = "sensor_stats"
PARTITIONS = 4
NODES = ("n1", "n2", "n3")
# Partition p: active on NODES[p % 3], standby on the next node.
LAYOUT = {p: (NODES[p % 3], NODES[(p + 1) % 3]) for p in range(PARTITIONS)}
KEYS = 40
# A windowed table beside it: every key has windows starting at 0, 10 s and 20 s; the watermark is at 15 s.
WINDOWED = "sensor_windows"
WINDOW_STARTS = (0, 10_000, 20_000)
WATERMARK_MS = 15_000
HISTORY_MS = 7 * 86_400_000  # the table keeps a week of versions (each key has one, from its record's time)
# Optionally a table computed from an input topic (its rows TABLE's, carrying no input positions): what
# a read after a write token's input events waits on, and the marks and rejections that end the wait.
FED = "sensor_fed"
FED_INPUT_RECORDS = 10  # on each partition of its input topic
ASSIGNOR = "test"  # the lease holder: the nodes follow the test's assignment and never write their own


def value_of(i: int) -> dict:
    return {"count": i, "sum": i * 1.5}


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
    def __init__(self, procs: Procs, bootstrap: str, redis_url: str, namespace: str, fed: bool = False) -> None:
        self.procs = procs
        self.tables = (TABLE, WINDOWED, FED) if fed else (TABLE, WINDOWED)
        self.bootstrap = bootstrap
        self.redis_url = redis_url
        self.namespace = namespace
        self.store_nodes: set[str] = set()
        self.rest_port = free_port()
        self.grpc_port = free_port()
        self.rest = f"http://127.0.0.1:{self.rest_port}"
        self.generation = 0

    def topic(self, table: str) -> str:
        return f"{self.namespace}-{table}-changelog"

    @property
    def input_topic(self) -> str:
        """FED's input topic."""
        return f"{self.namespace}-readings"

    def register_tables(self) -> None:
        """What the pipeline would publish: the tables."""
        meta = MetadataStore.from_url(self.redis_url, self.namespace)
        meta.register_tables([TableSpec(TABLE, self.topic(TABLE), PARTITIONS, "sensor_id",
                                        {"count": "long", "sum": "double"}, 1, history_retention_ms=HISTORY_MS),
                              TableSpec(WINDOWED, self.topic(WINDOWED), PARTITIONS, "sensor_id", {"count": "long"},
                                        1, window=tumbling("10s")),
                              *([TableSpec(FED, self.topic(FED), PARTITIONS, "sensor_id",
                                           {"count": "long", "sum": "double"}, 1, input_topic=self.input_topic)]
                                if FED in self.tables else [])])
        meta.redis.close()

    def register(self) -> None:
        """The tables, and the layout under the test's assignor lease."""
        self.register_tables()
        meta = MetadataStore.from_url(self.redis_url, self.namespace)
        generation = meta.try_acquire_assignor(ASSIGNOR, 600_000)
        assert generation is not None, "a store node holds the assignor lease"
        self.generation = generation
        meta.write_assignment(Assignment(generation, {(t, p): nodes for t in self.tables
                                                      for p, nodes in LAYOUT.items()}), ASSIGNOR, generation)
        meta.redis.close()

    def write_changelogs(self) -> None:
        """Every key's row and windows, and each windowed partition's watermark, as the pipeline writes them."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        topics = [self.topic(t) for t in self.tables] + ([self.input_topic] if FED in self.tables else [])
        for f in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
            f.result(30)
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True})
        if FED in self.tables:
            for p in range(PARTITIONS):
                for n in range(FED_INPUT_RECORDS):
                    producer.produce(self.input_topic, key=b"s", value=b"{}", partition=p)
        for i in range(KEYS):
            key = serialize_key(f"sensor-{i}")
            p = partition_for(key, PARTITIONS)
            for table in {TABLE, FED} & set(self.tables):
                producer.produce(self.topic(table), key=key, value=orjson.dumps(value_of(i)), partition=p)
            for start in WINDOW_STARTS:
                producer.produce(self.topic(WINDOWED), key=window_key(key, start), value=orjson.dumps({"count": i}),
                                 partition=p)
        for p in range(PARTITIONS):
            producer.produce(self.topic(WINDOWED), key=WATERMARK_KEY, value=watermark_value(WATERMARK_MS), partition=p)
        assert producer.flush(30) == 0

    def start_store(self, node: str, heartbeat_ms: int = 100) -> None:
        # Nodes judge each other dead as the router does (its node_expiry_ms), when one of them holds the lease.
        proc, _, _ = start_node(self.bootstrap, self.redis_url, self.namespace, node,
                                self.procs.log_dir / "data" / node, self.procs.log_dir / f"{node}.log",
                                env={"FRESHROUTE_HOST": "127.0.0.1", "FRESHROUTE_HEARTBEAT_MS": str(heartbeat_ms),
                                     "FRESHROUTE_NODE_EXPIRY_MS": "2000", "FRESHROUTE_BLOCK_CACHE_MB": "16"})
        self.procs.procs[node] = proc
        self.store_nodes.add(node)

    def start_router(self, name: str = "router", reuse_port: bool = False, metrics_port: int | None = None,
                     rest_port: int | None = None, grpc_port: int | None = None,
                     settings: dict[str, str] | None = None, verify: ssl.SSLContext | None = None) -> subprocess.Popen:
        """A router process on the deployment's ports (or ``rest_port`` and ``grpc_port``), with ``settings`` (as
        ``FRESHROUTE_*`` variables) over the deployment's, once it answers as ready (over TLS trusting ``verify``)."""
        rest_port = rest_port if rest_port is not None else self.rest_port
        env = {"FRESHROUTE_REDIS_URL": self.redis_url, "FRESHROUTE_NAMESPACE": self.namespace,
               "FRESHROUTE_HOST": "127.0.0.1", "FRESHROUTE_REST_PORT": str(rest_port),
               "FRESHROUTE_GRPC_PORT": str(grpc_port if grpc_port is not None else self.grpc_port),
               "FRESHROUTE_REFRESH_MS": "100",
               "FRESHROUTE_NODE_EXPIRY_MS": "2000", "FRESHROUTE_REDIS_TIMEOUT_MS": "300",
               "FRESHROUTE_REUSE_PORT": "true" if reuse_port else "false",
               **({"FRESHROUTE_METRICS_PORT": str(metrics_port)} if metrics_port is not None else {}),
               **(settings or {})}
        proc = self.procs.start(name, ["-m", "router"], env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, self.procs.log(name)
            try:
                # With a shared port, the readiness answer may come from another router:
                # this one is also waited for by its own start-up line.
                r = httpx.get(f"{'https' if verify else 'http'}://127.0.0.1:{rest_port}/readyz", timeout=1,
                              verify=verify if verify is not None else True)
                if (r.status_code == 200 and r.json()["nodes"] >= len(self.store_nodes)
                        and "router serving" in self.procs.log(name)):
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{name} never became ready:\n" + self.procs.log(name))

    def caught_up(self) -> bool:
        """Every replica of the layout serving its role, at its changelog's end (as the router sees them)."""
        nodes = httpx.get(f"{self.rest}/v1/cluster", timeout=5).json()["nodes"]
        seen = {(r["table"], r["partition"], n["node"]): r for n in nodes for r in n["replicas"]}
        return all((r := seen.get((t, p, node))) is not None and r["lag"]["offsets"] == 0
                   and r["state"] == ("ACTIVE" if node == hosts[0] else "STANDBY")
                   for t in self.tables for p, hosts in LAYOUT.items() for node in hosts)

    def wait_caught_up(self, within_s: float = 60) -> None:
        deadline = time.monotonic() + within_s
        while not self.caught_up():
            for node in self.store_nodes:
                assert self.procs.procs[node].poll() is None, self.procs.log(node)
            assert time.monotonic() < deadline, httpx.get(f"{self.rest}/v1/cluster", timeout=5).text
            time.sleep(0.1)

    def nodes_up(self, slow_heartbeats: tuple[str, ...] = ()) -> None:
        """The changelogs written, the tables and layout registered, the three store nodes started."""
        self.write_changelogs()
        self.register()
        for node in NODES:
            self.start_store(node, 1000 if node in slow_heartbeats else 100)

    def up(self, slow_heartbeats: tuple[str, ...] = ()) -> None:
        """The store nodes and a router, every replica caught up."""
        self.nodes_up(slow_heartbeats)
        self.start_router()
        self.wait_caught_up()

    def stop_router(self) -> int:
        proc = self.procs.procs["router"]
        proc.send_signal(signal.SIGTERM)
        return proc.wait(15)

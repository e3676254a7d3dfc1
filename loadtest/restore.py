"""Restore rate of a store node: a changelog of its own, restored into RocksDB by a store node of its own.

A restore means something only on a changelog big enough that reading and writing records
dominate (a few hundred thousand records); a demo stack's changelog holds a few thousand after
minutes, restored in under a second, mostly spent starting the process and opening replicas.
So the measurement brings its own changelog (:class:`ScratchChangelog`: a topic on a broker, a
table spec in a Redis namespace of its own) and its own node process (:func:`start_node`), and
removes all of it afterwards: the user's tables, topics and nodes are never touched.

The node logs, per replica, ``caught up at offset X after N offsets in S s`` with a timestamp;
the restore window runs from the earliest replica start (timestamp − S) to the last catch-up,
so the rate is Σ N over that window. The node's ``Status`` (replica states and lag) says when
the restore is over.

``freshroute bench`` (on the local stack's broker and Redis) and ``python -m loadtest.node_bench``
(on a throwaway broker and Redis) both measure with these pieces.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from freshroute.proc import cpu_seconds, stat_fields
from freshroute.settings import kafka_client_config
from loadtest.loadclients import stop_process

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 8

CAUGHT_UP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*replica (\S+)/(\d+): caught up at offset (\d+) "
                       r"after (\d+) offsets in ([\d.]+)s")


def restore_rate_from_log(text: str, table: str) -> dict[str, Any] | None:
    """Σ offsets / (last catch-up − earliest start) over the replicas of ``table`` that caught up in ``text``."""
    spans = []
    for line in text.splitlines():
        m = CAUGHT_UP.match(line)
        if not m or m.group(2) != table:
            continue
        end = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        spans.append((end - float(m.group(6)), end, int(m.group(5))))
    if not spans:
        return None
    start = min(s for s, _, _ in spans)
    end = max(e for _, e, _ in spans)
    records = sum(n for _, _, n in spans)
    # The log's timestamps have millisecond resolution: never divide by less than a tenth of a second.
    seconds = max(end - start, 0.1)
    return {"records": records, "seconds": round(seconds, 3), "replicas": len(spans),
            "restore_rps": round(records / seconds, 1)}


def changelog_record(i: int, keys: int) -> tuple[bytes, bytes]:
    """The ``i``-th record of a scratch changelog: an upsert of one of ``keys`` keys with a small JSON row."""
    return f"key-{i % keys}".encode(), b'{"count": %d, "sum": %d.5, "last": "2026-01-01T00:00:00Z"}' % (i, i)


def produce_changelog(bootstrap: str, topic: str, records: int, keys: int, partitions: int = PARTITIONS,
                      progress: Callable[[int], None] | None = None, timeout_s: float = 300.0) -> float:
    """Produce ``records`` changelog records to ``topic`` (partitioned like the pipeline); returns seconds."""
    from confluent_kafka import Producer

    from freshroute.keys import partition_for

    producer = Producer(kafka_client_config(bootstrap, **{"linger.ms": 20, "batch.size": 1_000_000,
                                                          "queue.buffering.max.messages": 2_000_000}))
    start = time.monotonic()
    for i in range(records):
        key, value = changelog_record(i, keys)
        producer.produce(topic, key=key, value=value, partition=partition_for(key, partitions))
        if i % 10_000 == 0:
            producer.poll(0)
            if progress and i and i % 50_000 == 0:
                progress(i)
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"producing {records} records to {topic} took over {timeout_s:.0f}s")
    left = producer.flush(max(1.0, timeout_s - (time.monotonic() - start)))
    if left:
        raise RuntimeError(f"{left} records to {topic} were not delivered")
    return time.monotonic() - start


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system, every thread) used so far by this process or by ``pid``.

    On a shared machine wall-clock rates swing with whatever else runs; CPU time per record is
    what the code itself costs, so the benches report both.
    """
    if pid is None:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(f"process {pid} is gone")
    return cpu_seconds(fields)


def start_node(bootstrap: str, redis_url: str, namespace: str, node_id: str, data_dir: Path,
               log_path: Path, timeout_s: float = 60.0, *, env: dict[str, str] | None = None,
               prefix: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str, str]:
    """A store node process of its own in ``namespace``; returns it, its gRPC address and its read port's. ``env`` adds
    to its environment (and may change the node expiry and drain time below); ``prefix`` runs it through a command
    (which must exec it, so that the pid is the node's)."""
    env = {**os.environ,
           # The node of the previous round (same id) is declared dead at once, and a node
           # stopped after its restore has no readers to drain.
           "FRESHROUTE_NODE_EXPIRY_MS": "300", "FRESHROUTE_DRAIN_TIMEOUT_MS": "0",
           **(env or {}), "FRESHROUTE_NODE_ID": node_id, "FRESHROUTE_BOOTSTRAP_SERVERS": bootstrap,
           "FRESHROUTE_REDIS_URL": redis_url, "FRESHROUTE_NAMESPACE": namespace, "FRESHROUTE_DATA_DIR": str(data_dir),
           "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        # A session of its own, like a stack component: the kernel's autogroup scheduling then
        # gives it a share of the CPU of its own, apart from the process measuring it.
        node = subprocess.Popen([*prefix, sys.executable, "-m", "store_node"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    # The node prints one line once it listens; a node that fails to start closes stdout.
    deadline = time.monotonic() + timeout_s
    line = b""
    while time.monotonic() < deadline and not line:
        line = node.stdout.readline()
        if not line and node.poll() is not None:
            break
    if not line.strip():
        stop_node(node)
        tail = log_path.read_bytes()[-500:].decode("utf-8", "replace") if log_path.exists() else ""
        raise RuntimeError(f"store node {node_id} did not start: {tail}")
    # "store-node ID listening on HOST:PORT, read port HOST:PORT"
    address, read_address = line.decode().split(" listening on ")[1].strip().split(", read port ")
    return node, address, read_address


def start_router(redis_url: str, namespace: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    """A router process of its own in ``namespace`` on free loopback ports; returns it and its REST URL (it logs
    ``router serving`` once it listens)."""
    from tools.local.services import free_port

    rest_port = free_port()
    env = {**os.environ, "FRESHROUTE_REDIS_URL": redis_url, "FRESHROUTE_NAMESPACE": namespace,
           "FRESHROUTE_HOST": "127.0.0.1", "FRESHROUTE_REST_PORT": str(rest_port), "FRESHROUTE_GRPC_PORT": str(free_port()),
           "FRESHROUTE_NODE_EXPIRY_MS": "300", "PYTHONPATH": str(REPO)}
    with open(log_path, "wb") as log:
        router = subprocess.Popen([sys.executable, "-m", "router"], cwd=REPO, env=env, stdout=log, stderr=log)
    return router, f"http://127.0.0.1:{rest_port}"


def stop_node(node: subprocess.Popen) -> None:
    """Stop a node this process started, by its pid (a draining node takes a few seconds)."""
    stop_process(node, grace_s=30)


def wait_restored(node: subprocess.Popen, address: str, partitions: int, timeout_s: float,
                  progress: Callable[[int, int, float], None] | None = None) -> dict[str, float]:
    """Block until the node hosts ``partitions`` replicas, every one caught up.

    Returns the seconds and node CPU seconds from every replica assigned to every replica caught
    up (``seconds``, ``cpu_s``), the seconds from listening (``from_listening_s``), and the
    records applied. ``progress(replicas, records applied, seconds)`` is called every 2 s.
    """
    import grpc

    from proto import store_pb2, store_pb2_grpc

    listening = time.monotonic()
    assigned = None
    cpu_assigned = cpu_s(node.pid)
    applied = 0
    said = listening
    with grpc.insecure_channel(address) as channel:
        stub = store_pb2_grpc.StoreNodeStub(channel)
        while True:
            now = time.monotonic()
            if now - listening > timeout_s:
                raise TimeoutError(f"the store node did not restore {partitions} partitions within {timeout_s:.0f}s")
            if node.poll() is not None:
                raise RuntimeError(f"the store node exited with {node.returncode} while restoring")
            try:
                st = stub.Status(store_pb2.StatusRequest(), timeout=5)
            except grpc.RpcError:
                time.sleep(0.05)
                continue
            applied = sum(c.records_applied for c in st.counters)
            if assigned is None and len(st.replicas) == partitions:
                assigned = time.monotonic()
                cpu_assigned = cpu_s(node.pid)
            if len(st.replicas) == partitions and all(r.state != store_pb2.RESTORING and r.HasField("lag_offsets") and r.lag_offsets == 0
                                                      for r in st.replicas):
                break
            if progress and now - said >= 2:
                said = now
                progress(len(st.replicas), applied, now - listening)
            # Every Status call costs the node CPU it would otherwise spend restoring: ask at most
            # 20 times a second (the end is known to within 50 ms).
            time.sleep(0.05)
    done = time.monotonic()
    return {"seconds": done - (assigned or listening), "cpu_s": cpu_s(node.pid) - cpu_assigned,
            "from_listening_s": done - listening, "records_applied": applied}


class ScratchChangelog:
    """A changelog topic and a table spec of their own, on a given broker and Redis, removed by :meth:`remove`.

    The table is registered in a Redis namespace of its own (``{prefix}restore-bench-{tag}``), so
    that the stack's nodes, assignor and router never see it; only a node started in that
    namespace (:meth:`restore`) hosts its replicas.
    """

    def __init__(self, bootstrap: str, redis_url: str, work: Path, prefix: str = "",
                 partitions: int = PARTITIONS) -> None:
        from freshroute.metadata.tables import TableSpec

        tag = uuid.uuid4().hex[:8]
        self.bootstrap = bootstrap
        self.redis_url = redis_url
        self.work = work
        self.namespace = f"{prefix}restore-bench-{tag}"
        self.spec = TableSpec("restore_bench", f"{prefix}restore-bench-{tag}-changelog", partitions, "key",
                              standby_replicas=0)
        self.records = 0
        self._topic_created = False
        self._rounds = 0

    @classmethod
    def of_topic(cls, bootstrap: str, redis_url: str, work: Path, topic: str, partitions: int, records: int,
                 prefix: str = "") -> "ScratchChangelog":
        """An existing topic of ``records`` records, registered in a namespace of its own; :meth:`remove` leaves the
        topic alone."""
        from dataclasses import replace

        from freshroute.metadata.store import MetadataStore

        scratch = cls(bootstrap, redis_url, work, prefix, partitions)
        scratch.spec = replace(scratch.spec, topic=topic)
        scratch.records = records
        MetadataStore.from_url(redis_url, scratch.namespace).register_tables([scratch.spec])
        return scratch

    def create(self, records: int, keys: int, progress: Callable[[int], None] | None = None) -> float:
        """Create the topic, produce ``records`` records over ``keys`` keys, register the table; returns seconds."""
        from confluent_kafka.admin import AdminClient, NewTopic

        from freshroute.metadata.store import MetadataStore

        admin = AdminClient(kafka_client_config(self.bootstrap))
        admin.create_topics([NewTopic(self.spec.topic, self.spec.partitions, 1)])[self.spec.topic].result(30)
        self._topic_created = True
        took = produce_changelog(self.bootstrap, self.spec.topic, records, keys, self.spec.partitions, progress)
        self.records = records
        MetadataStore.from_url(self.redis_url, self.namespace).register_tables([self.spec])
        return took

    def raw_consume(self, read_records: bool = False) -> dict[str, Any]:
        """A plain confluent-kafka consumer reading every partition from 0 to its end (freshroute.changelog_reader),
        counting the records or, with ``read_records``, taking each one's key and value into Python as well."""
        from freshroute.changelog_reader import consume_to_end

        cpu0 = cpu_s()
        records, seconds, _ends = consume_to_end(self.bootstrap, self.spec.topic,
                                                 (lambda m: (m.key(), m.value())) if read_records else None)
        if records != self.records:
            raise RuntimeError(f"raw consume read {records} of {self.records} records")
        cpu = cpu_s() - cpu0
        return {"records": records, "seconds": round(seconds, 3), "cpu_s": round(cpu, 3),
                "records_per_cpu_s": round(records / cpu) if cpu else None,
                "raw_consume_rps": round(records / seconds, 1) if seconds > 0 else None}

    def restore(self, timeout_s: float = 180.0,
                progress: Callable[[int, int, float], None] | None = None) -> dict[str, Any]:
        """A new store node restores the whole changelog into an empty directory; its rate, from its log.

        The node is stopped and its directory deleted before this returns, whatever happens.
        """
        self._rounds += 1
        data = self.work / f"restore-node-{self._rounds}"
        log_path = self.work / f"restore-node-{self._rounds}.log"
        node, address, _ = start_node(self.bootstrap, self.redis_url, self.namespace, "restore-bench", data, log_path)
        try:
            waited = wait_restored(node, address, self.spec.partitions, timeout_s, progress)
        finally:
            stop_node(node)
            shutil.rmtree(data, ignore_errors=True)
        from_log = restore_rate_from_log(log_path.read_text("utf-8", "replace"), self.spec.name)
        out: dict[str, Any] = {"records_applied": waited["records_applied"],
                               "from_listening_s": round(waited["from_listening_s"], 3),
                               "status_window_s": round(waited["seconds"], 3),
                               "records_per_cpu_s": round(self.records / waited["cpu_s"]) if waited["cpu_s"] else None}
        # A replica counts as caught up within a few offsets of its end (caught_up_threshold):
        # the log accounts for nearly every record, and for every partition.
        if from_log is None or from_log["replicas"] != self.spec.partitions:
            raise RuntimeError(f"the node's log shows {from_log and from_log['replicas']} of {self.spec.partitions} "
                               f"replicas caught up (see {log_path})")
        out.update(log=from_log, restore_rps=from_log["restore_rps"])
        return out

    def remove(self) -> None:
        """Delete the topic and every key of the namespace (each step on its own: one failing skips none)."""
        problems = []
        if self._topic_created:
            try:
                from confluent_kafka.admin import AdminClient

                admin = AdminClient(kafka_client_config(self.bootstrap))  # held: the future needs it alive
                admin.delete_topics([self.spec.topic])[self.spec.topic].result(30)
                self._topic_created = False
            except Exception as e:  # noqa: BLE001 - still remove the namespace
                problems.append(f"topic {self.spec.topic}: {e}")
        try:
            import redis

            client = redis.Redis.from_url(self.redis_url, socket_timeout=5)
            # Every key the node and the registration wrote lives under "{namespace}:".
            keys = list(client.scan_iter(match=f"{self.namespace}:*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
        except Exception as e:  # noqa: BLE001
            problems.append(f"namespace {self.namespace}: {e}")
        if problems:
            raise RuntimeError("could not remove the scratch changelog: " + "; ".join(problems))

"""Exactly-once effect: the pipeline is killed -9 mid-stream and restarted; the changelog equals a recomputation.

Real broker, real Redis, real Spark, the pipeline as its own process (``python -m pipeline``).
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from freshroute.keys import deserialize_key, partition_for
from freshroute.metadata import MetadataStore
from pipeline.topics import describe_topic, ensure_topic

pytestmark = pytest.mark.integration

SENSORS = 50
AREAS = ("wheel", "engine", "cabin", "brake")
CHANGELOG_PARTITIONS = 8
REPO = Path(__file__).resolve().parents[2]


def produce_readings(bootstrap: str, topic: str, n: int, rng: random.Random) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    errors: list = []
    for _ in range(n):
        i = rng.randrange(SENSORS)
        event = {"sensor": f"sensor-{i}", "area": AREAS[i % len(AREAS)], "reading": round(rng.uniform(-20, 120), 3)}
        p.produce(topic, key=event["sensor"].encode(), value=orjson.dumps(event),
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(30) == 0 and not errors


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list:
    """Every record of every partition up to its end, as (partition, offset, timestamp_ms, key, value)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    info = describe_topic(admin, topic)
    if info is None:
        return []
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-reader", "enable.partition.eof": True,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.queue.backoff.ms": 0})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in info.partitions])
        pending = set(info.partitions)
        out = []
        deadline = time.monotonic() + timeout_s
        while pending:
            assert time.monotonic() < deadline, f"reading {topic} did not reach the end of {sorted(pending)}"
            for m in c.consume(num_messages=10_000, timeout=0.2):
                if m.error():
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    pending.discard(m.partition())
                    continue
                out.append((m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value()))
        return out
    finally:
        c.close()


def materialize(records: list) -> dict[str, dict]:
    """Latest value per key in offset order; a tombstone deletes the key."""
    table: dict[str, dict] = {}
    for _p, _o, _ts, key, value in sorted(records, key=lambda r: (r[0], r[1])):
        k = deserialize_key(key)
        if value is None:
            table.pop(k, None)
        else:
            table[k] = orjson.loads(value)
    return table


def recompute(inputs: list) -> tuple[dict[str, dict], dict[str, dict]]:
    """sensor_stats and area_counts, computed in plain Python from the input records."""
    readings: dict[str, list] = defaultdict(list)
    areas: dict[str, int] = defaultdict(int)
    for partition, offset, ts, _key, value in inputs:
        e = orjson.loads(value)
        readings[e["sensor"]].append(((ts, partition, offset), e["reading"]))
        areas[e["area"]] += 1
    stats = {}
    for sensor, rs in readings.items():
        values = [v for _, v in rs]
        stats[sensor] = {"count": len(values), "sum": math.fsum(values), "avg": math.fsum(values) / len(values),
                         "min": min(values), "max": max(values), "last": max(rs)[1]}
    return stats, {a: {"count": n} for a, n in areas.items()}


def mismatches(got: dict[str, dict], want: dict[str, dict]) -> list[str]:
    out = []
    for key in sorted(set(got) | set(want)):
        g, w = got.get(key), want.get(key)
        if g is None or w is None or set(g) != set(w):
            out.append(f"{key}: got {g} want {w}")
            continue
        for col, wv in w.items():
            gv = g[col]
            same = gv == wv if isinstance(wv, int) or col == "last" else math.isclose(gv, wv, rel_tol=1e-9, abs_tol=1e-9)
            if not same:
                out.append(f"{key}.{col}: got {gv!r} want {wv!r}")
    return out


class PipelineProcess:
    """``python -m pipeline`` in a session of its own, so that kill -9 takes its JVM and Python workers too."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeline"], env=env, cwd=REPO, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def kill9(self) -> None:
        if self.group_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.wait_group_gone(30)

    def wait_group_gone(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not self.group_alive(), "processes of the pipeline's session outlived it"

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.is_dir() else 0


def test_kill_9_mid_stream_then_restart_gives_the_recomputed_table(broker, redis_url, namespace, tmp_path):
    rng = random.Random(20261122)
    input_topic = f"{namespace}readings"
    stats_topic = f"{namespace}sensor_stats-changelog"
    counts_topic = f"{namespace}area_counts-changelog"
    checkpoints = tmp_path / "checkpoints"
    ensure_topic(AdminClient({"bootstrap.servers": broker}), input_topic, 4)
    produce_readings(broker, input_topic, 3000, rng)

    env = {**os.environ,
           "FRESHROUTE_BOOTSTRAP_SERVERS": broker, "FRESHROUTE_REDIS_URL": redis_url, "FRESHROUTE_NAMESPACE": namespace,
           "FRESHROUTE_TOPIC_PREFIX": namespace, "FRESHROUTE_CHECKPOINT_DIR": str(checkpoints),
           "FRESHROUTE_CHANGELOG_PARTITIONS": str(CHANGELOG_PARTITIONS), "FRESHROUTE_TRIGGER_MS": "500",
           # Several batches for the backlog, so that the kill lands mid-stream.
           "FRESHROUTE_MAX_RECORDS_PER_BATCH": "1500"}
    started: list[PipelineProcess] = []
    try:
        # 1. First run: wait until batches landed in the changelog, then kill -9 the whole process tree.
        first = PipelineProcess(env, tmp_path / "pipeline-1.log")
        started.append(first)
        deadline = time.monotonic() + 240
        while committed_batches(checkpoints / "sensor_stats") < 1:
            assert first.alive(), f"pipeline exited early:\n{first.tail()}"
            assert time.monotonic() < deadline, f"no batch committed within 240 s:\n{first.tail()}"
            time.sleep(0.2)
        first.kill9()
        partial = materialize(read_topic(broker, stats_topic))
        assert partial, "the first run wrote nothing to the changelog"
        assert sum(v["count"] for v in partial.values()) < 3000, "killed too late: the backlog was already done"

        # 2. More input while the pipeline is down, then restart from the checkpoint.
        produce_readings(broker, input_topic, 1500, rng)
        want_stats, want_counts = recompute(read_topic(broker, input_topic))
        assert sum(v["count"] for v in want_stats.values()) == 4500 and len(want_stats) == SENSORS

        second = PipelineProcess(env, tmp_path / "pipeline-2.log")
        started.append(second)
        deadline = time.monotonic() + 300
        while True:
            assert second.alive(), f"restarted pipeline exited:\n{second.tail()}"
            got_stats = materialize(read_topic(broker, stats_topic))
            got_counts = materialize(read_topic(broker, counts_topic))
            if not mismatches(got_stats, want_stats) and not mismatches(got_counts, want_counts):
                break
            assert time.monotonic() < deadline, (
                f"changelog never matched the recomputation; first differences: "
                f"{(mismatches(got_stats, want_stats) + mismatches(got_counts, want_counts))[:5]}\n{second.tail()}")
            time.sleep(2)

        # 3. A graceful stop on SIGTERM.
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(90) == 0, second.tail()
        second.wait_group_gone(30)
    finally:
        for p in started:
            if p.group_alive():
                os.killpg(p.proc.pid, signal.SIGKILL)
                p.proc.wait(30)

    # Every record sits in the partition the shared module computes for its key.
    records = read_topic(broker, stats_topic) + read_topic(broker, counts_topic)
    assert records
    for partition, _o, _ts, key, _v in records:
        assert partition == partition_for(key, CHANGELOG_PARTITIONS), key
    assert {p for p, *_ in read_topic(broker, stats_topic)} == set(range(CHANGELOG_PARTITIONS))

    # Both runs published the table specs for store nodes and routers.
    specs = MetadataStore.from_url(redis_url, namespace).tables()
    assert specs["sensor_stats"].topic == stats_topic and specs["sensor_stats"].partitions == CHANGELOG_PARTITIONS
    assert specs["sensor_stats"].key_column == "sensor"
    assert specs["sensor_stats"].value_schema == {"count": "bigint", "sum": "double", "avg": "double",
                                                  "min": "double", "max": "double", "last": "double"}
    assert specs["area_counts"].value_schema == {"count": "bigint"}

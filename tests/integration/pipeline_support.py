"""Helpers of the pipeline's integration tests: run the pipeline as a process, read changelogs back."""

from __future__ import annotations

import math
import random
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from freshroute import input_position
from freshroute.keys import deserialize_key
from pipeline.topics import describe_topic

from .stack_fixture import log_tail

REPO = Path(__file__).resolve().parents[2]
SENSORS = 50
AREAS = ("wheel", "engine", "cabin", "brake")


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0, headers: bool = False) -> list:
    """Every record of every partition up to its end, as (partition, offset, timestamp_ms, key, value), and its
    headers (a list of pairs) after them when asked for."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    info = describe_topic(admin, topic)
    if info is None:
        return []
    # The broker holds a fetch at a partition's end fetch.wait.max.ms (500 ms by default) before it answers, and the
    # end is known only from that answer: 10 ms, as freshroute.changelog_reader reads, took a read from 0.6 s to 0.07.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-reader", "enable.partition.eof": True,
                  "fetch.message.max.bytes": 4_000_000, "fetch.wait.max.ms": 10,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.queue.backoff.ms": 0})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in info.partitions])
        pending = set(info.partitions)
        out = []
        deadline = time.monotonic() + timeout_s
        while pending:
            assert time.monotonic() < deadline, f"reading {topic} did not reach the end of {sorted(pending)}"
            # consume() waits all of its timeout when fewer records than asked are left: a short one.
            for m in c.consume(num_messages=10_000, timeout=0.02):
                if m.error():
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    pending.discard(m.partition())
                    continue
                row = (m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value())
                out.append((*row, m.headers() or []) if headers else row)
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

    def check(self) -> None:
        """Fail with the log's last lines if the pipeline has exited."""
        if not self.alive():
            raise AssertionError(f"the pipeline exited with {self.proc.returncode}:\n{self.tail(25)}")

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

    def wait_exit(self, timeout_s: float) -> int:
        """The exit code once the process and its session are gone; kill -9 and fail on overrun."""
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise AssertionError(f"pipeline still running after {timeout_s:.0f}s:\n{self.tail()}") from None
        self.wait_group_gone(30)
        return code

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


class Processes:
    """Component processes a test started with `freshroute <command>`, each with its own log (stopped by pid)."""

    def __init__(self, tmp_path, env) -> None:
        self.tmp_path, self.env, self.procs = tmp_path, env, {}

    def start(self, name: str, *args: str) -> None:
        log = open(self.tmp_path / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "tools.cli", *args], env=self.env, cwd=REPO,
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    def check(self) -> None:
        """Fail with its log's last lines if one of the processes has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{log_tail(str(self.tmp_path / f'{name}.log'))}")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def applied_in_order(records: list) -> tuple[dict[bytes, dict], int, list[str]]:
    """What a replica applying ``records`` by their input positions holds (freshroute.input_position, as the store
    node's applier does), how many rows it skips, and every time a key's count would go back."""
    held: dict[bytes, tuple[bytes | None, dict]] = {}
    skipped, backwards = 0, []
    for _p, offset, _ts, key, value, headers in sorted(records, key=lambda r: (r[0], r[1])):
        raw = input_position.of_record(headers)
        assert input_position.decode(raw) is not None, f"record at offset {offset} has no input position"
        before = held.get(key)
        applied, position = input_position.applies(before and before[0], raw, value is None)
        if not applied:
            skipped += 1
            continue
        row = orjson.loads(value)
        if before is not None and row["count"] < before[1]["count"]:
            backwards.append(f"{key!r}: count {before[1]['count']} then {row['count']} at offset {offset}")
        held[key] = (position, row)
    return {k: row for k, (_, row) in held.items()}, skipped, backwards


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

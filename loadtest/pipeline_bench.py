"""Measure the pipeline: throughput on a backlog, and event → changelog latency at a steady input rate.

``python -m loadtest.pipeline_bench`` starts its own loopback broker and Redis unless given
``--bootstrap`` and ``--redis-url``, runs the demo tables in this process, and prints one
JSON object. :func:`measure_throughput` and :func:`measure_latency` can be called by a
benchmark directly.

Latency is matched through the ``count`` column of ``sensor_stats``: a changelog record
``sensor → count=c`` proves that the sensor's first ``c`` readings (one partition, so in
produce order) were processed; each of those not seen before gets latency = arrival of
that record − its own produce time, both on this process's clock.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections import defaultdict, deque
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from freshroute.proc import children_by_parent, cpu_seconds, process_tree, stat_fields
from freshroute.settings import load
from pipeline.settings import PipelineSettings

log = logging.getLogger("loadtest.pipeline_bench")

AREAS = ("wheel", "engine", "cabin", "brake")


@dataclass(frozen=True)
class Throughput:
    events: int
    batches: int
    max_records_per_batch: int
    processing_s: float  # sum of batch durations, including the cold first batch
    events_per_s: float  # over processing_s
    steady_events_per_s: float  # batches after the first (warm JVM, Python workers up)
    batch_ms_p50: float


@dataclass(frozen=True)
class Latency:
    rate_per_s: float
    trigger_ms: int
    events: int
    matched: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    tables: tuple[str, ...] = ()
    batches: int = 0  # micro-batches with input during the measured traffic, all tables
    batch_ms_p50: float = 0.0
    batch_ms_p90: float = 0.0
    phases_ms_p50: dict[str, float] | None = None  # Spark's durationMs per phase, median over those batches
    cpu_busy_pct: float = 0.0  # this process and its children (JVM, Python workers), % of one core
    cpu_ms_per_batch: float = 0.0  # their CPU during the traffic per micro-batch with input (less noisy than times)
    cpu_idle_pct: float = 0.0  # the same with no input, after the traffic


def _event(rng: random.Random, sensors: int, name: str = "sensor") -> dict[str, Any]:
    i = rng.randrange(sensors)
    return {"sensor": f"{name}-{i}", "area": AREAS[i % len(AREAS)], "reading": round(rng.gauss(50, 10), 3)}


def _settings(bootstrap: str, redis_url: str, work: Path, prefix: str | None = None, **overrides: Any
              ) -> PipelineSettings:
    """A micro-batch pipeline of its own (topics, namespace and checkpoint under ``prefix``, a new one if None): the
    figures here are per micro-batch (``freshroute bench`` measures the Real-time pipeline)."""
    prefix = prefix or f"m{uuid.uuid4().hex[:8]}"
    return load(PipelineSettings, bootstrap_servers=bootstrap, redis_url=redis_url, namespace=prefix,
                topic_prefix=prefix, checkpoint_dir=str(work / prefix), pipeline_mode="microbatch", **overrides)


def _demo_stats_only(settings: PipelineSettings) -> Any:
    """The demo file's ``sensor_stats`` alone: one query, as a single-table deployment runs it."""
    from pipeline.tables import TablesDefinition
    from pipeline.tables_file import load_tables

    d = load_tables(settings.tables_file)
    return TablesDefinition(d.path, dict(d.sources), {"sensor_stats": replace(d.tables["sensor_stats"], query=None)})


class CpuMeter:
    """CPU time of this process and its children, without the services it started (broker, Redis).

    Read from ``/proc`` (Linux): the JVM is a child of this process and Spark's Python
    workers are children of the JVM.
    """

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self._seen: dict[int, float] = {}

    def _tree(self) -> list[int]:
        return process_tree(os.getpid(), children_by_parent(), self.exclude)

    def total_s(self) -> float:
        """CPU seconds used so far by the process tree; a child that exited keeps its last figure."""
        for pid in self._tree():
            stat = stat_fields(pid)
            if stat is not None:
                self._seen[pid] = cpu_seconds(stat)
        return sum(self._seen.values())

    def percent(self, seconds: float) -> float:
        """Percent of one core used over the next ``seconds``."""
        before, started = self.total_s(), time.monotonic()
        time.sleep(seconds)
        return round(100.0 * (self.total_s() - before) / (time.monotonic() - started), 1)


def batch_stats(progress: list[dict[str, Any]]) -> tuple[float, float, dict[str, float]]:
    """p50 and p90 batch duration, and the median of each ``durationMs`` phase, of batches with input."""
    busy = [p for p in progress if p.get("numInputRows", 0) > 0]
    durations = sorted(float(p["batchDuration"]) for p in busy)
    phases: dict[str, list[float]] = defaultdict(list)
    for p in busy:
        for name, ms in (p.get("durationMs") or {}).items():
            phases[name].append(float(ms))
    return (_percentile(durations, 0.5), _percentile(durations, 0.9),
            {name: statistics.median(v) for name, v in sorted(phases.items())})


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def measure_throughput(bootstrap: str, redis_url: str, work: Path, events: int = 200_000, sensors: int = 1000,
                       max_records_per_batch: int = 50_000, prefix: str | None = None) -> Throughput:
    """Produce a backlog, then process it with an available-now run and time the batches. With ``prefix`` its topics
    and checkpoint are kept under that name for a later run (:func:`measure_latency` with the same prefix)."""
    from confluent_kafka import Producer

    from pipeline.job import Pipeline
    from pipeline.topics import admin_client, ensure_topic

    settings = _settings(bootstrap, redis_url, work, prefix, available_now=True,
                         max_records_per_batch=max_records_per_batch)
    topic = settings.input_topic("readings")
    ensure_topic(admin_client(settings.kafka()), topic, settings.input_partitions)
    rng = random.Random(1)
    producer = Producer(settings.kafka(**{"linger.ms": 20, "enable.idempotence": True}))
    for n in range(events):
        e = _event(rng, sensors)
        while True:
            try:
                producer.produce(topic, key=e["sensor"].encode(), value=orjson.dumps(e))
                break
            except BufferError:
                producer.poll(0.05)
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "backlog not fully produced"
    log.info("backlog of %d events in %s; processing it", events, topic)

    pipeline = Pipeline(settings, _demo_stats_only(settings))
    try:
        pipeline.start()
        pipeline.wait(threading.Event())
        query = pipeline.queries["sensor_stats"].query
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        pipeline.stop()
    rows = sum(p["numInputRows"] for p in progress)
    durations = [p["batchDuration"] for p in progress]
    busy = sum(durations) / 1000.0
    steady = progress[1:]
    steady_s = sum(p["batchDuration"] for p in steady) / 1000.0
    return Throughput(
        events=rows, batches=len(progress), max_records_per_batch=max_records_per_batch, processing_s=round(busy, 2),
        events_per_s=round(rows / busy, 1) if busy else 0.0,
        steady_events_per_s=round(sum(p["numInputRows"] for p in steady) / steady_s, 1) if steady_s else 0.0,
        batch_ms_p50=statistics.median(durations) if durations else 0.0)


def measure_latency(bootstrap: str, redis_url: str, work: Path, rate_per_s: float = 200.0, duration_s: float = 60.0,
                    sensors: int = 100, trigger_ms: int = 500, warmup_s: float = 20.0,
                    warmup_timeout_s: float = 300.0, all_tables: bool = False, idle_s: float = 15.0,
                    exclude_pids: frozenset[int] = frozenset(), prefix: str | None = None) -> Latency:
    """Steady input at ``rate_per_s`` into a running pipeline; latency of every event to its changelog record.

    ``all_tables`` runs every table of the demo file (as the local stack does) rather than
    ``sensor_stats`` alone; latency is measured on ``sensor_stats`` either way. With ``prefix`` it resumes the
    pipeline a :func:`measure_throughput` run of that prefix left, its state as large as that run's sensors; its own
    events are of sensors of other names, so that each one's count starts from zero.
    """
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    from pipeline.job import Pipeline
    from freshroute.topics import describe_topic
    from pipeline.topics import admin_client, ensure_topic

    settings = _settings(bootstrap, redis_url, work, prefix, trigger_ms=trigger_ms)
    name = "sensor" if prefix is None else "late-sensor"
    topic = settings.input_topic("readings")
    changelog = settings.changelog_topic("sensor_stats")
    admin = admin_client(settings.kafka())
    ensure_topic(admin, topic, settings.input_partitions)
    producer = Producer(settings.kafka(**{"linger.ms": 1, "enable.idempotence": True}))
    rng = random.Random(2)
    sent: dict[str, deque[float]] = defaultdict(deque)  # sensor → produce times not yet seen in the changelog
    seen: dict[str, int] = defaultdict(int)  # sensor → count already accounted for
    produced: dict[str, int] = defaultdict(int)
    latencies: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()

    def send(n: int, rate: float, measured: bool) -> None:
        start = time.monotonic()
        for i in range(n):
            if stop.is_set():
                return
            e = _event(rng, sensors, name)
            with lock:
                produced[e["sensor"]] += 1
                sent[e["sensor"]].append(time.time() if measured else float("nan"))
            producer.produce(topic, key=e["sensor"].encode(), value=orjson.dumps(e))
            producer.poll(0)
            delay = start + (i + 1) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        producer.flush(30)

    def tail() -> None:
        deadline = time.monotonic() + 60
        info = None
        while info is None and not stop.is_set() and time.monotonic() < deadline:
            info = describe_topic(admin, changelog)
            if info is None:
                time.sleep(0.2)
        if info is None:
            return
        consumer = Consumer(settings.kafka(**{"group.id": "measure", "enable.auto.commit": False,
                                              "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 0}))
        # From where the changelog ends now: a resumed pipeline's holds the state of every earlier sensor.
        consumer.assign([TopicPartition(changelog, p, consumer.get_watermark_offsets(
            TopicPartition(changelog, p), timeout=10)[1]) for p in info.partitions])
        try:
            while not stop.is_set():
                for m in consumer.consume(num_messages=1000, timeout=0.1):
                    if m.error() is not None:
                        if m.error().code() != KafkaError._PARTITION_EOF:
                            log.warning("changelog consumer: %s", m.error())
                        continue
                    arrived = time.time()
                    sensor = m.key().decode()
                    count = orjson.loads(m.value())["count"]
                    with lock:
                        queue = sent[sensor]
                        while seen[sensor] < count and queue:
                            produced_at = queue.popleft()
                            seen[sensor] += 1
                            if produced_at == produced_at:  # not NaN: a measured event
                                latencies.append((arrived - produced_at) * 1000.0)
        finally:
            consumer.close()

    pipeline = Pipeline(settings, None if all_tables else _demo_stats_only(settings))
    tailer = threading.Thread(target=tail, name="changelog-tail", daemon=True)
    cpu = CpuMeter(set(exclude_pids))
    progress: list[dict[str, Any]] = []
    cpu_busy = cpu_idle = cpu_used = 0.0
    measured_from = measured_until = 0.0
    try:
        pipeline.start()
        tailer.start()
        # Warm-up: the first batches of a new session are slow (JVM, Python workers, state
        # store); wait for a first event to make it through, then run unmeasured traffic
        # until batch times settle.
        send(sensors, rate_per_s, measured=False)
        deadline = time.monotonic() + warmup_timeout_s
        while time.monotonic() < deadline:
            with lock:
                if sum(seen.values()) >= sum(produced.values()):
                    break
            time.sleep(0.2)
        else:
            raise TimeoutError(f"the pipeline did not process the warm-up events within {warmup_timeout_s:.0f}s")
        send(int(rate_per_s * warmup_s), rate_per_s, measured=False)
        n = int(rate_per_s * duration_s)
        log.info("warm; producing %d events at %.0f/s", n, rate_per_s)
        measured_from = time.time()
        cpu_before, cpu_started = cpu.total_s(), time.monotonic()
        send(n, rate_per_s, measured=True)
        cpu_used = cpu.total_s() - cpu_before
        cpu_busy = round(100.0 * cpu_used / (time.monotonic() - cpu_started), 1)
        measured_until = time.time()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with lock:
                if sum(seen.values()) >= sum(produced.values()):
                    break
            time.sleep(0.2)
        for q in pipeline.queries.values():
            assert q.query is not None
            # recentProgress keeps the last 100 batches (spark.sql.streaming.numRecentProgressUpdates).
            progress += [p for p in q.query.recentProgress if p["timestamp"] >= _iso(measured_from)]
        if idle_s > 0:
            time.sleep(2.0)  # the last batches finish
            cpu_idle = cpu.percent(idle_s)
    finally:
        stop.set()
        tailer.join(timeout=10)
        pipeline.stop()
    values = sorted(latencies)
    batch_p50, batch_p90, phases = batch_stats(progress)
    # Batches that started during the traffic, whose CPU cpu_used counts (but for the edges).
    during = sum(1 for p in progress if p["numInputRows"] > 0 and p["timestamp"] < _iso(measured_until))
    return Latency(rate_per_s=rate_per_s, trigger_ms=trigger_ms, events=int(rate_per_s * duration_s), matched=len(values),
                   p50_ms=round(_percentile(values, 0.50), 1), p90_ms=round(_percentile(values, 0.90), 1),
                   p99_ms=round(_percentile(values, 0.99), 1), max_ms=round(values[-1], 1) if values else float("nan"),
                   tables=tuple(pipeline.runs), batches=sum(1 for p in progress if p["numInputRows"] > 0),
                   batch_ms_p50=batch_p50, batch_ms_p90=batch_p90, phases_ms_p50=phases, cpu_busy_pct=cpu_busy,
                   cpu_ms_per_batch=round(1000.0 * cpu_used / max(1, during), 1), cpu_idle_pct=cpu_idle)


def _iso(epoch_s: float) -> str:
    """A time as Spark writes a progress report's ``timestamp`` (UTC, milliseconds), comparable as text."""
    t = time.gmtime(epoch_s)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(epoch_s * 1000) % 1000:03d}Z"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--redis-url", help="use this Redis instead of starting one")
    p.add_argument("--only", choices=("throughput", "latency"))
    p.add_argument("--events", type=int, default=200_000, help="backlog size for throughput")
    p.add_argument("--max-records-per-batch", type=int, default=50_000)
    p.add_argument("--rate", type=float, default=200.0, help="events per second for latency")
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--trigger-ms", type=int, default=500)
    p.add_argument("--all-tables", action="store_true",
                   help="latency: run every demo table (as the local stack does), not sensor_stats alone")
    p.add_argument("--idle-s", type=float, default=15.0, help="latency: CPU measured this long with no input after it")
    args = p.parse_args(argv)

    from pipeline.logs import configure_logging

    configure_logging()
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="freshroute-measure-")))
        bootstrap, redis_url = args.bootstrap, args.redis_url
        services: set[int] = set()
        if bootstrap is None or redis_url is None:
            from tools.local.services import start_broker, start_redis

            if bootstrap is None:
                svc = start_broker(work / "services")
                stack.callback(svc.stop)
                bootstrap = svc.address
                services.add(svc.proc.pid)
            if redis_url is None:
                svc = start_redis(work / "services")
                stack.callback(svc.stop)
                redis_url = svc.address
                services.add(svc.proc.pid)
        result: dict[str, Any] = {}
        if args.only in (None, "throughput"):
            result["throughput"] = asdict(measure_throughput(bootstrap, redis_url, work, args.events,
                                                             max_records_per_batch=args.max_records_per_batch))
        if args.only in (None, "latency"):
            result["latency"] = asdict(measure_latency(bootstrap, redis_url, work, args.rate, args.duration_s,
                                                       trigger_ms=args.trigger_ms, all_tables=args.all_tables,
                                                       idle_s=args.idle_s, exclude_pids=frozenset(services)))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tables of ten million keys: lookup latency and throughput, restore, memory and disk as a table grows.

    .venv/bin/python -m loadtest.bigtable --sizes 10k 1m 10m        (against the stack of `./dev up`; --home DIR)

For each size a compacted topic of that many keys (``big-{i}``, values of about 200 bytes of JSON, placed by Kafka's
default partitioner) is written straight to the stack's broker and served with ``freshroute table add`` on the
stack's nodes (one standby). Once every replica has caught up, side by side for every size:

- lookup latency of random keys at a fixed moderate rate: REST (h2load --h1, a file of random keys' URIs), and
  gRPC ``Router.Get`` and the client's direct ``get`` (each from this process, one read at a time, paced);
- REST throughput at saturation (wrk, 64 connections, keys rotating over a random sample of the whole table);
- the store nodes' RSS and the table's data on their disks; the topic's size on the broker's disk.

For the largest size also: the client's lookups of a small table served on the same nodes, before and while they
restore the big one (does a restore starve the replicas a node already hosts?); a new store node restoring the whole
topic into an empty directory against a plain consumer reading it (records/s); and kill -9 of a store node under
client lookups (failed lookups; strict reads back). Prints every figure, writes ``bigtable.json`` and ``bigtable.png`` (figures against table size) to --out;
the last line is one JSON object with the figures named ``big_*``. Loopback only; every step ends by itself.
Each size's topic and table are removed afterwards unless --keep.

``--versions N`` makes each table versioned (``table add --history-retention 7d``): each key written N times, a minute
apart (the last a minute ago), each time a different value. The figures gain ``_v{N}``, and add the REST latency of a
lookup as of a time halfway through the history (``big_asof_p50_ms_*``, ``big_asof_p99_ms_*``): run once without
and once with to compare disk per copy, the restore (served after table add) and lookups.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import orjson

from freshroute.keys import partition_for
from freshroute.settings import kafka_client_config
from loadtest import loadclients as lc
from loadtest.stats import percentile
from loadtest.versioned import STEP_MS, version_times

SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000, "10m": 10_000_000}
PARTITIONS = 12
KEY_PREFIX = "big-"
SAMPLE_KEYS = 20_000  # random keys the latency and throughput runs rotate over
HISTORY_MS = 7 * 86_400_000  # --versions: the tables' history retention


def key_of(i: int) -> bytes:
    return b"big-%d" % i


def value_of(i: int, version: int = 0) -> bytes:
    """Key i's row (its ``version``-th): about 200 bytes of JSON, different for every key and version."""
    row = b'{"id":%d,"name":"customer %d","segment":"s%d","score":%d.25,"tags":["a%d","b%d"],"note":"%s"}' % (
        i, i, i % 97, i % 1000, i % 13, i % 7, b"x" * 64)
    return row[:-1] + b',"v":%d}' % version if version else row



def topic_name(prefix: str, label: str) -> str:
    return f"{prefix}bigtable-{label}"


def table_name(label: str) -> str:
    return f"big_{label}"


def write_topic(bootstrap: str, topic: str, keys: int, partitions: int = PARTITIONS,
                say: Callable[[str], None] = print, times: list[int] | None = None) -> float:
    """Create ``topic`` (compacted) and write one record per key (one per key and time of ``times``, with that Kafka
    timestamp, oldest first); returns the seconds the writes took."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from pipeline.topics import ensure_topic

    ensure_topic(AdminClient(kafka_client_config(bootstrap)), topic, partitions, {"cleanup.policy": "compact"})
    producer = Producer(kafka_client_config(bootstrap, **{"linger.ms": 50, "batch.size": 1_000_000,
                                                          "compression.type": "lz4",
                                                          "queue.buffering.max.messages": 2_000_000}))
    start = last = time.monotonic()
    for v, at in enumerate(times) if times else [(0, None)]:
        stamp = {"timestamp": at} if at is not None else {}
        for i in range(keys):
            key = key_of(i)
            while True:
                try:
                    producer.produce(topic, key=key, value=value_of(i, v), partition=partition_for(key, partitions),
                                     **stamp)
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 20_000 == 0:
                producer.poll(0)
                if time.monotonic() - last > 5:
                    last = time.monotonic()
                    done = v * keys + i
                    say(f"    writing {topic}: {done:,} of {keys * max(1, len(times or ())):,} records "
                        f"({done / (last - start):,.0f}/s)")
    if producer.flush(600):
        raise RuntimeError(f"records to {topic} were not all delivered")
    return time.monotonic() - start


def wait_served(rest_url: str, table: str, timeout_s: float, say: Callable[[str], None] = print) -> float:
    """Until every partition of ``table`` has its active and standby caught up (the console's view of its replicas);
    returns the seconds it took."""
    start = last = time.monotonic()
    with httpx.Client(base_url=rest_url, timeout=10) as http:
        while True:
            r = http.get(f"/v1/cluster/tables/{table}", params={"limit": 4096})
            if r.status_code == 200:
                parts = r.json()["partitions"]
                ready = [p for p in parts if sum(1 for x in p["replicas"] if x["alive"] and x["kind"] in
                                                 ("active", "standby") and x["lag"]["offsets"] == 0) >= 2]
                if parts and len(ready) == len(parts):
                    return time.monotonic() - start
                if time.monotonic() - last > 5:
                    last = time.monotonic()
                    behind = sum(x["lag"]["offsets"] or 0 for p in parts for x in p["replicas"])
                    say(f"    restoring {table}: {len(ready)} of {len(parts)} partitions caught up, "
                        f"{behind:,} offsets to go")
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"{table} was not served within {timeout_s:.0f} s")
            time.sleep(0.5)


def settle(stack: Any, quiet_cores: float = 0.15, timeout_s: float = 120.0) -> float:
    """Until the store nodes' CPU stays under ``quiet_cores`` for 2 s (a restore's compactions are over), so that the
    figures are those of a table served, not of one still settling; returns the seconds waited."""
    from loadtest.footprint import tree_cpu_seconds

    roots = {n: stack.components[n].pid for n in stack.store_node_names()
             if n in stack.components and stack.components[n].alive()}
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        before = sum(tree_cpu_seconds(roots).values())
        time.sleep(2)
        if (sum(tree_cpu_seconds(roots).values()) - before) / 2 < quiet_cores:
            break
    return time.monotonic() - start


def mismatches(rest_url: str, table: str, keys: list[int], version: int = 0) -> list[str]:
    """Keys whose served value is not the one written last (its ``version``; batchGet, 100 keys a request); empty when
    all agree."""
    bad: list[str] = []
    with httpx.Client(base_url=rest_url, timeout=30) as http:
        for at in range(0, len(keys), 100):
            chunk = keys[at:at + 100]
            r = http.post(f"/v1/tables/{table}/keys:batchGet", json={"keys": [key_of(i).decode() for i in chunk]})
            r.raise_for_status()
            for i, item in zip(chunk, r.json()["results"]):
                if not item["found"] or orjson.dumps(item["value"]) != orjson.dumps(orjson.loads(value_of(i, version))):
                    bad.append(f"{key_of(i).decode()}: {item}")
                    if len(bad) >= 10:
                        return bad
    return bad


def rest_latency(rest_url: str, table: str, keys: int, rate: float, duration_s: float, work: Path,
                 rng: random.Random, query: str = "") -> tuple[float | None, float | None]:
    """p50, p99 (ms) of REST lookups of random keys at ``rate`` per second (h2load --h1, 4 connections)."""
    uris = work / f"{table}-uris.txt"
    tail = f"?{query}" if query else ""
    uris.write_text("".join(f"{rest_url}/v1/tables/{table}/keys/{KEY_PREFIX}{rng.randrange(keys)}{tail}\n"
                            for _ in range(SAMPLE_KEYS)))
    log = work / f"{table}-h2load.log"
    clients = 4
    cmd = lc.h2load_command("", clients, 1, duration_s, rps_per_client=rate / clients, log_file=log, http1=True,
                            input_file=uris)
    res = lc.parse_h2load(lc.run(cmd, duration_s + 60))
    latencies, statuses = lc.parse_h2load_log(log)
    if res.status_2xx != res.done or not res.done:
        raise RuntimeError(f"REST lookups of {table}: {res.status_2xx} of {res.done} answered 200 ({statuses})")
    return percentile(latencies, 50), percentile(latencies, 99)


def paced(call: Callable[[str], Any], keys: int, rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Latencies (ms) of ``call(key)`` for random keys, one at a time at ``rate`` per second."""
    out = []
    interval = 1.0 / rate
    deadline = time.monotonic() + duration_s
    next_at = time.monotonic()
    while next_at < deadline:
        now = time.monotonic()
        if now < next_at:
            time.sleep(next_at - now)
        key = f"{KEY_PREFIX}{rng.randrange(keys)}"
        t0 = time.perf_counter()
        call(key)
        out.append((time.perf_counter() - t0) * 1000)
        next_at += interval
    return out


def rest_throughput(rest_url: str, table: str, keys: int, duration_s: float) -> float:
    """REST lookups/s at saturation (wrk, 64 connections), keys rotating over SAMPLE_KEYS spread over the table."""
    stride = max(1, keys // SAMPLE_KEYS)
    env = {**lc.wrk_env(table, KEY_PREFIX, min(keys, SAMPLE_KEYS)), "WRK_KEY_STRIDE": str(stride)}
    out = lc.parse_wrk(lc.run(lc.wrk_command(rest_url + "/", 64, duration_s), duration_s + 30, env))
    if out["errors"]:
        raise RuntimeError(f"REST throughput of {table}: {out['errors']} errors of {out['requests']}")
    return out["rps"]


def dir_bytes(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (allocated: Kafka's preallocated index files count as written)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def footprint(stack: Any, table: str, topic: str) -> dict[str, float]:
    """The store nodes' RSS (MiB, the largest), the table's data on their disks and the topic's on the broker's."""
    from freshroute.proc import rss_kib

    home = stack.config.home
    rss = [rss_kib(stack.components[n].pid) or 0 for n in stack.store_node_names()
           if n in stack.components and stack.components[n].alive()]
    data = sum(dir_bytes(d / table) for d in (home / "data").glob("*"))
    topic_bytes = sum(dir_bytes(d) for d in (home / "broker").glob(f"*/data/{topic}-*"))
    return {"node_rss_mib": max(rss, default=0) / 1024, "node_disk_mib": data / 2**20, "topic_mib": topic_bytes / 2**20}


def restore_vs_raw(stack: Any, table: str, topic: str, keys: int, work: Path, say: Callable[[str], None]) -> dict:
    """A new store node restoring the whole topic into an empty directory (in a namespace of its own) against a
    plain consumer reading it (loadtest/restore.py)."""
    from loadtest.restore import ScratchChangelog

    c = stack.config
    scratch = ScratchChangelog.of_topic(c.bootstrap, c.redis_url, work, topic, PARTITIONS, keys, c.topic_prefix)
    try:
        raw = scratch.raw_consume()
        say(f"    raw consume: {raw['raw_consume_rps']:,.0f} records/s")
        read = scratch.raw_consume(read_records=True)
        say(f"    raw consume taking each record's key and value: {read['raw_consume_rps']:,.0f} records/s")
        restored = scratch.restore(timeout_s=1800, progress=lambda n, applied, s: say(
            f"    restoring into an empty node: {applied:,} records in {s:.0f} s"))
        say(f"    restore: {restored['restore_rps']:,.0f} records/s")
        return {"big_restore_rps": restored["restore_rps"], "big_raw_consume_rps": raw["raw_consume_rps"],
                "big_raw_read_rps": read["raw_consume_rps"]}
    finally:
        scratch.remove()


def failover(stack: Any, table: str, keys: int, say: Callable[[str], None], victim: str = "store-node-3") -> dict:
    """kill -9 of a store node under client lookups (no bound: standbys may answer): the lookups that failed, and
    how long after the kill a strict read (max_lag=0) of a key the victim led was answered again."""
    from freshroute.client import Client
    from freshroute.errors import FreshrouteError

    c = stack.config
    rng = random.Random(11)
    failed, done = [], [0]
    stop = threading.Event()
    grid = httpx.get(f"{c.rest_url}/v1/cluster/tables/{table}", timeout=10).json()["partitions"]
    node = f"node-{victim.rsplit('-', 1)[1]}"
    led = {p["partition"] for p in grid for r in p["replicas"] if r["role"] == "active" and r["node"] == node}
    led_keys = [f"{KEY_PREFIX}{i}" for i in range(10_000) if partition_for(key_of(i), PARTITIONS) in led][:50]
    with Client(c.redis_url, namespace=c.namespace) as client:

        def load() -> None:
            while not stop.is_set():
                try:
                    client.get(table, f"{KEY_PREFIX}{rng.randrange(keys)}")
                except FreshrouteError as e:
                    failed.append(e.code)
                done[0] += 1
                time.sleep(0.005)

        t = threading.Thread(target=load, daemon=True)
        t.start()
        time.sleep(3)
        killed = time.monotonic()
        stack.signal(victim, signal.SIGKILL)
        strict_s = None
        while time.monotonic() - killed < 30 and led_keys:
            try:
                client.get(table, led_keys[0], max_lag=0)
                strict_s = time.monotonic() - killed
                break
            except FreshrouteError:
                time.sleep(0.05)
        time.sleep(3)
        stop.set()
        t.join(10)
    say(f"    kill -9 of {victim}: {len(failed)} of {done[0]} lookups failed; strict reads back after "
        f"{strict_s if strict_s is None else round(strict_s, 2)} s")
    stack.start(victim)
    return {"big_failover_failed": len(failed), "big_failover_lookups": done[0], "big_failover_strict_s": strict_s}


class Neighbour:
    """A small table served beside the big one, read by the client at a steady rate: the lookups of replicas the nodes
    already host, before and while the nodes restore the big table (does a restore starve them?)."""

    KEYS = 10_000
    RATE = 100.0

    def __init__(self, stack: Any, say: Callable[[str], None]) -> None:
        from confluent_kafka.admin import AdminClient

        from freshroute.metadata.store import MetadataStore
        from freshroute.served_tables import add_table

        c = stack.config
        self.stack, self.say = stack, say
        self.topic, self.table = topic_name(c.topic_prefix, "neighbour"), "big_neighbour"
        self.md = MetadataStore.from_url(c.redis_url, c.namespace)
        self.admin = AdminClient(kafka_client_config(c.bootstrap))
        write_topic(c.bootstrap, self.topic, self.KEYS, say=say)
        add_table(self.md, self.admin, c.bootstrap, self.table, self.topic, standby_replicas=1,
                  kafka_config=kafka_client_config(c.bootstrap))
        wait_served(c.rest_url, self.table, 120, say)

    def lookups(self, until: Callable[[], bool]) -> dict[str, Any]:
        """Client lookups of random keys at RATE/s, one at a time, until ``until()``: p50, p99 (ms) and failures."""
        from freshroute.client import Client
        from freshroute.errors import FreshrouteError

        rng = random.Random(13)
        latencies: list[float] = []
        failed = 0
        c = self.stack.config
        with Client(c.redis_url, namespace=c.namespace) as client:
            next_at = time.monotonic()
            while not until():
                now = time.monotonic()
                if now < next_at:
                    time.sleep(next_at - now)
                t0 = time.perf_counter()
                try:
                    client.get(self.table, f"{KEY_PREFIX}{rng.randrange(self.KEYS)}")
                    latencies.append((time.perf_counter() - t0) * 1000)
                except FreshrouteError:
                    failed += 1
                next_at += 1 / self.RATE
        return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "failed": failed,
                "lookups": len(latencies) + failed}

    def during(self, work: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
        """``work()``'s result and the lookups made while it ran."""
        done = threading.Event()
        box: dict[str, Any] = {}
        t = threading.Thread(target=lambda: box.update(figures=self.lookups(done.is_set)), daemon=True)
        t.start()
        try:
            result = work()
        finally:
            done.set()
            t.join(30)
        return result, box["figures"]

    def remove(self) -> None:
        from freshroute.served_tables import remove_table

        if self.table in self.md.tables():
            remove_table(self.md, self.table)
        self.admin.delete_topics([self.topic])[self.topic].result(60)


def pipeline_at(stack: Any, label: str, keys: int, work: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """The pipeline at this state size: the demo's aggregation (sensor_stats) processing a backlog of twice as many
    readings as keys, over ``keys`` distinct sensors, in this process against the stack's broker and Redis
    (topics and namespace of its own, deleted afterwards): events/s once warm and the micro-batch time; then, resumed
    with that state, event → changelog latency of readings at 50/s (loadtest/pipeline_bench.py)."""
    from confluent_kafka.admin import AdminClient

    from loadtest.pipeline_bench import measure_latency, measure_throughput

    c = stack.config
    events = 2 * keys
    prefix = f"big{label}{random.randrange(16 ** 6):06x}"
    try:
        # At most 90 batches: Spark keeps the progress of the last 100 only, and the rate is taken over them all.
        t = measure_throughput(c.bootstrap, c.redis_url, work, events=events, sensors=keys,
                               max_records_per_batch=max(200_000, -(-events // 90)), prefix=prefix)
        lat = measure_latency(c.bootstrap, c.redis_url, work, rate_per_s=50, duration_s=60, sensors=1000, idle_s=0,
                              prefix=prefix)
    finally:
        admin = AdminClient(kafka_client_config(c.bootstrap))
        mine = [name for name in admin.list_topics(timeout=30).topics if name.startswith(prefix)]
        for future in (admin.delete_topics(mine).values() if mine else ()):
            future.result(60)
    # The readings produced over the batches' time: Spark's input-row count (t.events) counts the source once per
    # branch that reads it (the table's rows, and the rejected records' beside them).
    rate = round(events / t.processing_s, 1) if t.processing_s else None
    say(f"  pipeline with {keys:,} keys of state: {rate:,.0f} readings/s over {t.processing_s:.0f} s of micro-batches, "
        f"p50 {t.batch_ms_p50:,.0f} ms a batch ({t.batches} batches; Spark counted {t.events:,} input rows)")
    say(f"  then, {keys:,} keys of state, readings at 50/s: event → changelog p50 {lat.p50_ms:,.0f} ms, p99 "
        f"{lat.p99_ms:,.0f} ms ({lat.matched} of {lat.events} matched; batches p50 {lat.batch_ms_p50:,.0f} ms)")
    return {f"big_pipeline_events_per_s_{label}": rate, f"big_pipeline_batch_ms_{label}": t.batch_ms_p50,
            f"big_pipeline_event_to_changelog_p99_ms_{label}": lat.p99_ms,
            f"big_pipeline_event_to_changelog_p50_ms_{label}": lat.p50_ms}


def measure(stack: Any, label: str, keys: int, args: argparse.Namespace, work: Path, say: Callable[[str], None],
            largest: bool) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient

    from freshroute.client import Client
    from freshroute.metadata.store import MetadataStore
    from freshroute.served_tables import add_table, remove_table
    from proto import router_pb2, router_pb2_grpc

    c = stack.config
    versions = args.versions
    if versions > 1:
        label = f"{label}_v{versions}"
    topic, table = topic_name(c.topic_prefix, label), table_name(label)
    times = version_times(versions, int(time.time() * 1000)) if versions > 1 else None
    md = MetadataStore.from_url(c.redis_url, c.namespace)
    admin = AdminClient(kafka_client_config(c.bootstrap))
    out: dict[str, Any] = {}
    say(f"{label}: {keys:,} keys")
    try:
        out["write_s"] = write_topic(c.bootstrap, topic, keys, say=say, times=times)
        neighbour = Neighbour(stack, say) if largest else None

        def serve() -> float:
            add_table(md, admin, c.bootstrap, table, topic, standby_replicas=1,
                      history_retention_ms=HISTORY_MS if times else 0, kafka_config=kafka_client_config(c.bootstrap))
            return wait_served(c.rest_url, table, args.restore_timeout, say)

        if neighbour is None:
            out["served_after_s"] = serve()
        else:
            try:
                until = time.monotonic() + args.duration
                idle = neighbour.lookups(lambda: time.monotonic() > until)
                out["served_after_s"], during = neighbour.during(serve)
            finally:
                neighbour.remove()
            out.update({"big_neighbour_p50_ms_idle": idle["p50"], "big_neighbour_p99_ms_idle": idle["p99"],
                        f"big_neighbour_p50_ms_restoring_{label}": during["p50"],
                        f"big_neighbour_p99_ms_restoring_{label}": during["p99"],
                        f"big_neighbour_failed_restoring_{label}": during["failed"]})
            say(f"  lookups of a {Neighbour.KEYS:,}-key table on the same nodes at {Neighbour.RATE:.0f}/s: p50/p99 "
                f"{idle['p50']:.2f}/{idle['p99']:.2f} ms before, {during['p50']:.2f}/{during['p99']:.2f} ms while they "
                f"restored {table} ({during['failed']} of {during['lookups']} failed)")
        out["settled_after_s"] = settle(stack)
        say(f"  written in {out['write_s']:.0f} s, served (every replica caught up) {out['served_after_s']:.0f} s "
            f"after table add; the nodes' compactions settled {out['settled_after_s']:.0f} s later")
        bad = mismatches(c.rest_url, table, random.Random(5).sample(range(keys), min(keys, 2000)), versions - 1)
        if bad:
            raise RuntimeError(f"{table} serves values other than the topic's: {bad[:3]}")
        rng = random.Random(7)
        p50, p99 = rest_latency(c.rest_url, table, keys, args.rate, args.duration, work, rng)
        out[f"big_get_p50_ms_{label}"], out[f"big_get_p99_ms_{label}"] = p50, p99
        if times:
            halfway = f"as_of={times[versions // 2] + STEP_MS // 2}"
            out[f"big_asof_p50_ms_{label}"], out[f"big_asof_p99_ms_{label}"] = rest_latency(
                c.rest_url, table, keys, args.rate, args.duration, work, rng, halfway)
        import grpc

        with grpc.insecure_channel(c.grpc_address) as channel:
            stub = router_pb2_grpc.RouterStub(channel)
            lat = paced(lambda k: stub.Get(router_pb2.GetRequest(table=table, key=k), timeout=5), keys, args.rate / 2,
                        args.duration, rng)
        out[f"big_grpc_p50_ms_{label}"], out[f"big_grpc_p99_ms_{label}"] = percentile(lat, 50), percentile(lat, 99)
        with Client(c.redis_url, namespace=c.namespace) as client:
            client.get(table, f"{KEY_PREFIX}0")
            lat = paced(lambda k: client.get(table, k), keys, args.rate / 2, args.duration, rng)
        out[f"big_client_p50_ms_{label}"], out[f"big_client_p99_ms_{label}"] = percentile(lat, 50), percentile(lat, 99)
        out[f"big_rest_rps_{label}"] = rest_throughput(c.rest_url, table, keys, args.duration)
        fp = footprint(stack, table, topic)
        out.update({f"big_{k}_{label}": v for k, v in fp.items()})
        say("  " + ", ".join(f"{k} {v:,.2f}" for k, v in out.items() if k.startswith("big_")))
        if largest and not args.no_restore:
            out.update({f"{k}_{label}": v for k, v in restore_vs_raw(stack, table, topic, keys, work, say).items()})
        if label in args.pipeline:
            out.update(pipeline_at(stack, label, keys, work, say))
        if largest and not args.no_failover:
            out.update({f"{k}_{label}": v for k, v in failover(stack, table, keys, say).items()})
            wait_served(c.rest_url, table, args.restore_timeout, say)
    finally:
        if not args.keep:
            if table in md.tables():
                remove_table(md, table)
            try:
                admin.delete_topics([topic])[topic].result(60)
            except Exception as e:  # noqa: BLE001 - the run's figures stand; say what is left behind
                say(f"  ! topic {topic} not deleted: {e}")
    return out


def plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(rows)
    xs = [SIZES[label] for label in labels]
    panels = [("lookup latency (ms)", [("REST p50", "big_get_p50_ms"), ("REST p99", "big_get_p99_ms"),
                                       ("gRPC p99", "big_grpc_p99_ms"), ("client p99", "big_client_p99_ms")]),
              ("REST lookups/s at saturation", [("REST", "big_rest_rps")]),
              ("store node RSS (MiB, largest)", [("RSS", "big_node_rss_mib")]),
              ("disk (MiB)", [("table on the nodes", "big_node_disk_mib"), ("topic", "big_topic_mib")])]
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 4.5))
    for ax, (title, series) in zip(axes, panels):
        for name, key in series:
            ys = [rows[label].get(f"{key}_{label}") for label in labels]
            pts = [(x, y) for x, y in zip(xs, ys) if isinstance(y, (int, float))]
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("keys in the table")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("freshroute: a table as it grows (3 store nodes, one standby)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bigtable", description=__doc__.splitlines()[0])
    p.add_argument("--home", default=".freshroute/local", help="the local stack's directory (holds state.json)")
    p.add_argument("--sizes", nargs="+", default=["10k", "1m", "10m"], choices=list(SIZES))
    p.add_argument("--rate", type=float, default=200.0, help="lookups/s of the latency runs")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of each latency and throughput run")
    p.add_argument("--restore-timeout", type=float, default=1800.0)
    p.add_argument("--no-restore", action="store_true", help="skip the restore into an empty node")
    p.add_argument("--no-failover", action="store_true", help="skip the kill -9 of a node")
    p.add_argument("--keep", action="store_true", help="keep each size's topic and table afterwards")
    p.add_argument("--pipeline", nargs="*", default=[], choices=list(SIZES), metavar="SIZE",
                   help="also run the pipeline's aggregation with this many distinct keys in its state (1m: minutes; "
                        "10m: tens of minutes)")
    p.add_argument("--versions", type=int, default=1,
                   help="versions of each key: more than 1 makes the tables versioned (7 days of history)")
    p.add_argument("--out", type=Path, default=Path("bigtable-results"))
    a = p.parse_args(argv)
    if not 1 <= a.versions <= 100:
        p.error("--versions must be within 1..100")

    from tools.local.stack import NoLocalStack, Stack

    def say(msg: str) -> None:
        print(msg, flush=True)

    try:
        stack = Stack.load(Path(a.home), say)
    except NoLocalStack as e:
        print(f"bigtable: {e}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="freshroute-bigtable-"))
    rows: dict[str, dict[str, Any]] = {}
    try:
        order = sorted(a.sizes, key=lambda s: SIZES[s])
        for label in order:
            rows[label] = measure(stack, label, SIZES[label], a, work, say, largest=label == order[-1])
            (a.out / "bigtable.json").write_text(json.dumps(rows, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = {k: (round(v, 3) if isinstance(v, float) else v) for row in rows.values() for k, v in row.items()
               if k.startswith("big_")}
    for k, v in figures.items():
        print(f"{k:<36} {v}")
    plot(rows, a.out / "bigtable.png")
    print(f"wrote {a.out / 'bigtable.json'} and {a.out / 'bigtable.png'}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Table versions measured on a stack of its own: a table redefined (a new aggregate column, by ``freshroute table
deploy`` while the pipeline runs) under lookups is built beside the served version, switched to once it has caught up, rolled back, and the version left behind retired.

Figures: the rate of lookups held (over keep-alive connections spread evenly over the stack's routers, which share
one port: loadtest.http_load), lookups failed and answers mixing versions (an answer whose fields are not its
``table_version``'s) over all of it; how long after the switch's metadata write, and after a rollback's, the first
answer of the new version came from each router (the load's lookups are its probes; the figure is the slowest
router's); what the build cost (seconds and pipeline CPU seconds per million input records, from the version's start
to its switch); the disk the new version held at the switch, and how long after its retirement all of it was given
back.

``python -m loadtest.table_versions`` (``--records``, ``--rate`` or ``--version-rate``); ``freshroute bench`` runs it
as a step. The stack lives in a directory of its own and is thrown away afterwards: the user's stack is never touched.
"""

from __future__ import annotations

import argparse
import bisect
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

import httpx
import orjson
import uvloop

from freshroute.lag import now_ms
from loadtest.footprint import tree_cpu_seconds
from loadtest.http_load import RateLoad

TABLE = "sensor_stats"
V1 = '''
from pyspark.sql import functions as F

from pipeline.tables import source, table

source("readings", schema="sensor STRING NOT NULL, area STRING NOT NULL, reading DOUBLE NOT NULL")


@table(name="sensor_stats", key="sensor", source="readings")
def sensor_stats(readings):
    return readings.groupBy("sensor").agg(F.count("reading").alias("count"), F.sum("reading").alias("sum"))
'''
V2 = V1.replace('F.sum("reading").alias("sum"))', 'F.sum("reading").alias("sum"), F.max("reading").alias("max"))')
FIELDS = {1: frozenset({"count", "sum"}), 2: frozenset({"count", "sum", "max"})}
RETAIN_AFTER_ROLLBACK_MS = 10_000  # version 2, rolled back from, is retired this soon


class Load(threading.Thread):
    """Lookups of random sensors through the routers at ``rate`` a second until stopped (loadtest.http_load: keep-alive
    connections, spread evenly over ``routers``, name → pid, when given): each answer's arrival time (ms since the
    epoch), status and version, and whether its fields are its version's; per router, when each answer came and its
    version."""

    def __init__(self, url: str, sensors: list[str], rate: float, workers: int = 64,
                 routers: Mapping[str, int] | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.sensors, self.rate, self.workers = url, sensors, rate, workers
        self.routers = dict(routers or {})
        self.answers: list[tuple[int, int, int | None, bool]] = []
        self.by_router: dict[str, list[tuple[int, int | None]]] = {}  # router → (when, version) of its 200 answers
        self.mixed: list[tuple[int, int | None, tuple[str, ...], str]] = []  # when, version, fields, who answered
        self.stop = threading.Event()
        self.cpu_s = 0.0  # the load's own CPU (its thread's)
        self.reconnects = 0

    def run(self) -> None:
        split = urlsplit(self.url)
        paths = [f"/v1/tables/{TABLE}/keys/{s}".encode() for s in self.sensors]
        load = RateLoad(split.hostname or "", split.port or 80, self.rate, self.workers, lambda rng: rng.choice(paths),
                        self._answer, self.stop.is_set, self.routers)
        started = time.thread_time()
        try:
            uvloop.run(load.run())
        finally:
            self.cpu_s, self.reconnects = time.thread_time() - started, load.reconnects

    def _answer(self, router: str, status: int, content: bytes) -> None:
        t = now_ms()
        body = orjson.loads(content) if status == 200 else {}
        version = body.get("table_version")
        fields = frozenset(body.get("value") or ())
        whole = status != 200 or fields == FIELDS.get(version or 0)
        self.answers.append((t, status, version, whole))
        if status == 200:
            self.by_router.setdefault(router, []).append((t, version))
        if not whole and len(self.mixed) < 1000:
            self.mixed.append((t, version, tuple(sorted(fields)), str(body.get("served_by"))))

    def first(self, version: int, since_ms: int, router: str | None = None) -> int | None:
        """When the first answer of ``version`` arrived at or after ``since_ms`` (from ``router``: of its answers)."""
        if router is not None:
            answers = self.by_router.get(router, [])
            start = bisect.bisect_left(answers, since_ms, key=lambda a: a[0])  # in the order they came
            return next((t for t, v in islice(answers, start, None) if v == version), None)
        start = bisect.bisect_left(self.answers, since_ms, key=lambda a: a[0])
        return next((t for t, status, v, _ in islice(self.answers, start, None) if status == 200 and v == version),
                    None)

    def first_everywhere(self, version: int, since_ms: int) -> dict[str, int | None]:
        """Per router, when its first answer of ``version`` arrived at or after ``since_ms``."""
        return {r: self.first(version, since_ms, r) for r in self.routers or self.by_router}

    def slowest_second(self) -> int:
        """The fewest answers in one whole second of the load's (its first and last, partial, left out)."""
        per_second = Counter(t // 1000 for t, *_ in self.answers)
        whole = sorted(per_second)[1:-1]
        return min((per_second[s] for s in whole), default=0)


def disk_mb(home: Path, physical: str) -> float:
    """The stack's disk held by table version ``physical``: its changelog's partitions on the broker, its query's
    checkpoint and its replicas' stores (every path that names it)."""
    total = 0
    for part in ("broker", "pipeline", "data"):
        for root, _dirs, files in os.walk(home / part):  # files deleted meanwhile are skipped, as os.walk does
            if physical not in root:
                continue
            for f in files:
                try:
                    total += os.stat(os.path.join(root, f)).st_size
                except OSError:
                    continue
    return round(total / 1e6, 1)


def wait(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s:.0f} s")
        time.sleep(interval_s)


def measure(home: Path, records: int, sensors: int, rate: float, say: Callable[[str], None]) -> dict[str, Any]:
    from confluent_kafka import Producer

    from freshroute.metadata.store import MetadataStore
    from freshroute.metadata.table_versions import VersionState
    from freshroute.metadata.version_store import TableVersionStore
    from freshroute.settings import kafka_client_config
    from tools.local.demo import ensure_topic
    from tools.local.stack import Stack, StackConfig

    home.mkdir(parents=True, exist_ok=True)
    file_v1, file_v2 = home / "tables_v1.py", home / "tables_v2.py"
    file_v1.write_text(V1)
    file_v2.write_text(V2)
    config = StackConfig(home=home / "stack", broker_port=0, redis_port=0, rest_port=0, grpc_port=0,
                         store_ports=(0, 0), namespace="versions", topic_prefix="versions-", demo=False,
                         tables_file=str(file_v1)).resolved()
    stack = Stack(config, progress=say)
    stack.up()
    try:
        names = [f"s{i}" for i in range(sensors)]
        topic = f"{config.topic_prefix}readings"
        ensure_topic(config.bootstrap, topic)
        producer = Producer(kafka_client_config(config.bootstrap, **{"linger.ms": 20}))
        rng = random.Random(1)
        for i in range(records):
            s = names[i % sensors]
            producer.produce(topic, key=s.encode(), value=orjson.dumps({"sensor": s, "area": "a",
                                                                        "reading": rng.uniform(0, 100)}))
            if i % 10_000 == 0:
                producer.poll(0)
        assert producer.flush(60) == 0
        say(f"  {records:,} readings over {sensors:,} sensors produced")
        metadata = MetadataStore.from_url(config.redis_url, config.namespace)
        versions = TableVersionStore(metadata.redis, config.namespace)
        with httpx.Client(base_url=config.rest_url, timeout=10) as client:
            def computed() -> bool:
                r = client.get(f"/v1/tables/{TABLE}/keys/{names[-1]}", params={"max_lag": 0})
                return r.status_code == 200 and r.json()["value"]["count"] == records // sensors

            wait(computed, 600, "version 1 computed")
        built_name = f"{TABLE}-v2"
        routers = {name: stack.components[name].pid for name in stack.router_names()}
        load = Load(config.rest_url, names, rate, routers=routers)
        load.start()
        time.sleep(3)
        pipeline = {"pipeline": stack.components["pipeline"].pid}
        cpu0 = tree_cpu_seconds(pipeline)["pipeline"]
        # Deployed while the pipeline runs: its queries start again in the same process with version 2 beside.
        deployed = subprocess.run([sys.executable, "-m", "tools.cli", "table", "deploy", TABLE, "--tables",
                                   str(file_v2), "--redis-url", config.redis_url, "--namespace", config.namespace],
                                  capture_output=True, text=True, timeout=300)
        if deployed.returncode != 0:
            raise RuntimeError(f"the deploy of version 2 failed: {deployed.stderr.strip()}")
        say(f"  {deployed.stdout.strip()}")
        wait(lambda: (r := versions.record(TABLE)) is not None and 2 in r.versions, 120, "version 2 begun")
        wait(lambda: versions.record(TABLE).serving == 2, 1800, "version 2 served")  # type: ignore[union-attr]
        record = versions.record(TABLE)
        assert record is not None
        cpu1 = tree_cpu_seconds(pipeline)["pipeline"]
        built, switched = record.versions[2], record.versions[2].switched_ms or 0
        at_switch = disk_mb(config.home, built_name)
        wait(lambda: None not in load.first_everywhere(2, switched).values(), 30,
             "an answer of version 2 from every router")
        say(f"  version 2 served {(switched - built.created_ms) / 1000:.1f} s after it began")
        time.sleep(3)
        rolled_back = now_ms()
        versions.rollback(TABLE, rolled_back, RETAIN_AFTER_ROLLBACK_MS)
        wait(lambda: None not in load.first_everywhere(1, rolled_back).values(), 30,
             "an answer of version 1 after the rollback from every router")
        say("  rolled back to version 1; version 2 is retired in 10 s")
        wait(lambda: versions.record(TABLE).versions[2].state is VersionState.RETIRED,  # type: ignore[union-attr]
             120, "version 2 retired")
        retired_ms = now_ms()
        # Kafka deletes a topic's files a minute after the topic; store nodes, a replica's after their grace.
        try:
            # Polled every half second: a walk of the stack's files every 50 ms would take the load's interpreter.
            wait(lambda: disk_mb(config.home, built_name) == 0, 300, "the disk of version 2 given back", 0.5)
        except TimeoutError as e:
            say(f"  ! {e}")  # what is left is the figure
        after = disk_mb(config.home, built_name)
        time.sleep(2)
        load.stop.set()
        load.join(30)
        answers = load.answers
        span_s = (answers[-1][0] - answers[0][0]) / 1000 if answers else 0.0
        switch_ms = {r: (t or switched) - switched for r, t in load.first_everywhere(2, switched).items()}
        rollback_ms = {r: (t or rolled_back) - rolled_back for r, t in load.first_everywhere(1, rolled_back).items()}
        return {
            "version_lookups": len(answers),
            "version_lookups_per_s": round(len(answers) / span_s) if span_s else 0,
            "version_lookups_per_s_slowest": load.slowest_second(),
            "version_lookups_by_router": {r: len(a) for r, a in load.by_router.items()},
            "version_load_cpu_us_per_lookup": round(load.cpu_s * 1e6 / len(answers), 1) if answers else None,
            "version_load_reconnects": load.reconnects,
            "version_lookups_failed": sum(1 for _, status, _, _ in answers if status != 200),
            "version_answers_mixed": sum(1 for *_, whole in answers if not whole),
            "version_switch_visible_ms": max(switch_ms.values()),
            "version_switch_visible_ms_by_router": switch_ms,
            "version_rollback_ms": max(rollback_ms.values()),
            "version_rollback_ms_by_router": rollback_ms,
            "version_build_s_per_million": round((switched - built.created_ms) / 1000 * 1e6 / records, 1),
            "version_build_cpu_s_per_million": round((cpu1 - cpu0) * 1e6 / records, 1),
            "version_disk_mb": {"at_switch": at_switch, "after_retirement": after},
            "version_mixed_examples": [(t - switched, v, f, who) for t, v, f, who in load.mixed[:5]]
            + [(t - rolled_back, v, f, who) for t, v, f, who in load.mixed[-3:]],
            "version_retired_disk_s": round((now_ms() - retired_ms) / 1000, 1),
        }
    finally:
        stack.discard()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000, help="input readings the new version is built from")
    p.add_argument("--sensors", type=int, default=1_000, help="keys of the table")
    p.add_argument("--rate", "--version-rate", dest="rate", type=float, default=2_000.0,
                   help="lookups a second through the routers meanwhile (spread evenly over them)")
    p.add_argument("--home", type=Path, help="where its stack lives (default: a temporary directory, removed)")
    a = p.parse_args(argv)
    home = a.home or Path(tempfile.mkdtemp(prefix="freshroute-versions-"))
    try:
        figures = measure(home, a.records, a.sensors, a.rate, print)
    finally:
        if a.home is None:
            shutil.rmtree(home, ignore_errors=True)
    for name, value in figures.items():
        print(f"{name}: {value}")
    print(orjson.dumps(figures).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

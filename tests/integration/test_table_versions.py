"""A table redefined on the real broker and Spark: the new definition is built beside the served one as a table of
its own, from the input's beginning, while the served one goes on by its own definition; a definition Spark refuses
fails its version only. On a whole stack under lookups: kill -9 of the pipeline and of a store node in the middle of a
build, which goes on from its checkpoint and its replicas; the switch once it has caught up, a rollback, and a switch
by hand to a version behind its input, refused unless forced; with no lookup failed and no answer mixing two
versions."""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import orjson
import pytest

from freshroute.lag import now_ms
from freshroute.metadata.roles import ReplicaState
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.version_store import TableVersionStore
from freshroute.metadata.version_switch import DEFAULT_SWITCH_LAG, readiness
from loadtest.table_versions import FIELDS, V1, V2
from pipeline.checkpoints import committed_batches
from pipeline.version_mirror import MIRROR

from .backfill_support import TABLES, backfill
from .pipeline_support import PipelineProcess, materialize, mismatches, read_topic
from .stack_fixture import produce_readings, start_stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.beside]

SPENT = TABLES.replace('F.max("amount").alias("largest"))',
                       'F.max("amount").alias("largest"), F.sum("amount").alias("spent"))')
REFUSED = TABLES.replace("count(*) AS orders, sum(amount) AS revenue", "count(*) AS orders, sum(price) AS revenue")


def states(versions: TableVersionStore, table: str) -> dict[int, str]:
    record = versions.record(table)
    assert record is not None
    return {n: v.state.value for n, v in record.versions.items()}


@pytest.mark.timeout(900)
def test_a_redefined_table_is_built_beside_the_served_one_and_a_refused_one_fails_alone(broker, redis_url, namespace,
                                                                                       tmp_path):
    assert SPENT != TABLES and REFUSED != TABLES  # the replacements found their text
    env = backfill(broker, redis_url, namespace, tmp_path)
    versions = TableVersionStore(MetadataStore.from_url(redis_url, namespace).redis, namespace)
    assert states(versions, "customer_totals") == {1: "serving"}
    served_before = materialize(read_topic(broker, f"{namespace}customer_totals-changelog"))
    orders = [orjson.loads(v) for _p, _o, _t, _k, v in read_topic(broker, f"{namespace}shop-orders")]

    # A definition Spark refuses (a column the source does not have): its version fails, naming why; the others run.
    refused_file = tmp_path / "refused_tables.py"
    refused_file.write_text(REFUSED)
    run = PipelineProcess({**env, "FRESHROUTE_TABLES_FILE": str(refused_file)}, tmp_path / "pipeline-refused.log")
    assert run.wait_exit(600) == 0, run.tail()
    text = run.log.read_text()
    assert "table orders_per_minute: its definition changed" in text and "Traceback" not in text
    record = versions.record("orders_per_minute")
    assert record is not None and states(versions, "orders_per_minute") == {1: "serving", 2: "failed"}
    reason = record.versions[2].reason or ""
    assert reason.startswith(f"table 'orders_per_minute-v2' in {refused_file}: AnalysisException: "
                             f"[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name "
                             f"`price` cannot be resolved."), reason
    assert versions.building() is None  # the next version may begin

    # A new aggregate column: version 2 is built from the input's beginning as a table of its own, in a query of its
    # own; version 1 goes on being served by the definition it was built with.
    spent_file = tmp_path / "spent_tables.py"
    spent_file.write_text(SPENT)
    run = PipelineProcess({**env, "FRESHROUTE_TABLES_FILE": str(spent_file)}, tmp_path / "pipeline-spent.log")
    assert run.wait_exit(600) == 0, run.tail()
    text = run.log.read_text()
    assert ("table customer_totals: its definition changed (fingerprint ") in text
    assert ("version 2 is built beside version 1 as table customer_totals-v2, from the input's beginning as the "
            "broker holds it") in text
    assert "Traceback" not in text
    assert states(versions, "customer_totals") == {1: "serving", 2: "building"}
    assert versions.building() == "customer_totals-v2"

    want: dict[str, dict] = defaultdict(lambda: {"items": 0, "largest": float("-inf"), "spent": 0.0})
    for o in orders:
        row = want[o["customer"]]
        row["items"] += o["items"]
        row["largest"] = max(row["largest"], o["amount"])
        row["spent"] += o["amount"]
    built = materialize(read_topic(broker, f"{namespace}customer_totals-v2-changelog"))
    assert mismatches(built, dict(want)) == []
    served_after = materialize(read_topic(broker, f"{namespace}customer_totals-changelog"))
    assert served_after == served_before  # no row of the served version is of the new definition
    assert all("spent" not in row for row in served_after.values())

    specs = MetadataStore.from_url(redis_url, namespace).tables()
    assert specs["customer_totals-v2"].value_schema == {"items": "bigint", "largest": "double", "spent": "double"}
    assert specs["customer_totals"].value_schema == {"items": "bigint", "largest": "double"}
    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / "customer_totals-v2" / "commits").is_dir()  # the query of its own
    mirrored = orjson.loads((checkpoints / MIRROR).read_bytes())
    assert {v["version"]: v["state"] for v in mirrored["customer_totals"]["versions"]} == {1: "serving",
                                                                                       2: "building"}

    # Started again with the same tables file: the version building goes on; nothing new begins.
    run = PipelineProcess({**env, "FRESHROUTE_TABLES_FILE": str(spent_file)}, tmp_path / "pipeline-again.log")
    assert run.wait_exit(600) == 0, run.tail()
    assert "is built beside" not in run.log.read_text()
    assert states(versions, "customer_totals") == {1: "serving", 2: "building"}





class Lookups(threading.Thread):
    """Lookups of random sensors through the router until stopped, each answer kept: its status, version and fields."""

    def __init__(self, url: str, sensors: list[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.sensors = url, sensors
        self.answers: list[tuple[int, int | None, frozenset[str]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        rng = random.Random(7)
        with httpx.Client(base_url=self.url, timeout=10) as client:
            for _ in range(200_000):  # bounded: about 100 a second for the test's few minutes
                if self.stop.wait(0.01):
                    return
                r = client.get(f"/v1/tables/sensor_stats/keys/{rng.choice(self.sensors)}")
                body = r.json() if r.status_code == 200 else {}
                self.answers.append((r.status_code, body.get("table_version"), frozenset(body.get("value") or ())))


def served_version(client: httpx.Client) -> dict:
    tables = {t["name"]: t for t in client.get("/v1/tables").json()["tables"]}
    return tables["sensor_stats"]


def recomputed(events: list[dict]) -> dict[str, dict]:
    """Every field of either version per sensor, as Python computes it from ``events``."""
    want: dict[str, dict] = defaultdict(lambda: {"count": 0, "sum": 0.0, "max": float("-inf")})
    for e in events:
        row = want[e["sensor"]]
        row["count"] += 1
        row["sum"] += e["reading"]
        row["max"] = max(row["max"], e["reading"])
    return dict(want)


def readings(rng: random.Random, sensors: list[str], n: int) -> list[dict]:
    return [{"sensor": rng.choice(sensors), "area": "a", "reading": round(rng.uniform(0, 100), 2)} for _ in range(n)]


def table_command(stack, *args: str) -> subprocess.CompletedProcess:
    """``freshroute table ARGS`` against the stack's metadata store."""
    return subprocess.run([sys.executable, "-m", "tools.cli", "table", *args, "--redis-url", stack.config.redis_url,
                           "--namespace", stack.config.namespace], capture_output=True, text=True, timeout=60)


# A switch by hand of a version behind its input by more than the default switch_lag.
NOT_READY = re.compile(r"^freshroute: TABLE_VERSION_NOT_READY: not switched: sensor_stats-v2 is (\d+) input records "
                       r"\((\d+) ms\) behind its input, switch_lag is 1000 \(--force switches all the same\)$",
                       re.MULTILINE)
LATE = 1200  # readings produced while the pipeline is dead: more than the default switch_lag


@pytest.mark.timeout(900)
def test_a_table_redefined_under_load_is_built_through_kills_switched_rolled_back_and_forced_with_no_answer_failed(
        tmp_path):
    v1, v2 = tmp_path / "stats_v1.py", tmp_path / "stats_v2.py"
    v1.write_text(V1)
    v2.write_text(V2)
    assert V2 != V1
    stack = start_stack(tmp_path / "stack", nodes=2, tables_file=str(v1))
    try:
        rng = random.Random(3)
        sensors = [f"s{i}" for i in range(20)]
        events = readings(rng, sensors, 400)
        produce_readings(stack, events)
        metadata = MetadataStore.from_url(stack.config.redis_url, stack.config.namespace)
        versions = TableVersionStore(metadata.redis, stack.config.namespace)
        pipeline_log = Path(stack.components["pipeline"].log)
        with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
            def every_key(want: dict[str, dict], version: int | None, served: int = 2) -> bool:
                params = {"max_lag": 0, **({"version": version} if version else {})}
                got = {s: client.get(f"/v1/tables/sensor_stats/keys/{s}", params=params).json() for s in sensors}
                expected_version = version or served
                return all(g.get("table_version") == expected_version and
                           not mismatches({s: g["value"]}, {s: {k: want[s][k] for k in FIELDS[expected_version]}})
                           for s, g in got.items())

            def behind() -> int:
                """Input records version 2 is behind its input, as a switch reads it."""
                spec = metadata.tables()["sensor_stats-v2"]
                lag = readiness(metadata, spec, now_ms(), DEFAULT_SWITCH_LAG).input_lag
                return 0 if lag is None else lag[0]

            wait_until(lambda: all(client.get(f"/v1/tables/sensor_stats/keys/{s}", params={"max_lag": 0}).status_code
                                   == 200 for s in sensors), 300, "every sensor served", stack=stack)
            load = Lookups(stack.config.rest_url, sensors)
            load.start()
            # The pipeline started again with a new aggregate column and auto_switch off: version 2 is built beside
            # version 1 and stays building, so that the kills below land in its build. Checkpoints every 5 s: the
            # pipeline killed after one goes on from it.
            stack.stop("pipeline")
            flags = ("--tables-file", str(v2), "--realtime-checkpoint-interval", "5 seconds")
            stack.start("pipeline", *flags, "--auto-switch", "false")
            wait_until(lambda: every_key(recomputed(events), 2), 300, "version 2 built as recomputed", stack=stack)
            checkpoint = stack.config.home / "pipeline" / "checkpoints" / "sensor_stats-v2"
            wait_until(lambda: committed_batches(checkpoint) > 0, 60, "a checkpoint of version 2's query", stack=stack)
            assert states(versions, "sensor_stats") == {1: "serving", 2: "building"}
            committed = {p.name: p.stat().st_ino for p in (checkpoint / "commits").iterdir() if p.name.isdigit()}

            # kill -9 of the pipeline and of a store node in the middle of the build, input produced meanwhile.
            killed_at = len(load.answers)
            stack.signal("pipeline", signal.SIGKILL)
            stack.signal("store-node-1", signal.SIGKILL)
            late = readings(rng, sensors, LATE)
            produce_readings(stack, late)
            # A switch by hand is refused while version 2 is behind its input, naming how far.
            wait_until(lambda: behind() >= LATE, 30, "version 2's input lag to show the readings produced",
                       stack=stack)
            refused = table_command(stack, "switch", "sensor_stats", "--version", "2")
            found = NOT_READY.search(refused.stderr)
            assert refused.returncode == 2 and found and int(found[1]) >= LATE, (refused.returncode, refused.stderr)
            assert states(versions, "sensor_stats") == {1: "serving", 2: "building"}
            # Version 1 is served throughout the build; with the store node dead, by the other node's replicas.
            wait_until(lambda: len(load.answers) >= killed_at + 300, 30, "lookups while the store node is dead",
                       stack=stack)
            building = load.answers[:]
            assert all(a[:2] == (200, 1) for a in building), Counter(a[:2] for a in building)

            # Both started again: the pipeline goes on building version 2 from its checkpoint (nothing new begun,
            # nothing failed) and serves it once it has caught up; the store node restores its replicas of both.
            stack.start("store-node-1")
            stack.start("pipeline", *flags)
            wait_until(lambda: served_version(client)["version"] == 2, 300, "version 2 to be served", stack=stack)
            listed = served_version(client)
            assert [(v["version"], v["state"]) for v in listed["versions"]] == [(1, "previous"), (2, "serving")]
            text = pipeline_log.read_text()
            assert text.count("is built beside") == 1 and "version 2 failed" not in text, text[-3000:]
            assert {p.name: p.stat().st_ino for p in (checkpoint / "commits").iterdir()
                    if p.name in committed} == committed  # its batches kept, not done again
            more = [{"sensor": s, "area": "a", "reading": 200.0 + i} for i, s in enumerate(sensors)]
            produce_readings(stack, more)  # both versions are kept up to date
            want = recomputed(events + late + more)
            wait_until(lambda: every_key(want, None), 120, "every key of version 2 as recomputed", stack=stack)
            wait_until(lambda: every_key(want, 1), 120, "every key of version 1 as recomputed", stack=stack)
            partitions = metadata.tables()["sensor_stats-v2"].partitions

            def restored() -> bool:
                report = metadata.nodes().get("node-1")
                held = {(r.table, r.partition) for r in report.replicas
                        if r.state in (ReplicaState.ACTIVE, ReplicaState.STANDBY) and r.within(0)} if report else set()
                return held >= {(t, p) for t in ("sensor_stats", "sensor_stats-v2") for p in range(partitions)}

            wait_until(restored, 60, "store node 1 to restore its replicas of both versions", stack=stack)

            # A rollback serves version 1 again at once.
            started = time.monotonic()
            done = table_command(stack, "rollback", "sensor_stats")
            assert done.returncode == 0, done.stderr
            assert "table sensor_stats: version 1 is served; version 2 is kept for a rollback" in done.stdout
            wait_until(lambda: client.get(f"/v1/tables/sensor_stats/keys/{sensors[0]}").json()["table_version"] == 1,
                       10, "the rollback to reach the router", stack=stack, interval_s=0.05)
            rolled_back_s = time.monotonic() - started

            # A forced switch: with the pipeline killed and input produced meanwhile, version 2 is behind its input;
            # a switch to it is refused, and --force switches all the same.
            stack.signal("pipeline", signal.SIGKILL)
            produce_readings(stack, readings(rng, sensors, LATE))
            wait_until(lambda: behind() >= LATE, 30, "version 2's input lag to show the readings produced",
                       stack=stack)
            refused = table_command(stack, "switch", "sensor_stats", "--version", "2")
            found = NOT_READY.search(refused.stderr)
            assert refused.returncode == 2 and found and int(found[1]) >= LATE, (refused.returncode, refused.stderr)
            forced = table_command(stack, "switch", "sensor_stats", "--version", "2", "--force")
            assert forced.returncode == 0, forced.stderr
            assert "table sensor_stats: version 2 is served; version 1 is kept for a rollback" in forced.stdout
            wait_until(lambda: all(client.get(f"/v1/tables/sensor_stats/keys/{s}").json()["table_version"] == 2
                                   for s in sensors), 10, "the forced switch to reach the router", stack=stack)
            since = len(load.answers)
            time.sleep(1)
            load.stop.set()
            load.join(timeout=30)
        failed = [a for a in load.answers if a[0] != 200]
        mixed = [a for a in load.answers if a[0] == 200 and a[2] != FIELDS.get(a[1] or 0)]
        seen = Counter(a[1] for a in load.answers)
        assert failed == [] and mixed == [], (failed[:5], mixed[:5])
        assert seen[1] > 0 and seen[2] > 0, seen  # the load saw both, each whole
        assert {a[1] for a in load.answers[since:]} == {2}  # after the forced switch, version 2 only
        assert rolled_back_s < 5, rolled_back_s
        text = pipeline_log.read_text()
        assert "Traceback" not in text, text[-3000:]
        # A query killed as it wrote its first checkpoint starts again (the half-written file does not stop it).
        assert "CHECKPOINT_LOCATION_NOT_EMPTY" not in text, text[-3000:]
    finally:
        stack.discard()

"""A table redefined on the real broker and Spark: the new definition is built beside the served one as a table of
its own, from the input's beginning, while the served one goes on by its own definition; a definition Spark refuses
fails its version only. On a whole stack under lookups: the switch once it has caught up, and a rollback, with no
lookup failed and no answer mixing two versions."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import orjson
import pytest

from freshroute.metadata.store import MetadataStore
from freshroute.metadata.version_store import TableVersionStore
from loadtest.table_versions import FIELDS, V1, V2
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


@pytest.mark.timeout(900)
def test_a_table_redefined_under_load_is_built_switched_to_and_rolled_back_with_no_answer_failed_or_mixed(tmp_path):
    v1, v2 = tmp_path / "stats_v1.py", tmp_path / "stats_v2.py"
    v1.write_text(V1)
    v2.write_text(V2)
    assert V2 != V1
    stack = start_stack(tmp_path / "stack", nodes=2, tables_file=str(v1))
    try:
        rng = random.Random(3)
        sensors = [f"s{i}" for i in range(20)]
        events = [{"sensor": rng.choice(sensors), "area": "a", "reading": round(rng.uniform(0, 100), 2)}
                  for _ in range(400)]
        produce_readings(stack, events)
        with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
            wait_until(lambda: all(client.get(f"/v1/tables/sensor_stats/keys/{s}", params={"max_lag": 0}).status_code
                                   == 200 for s in sensors), 300, "every sensor served", stack=stack)
            load = Lookups(stack.config.rest_url, sensors)
            load.start()
            # The pipeline started again with a new aggregate column: version 2 is built beside version 1, then served.
            stack.stop("pipeline")
            stack.start("pipeline", "--tables-file", str(v2))
            wait_until(lambda: served_version(client)["version"] == 2, 300, "version 2 to be served", stack=stack)
            listed = served_version(client)
            assert [(v["version"], v["state"]) for v in listed["versions"]] == [(1, "previous"), (2, "serving")]
            more = [{"sensor": s, "area": "a", "reading": 200.0 + i} for i, s in enumerate(sensors)]
            produce_readings(stack, more)  # both versions are kept up to date
            want = defaultdict(lambda: {"count": 0, "sum": 0.0, "max": float("-inf")})
            for e in events + more:
                row = want[e["sensor"]]
                row["count"] += 1
                row["sum"] += e["reading"]
                row["max"] = max(row["max"], e["reading"])

            def every_key(version: int | None) -> bool:
                params = {"max_lag": 0, **({"version": version} if version else {})}
                got = {s: client.get(f"/v1/tables/sensor_stats/keys/{s}", params=params).json() for s in sensors}
                expected_version = version or 2
                return all(g.get("table_version") == expected_version and
                           not mismatches({s: g["value"]}, {s: {k: want[s][k] for k in FIELDS[expected_version]}})
                           for s, g in got.items())

            wait_until(lambda: every_key(None), 120, "every key of version 2 as recomputed", stack=stack)
            wait_until(lambda: every_key(1), 120, "every key of version 1 as recomputed", stack=stack)

            # A rollback serves version 1 again at once.
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "tools.cli", "table", "rollback", "sensor_stats",
                                   "--redis-url", stack.config.redis_url, "--namespace", stack.config.namespace],
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert "table sensor_stats: version 1 is served; version 2 is kept for a rollback" in done.stdout
            wait_until(lambda: client.get(f"/v1/tables/sensor_stats/keys/{sensors[0]}").json()["table_version"] == 1,
                       10, "the rollback to reach the router", stack=stack, interval_s=0.05)
            rolled_back_s = time.monotonic() - started
            time.sleep(1)
            load.stop.set()
            load.join(timeout=30)
        failed = [a for a in load.answers if a[0] != 200]
        mixed = [a for a in load.answers if a[0] == 200 and a[2] != FIELDS.get(a[1] or 0)]
        versions = Counter(a[1] for a in load.answers)
        assert failed == [] and mixed == [], (failed[:5], mixed[:5])
        assert versions[1] > 0 and versions[2] > 0, versions  # the load saw both, each whole
        assert rolled_back_s < 5, rolled_back_s
        assert "Traceback" not in Path(stack.components["pipeline"].log).read_text()
    finally:
        stack.discard()

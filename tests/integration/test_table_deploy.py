"""``freshroute table deploy`` on the real broker, Redis and Spark: a table given a new definition while the pipeline
runs is built beside the served one (the pipeline's queries stop and start again in the same process, the served
ones resuming from their checkpoints); a second deploy meanwhile is refused naming the first; a switch before the
version has caught up is refused, and forced; and a later start with the pipeline's own tables file, which still
says what it said, builds nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import defaultdict

import orjson
import pytest

from freshroute.metadata.deploys import Deploys
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.version_store import TableVersionStore

from .backfill_support import TABLES, backfill
from .pipeline_support import REPO, PipelineProcess, materialize, mismatches, read_topic
from .stack_fixture import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.beside]

SPENT = TABLES.replace('F.max("amount").alias("largest"))',
                       'F.max("amount").alias("largest"), F.sum("amount").alias("spent"))')


def states(versions: TableVersionStore, table: str) -> dict[int, str]:
    record = versions.record(table)
    return {} if record is None else {n: v.state.value for n, v in record.versions.items()}


def table(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", "table", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def deploy(env: dict[str, str], table: str, tables_file: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tools.cli", "table", "deploy", table, "--tables", tables_file,
                             "--timeout", "5m"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.timeout(900)
def test_a_table_deployed_while_the_pipeline_runs_is_built_beside_switched_to_and_kept(broker, redis_url, namespace,
                                                                                      tmp_path):
    assert SPENT != TABLES
    env = backfill(broker, redis_url, namespace, tmp_path)
    versions = TableVersionStore(MetadataStore.from_url(redis_url, namespace).redis, namespace)
    running = {k: v for k, v in env.items() if k != "FRESHROUTE_AVAILABLE_NOW"}
    run = PipelineProcess(running, tmp_path / "pipeline-running.log")
    try:
        wait_until(lambda: "registered tables" in run.log.read_text(), 300, "the pipeline to run", check=run.check)
        spent_file = tmp_path / "spent_tables.py"
        spent_file.write_text(SPENT)
        first = deploy(env, "customer_totals", str(spent_file))
        deploys = Deploys(versions.redis, namespace)
        wait_until(lambda: "customer_totals" in deploys.pending() or first.poll() is not None, 60, "the deploy asked")
        second = deploy(env, "customer_totals", str(spent_file))  # while the first is pending, or its version builds
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2 and "freshroute: TABLE_DEPLOY_IN_PROGRESS: " in err and "customer_totals" in err
        out, err = first.communicate(timeout=360)
        assert first.returncode == 0, err
        assert out.startswith("table customer_totals: version 2 is building beside the one served, from the input's "
                              "beginning"), out
        # Built beside, by the deployed definition, while the pipeline ran on in the same process.
        orders = [orjson.loads(v) for _p, _o, _t, _k, v in read_topic(broker, f"{namespace}shop-orders")]
        want: dict[str, dict] = defaultdict(lambda: {"items": 0, "largest": float("-inf"), "spent": 0.0})
        for o in orders:
            row = want[o["customer"]]
            row["items"] += o["items"]
            row["largest"] = max(row["largest"], o["amount"])
            row["spent"] += o["amount"]
        wait_until(lambda: not mismatches(materialize(read_topic(broker, f"{namespace}customer_totals-v2-changelog")),
                                          dict(want)), 300, "version 2 to be built", check=run.check)
        text = run.log.read_text()
        assert "the deploy of table customer_totals from" in text and "the queries stop and start again" in text
        assert text.count("spark session ready") == 2 and "Traceback" not in text
        # No store node hosts its replicas here: a switch is refused until forced.
        refused = table(env, "switch", "customer_totals")
        assert refused.returncode == 2 and "freshroute: TABLE_VERSION_NOT_READY: " in refused.stderr, refused.stderr
        assert states(versions, "customer_totals") == {1: "serving", 2: "building"}
        forced = table(env, "switch", "customer_totals", "--force")
        assert forced.returncode == 0, forced.stderr
        assert states(versions, "customer_totals") == {1: "previous", 2: "serving"}
    finally:
        if run.alive():
            run.proc.send_signal(signal.SIGTERM)  # a graceful stop, of the pipeline's second Spark session too
        assert run.wait_exit(120) == 0, run.tail()

    # Started again with its own tables file, which says what it said: the deployed version stays served.
    again = PipelineProcess(running, tmp_path / "pipeline-again.log")
    try:
        wait_until(lambda: "registered tables" in again.log.read_text(), 300, "the pipeline to run again",
                   check=again.check)
        assert "is built beside" not in again.log.read_text()
        assert states(versions, "customer_totals") == {1: "previous", 2: "serving"}
    finally:
        if again.alive():
            again.proc.send_signal(signal.SIGTERM)
        assert again.wait_exit(120) == 0, again.tail()

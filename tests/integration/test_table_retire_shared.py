"""A table version retired while it shares its Real-time query, on the real broker, Redis and Spark: version 1 of
sensor_stats, fused with area_counts in ``readings.tables``, is retired once a deployed version 2 is switched to. Its
record says retired, its spec and changelog go, and the shared query goes on computing it as a ghost (its state kept,
its rows written nowhere) while area_counts keeps up with new input; a stop and a start resume that query."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient

from freshroute.metadata.store import MetadataStore
from freshroute.metadata.version_store import TableVersionStore
from freshroute.topics import describe_topic
from pipeline.checkpoints import committed_batches, recorded_tables
from pipeline.topics import ensure_topic

from .pipeline_support import REPO, PipelineProcess, materialize, mismatches, produce_readings, read_topic, recompute
from .stack_fixture import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.beside]

TABLES = '''
from pyspark.sql import functions as F
from pipeline.tables import source, sql_table, table

source("readings", schema="sensor STRING NOT NULL, area STRING NOT NULL, reading DOUBLE NOT NULL")


@table(name="sensor_stats", key="sensor", source="readings")
def sensor_stats(readings):
    return readings.groupBy("sensor").agg(
        F.count("reading").alias("count"), F.sum("reading").alias("sum"), F.avg("reading").alias("avg"),
        F.min("reading").alias("min"), F.max("reading").alias("max"),
        F.max_by("reading", F.struct("timestamp", "partition", "offset")).alias("last"){more})


sql_table(name="area_counts", key="area", source="readings",
          sql="SELECT area, count(*) AS count FROM readings GROUP BY area")
'''


def states(versions: TableVersionStore, table: str) -> dict[int, str]:
    record = versions.record(table)
    return {} if record is None else {n: v.state.value for n, v in record.versions.items()}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", "table", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=360)


@pytest.mark.timeout(900)
def test_a_version_retired_in_its_shared_query_goes_with_its_changelog_and_the_query_resumes(broker, redis_url,
                                                                                           namespace, tmp_path):
    rng = random.Random(20261204)
    input_topic, checkpoints = f"{namespace}readings", tmp_path / "checkpoints"
    v1_topic, counts_topic = f"{namespace}sensor_stats-changelog", f"{namespace}area_counts-changelog"
    admin = AdminClient({"bootstrap.servers": broker})
    ensure_topic(admin, input_topic, 2)
    tables, changed = tmp_path / "tables.py", tmp_path / "changed_tables.py"
    tables.write_text(TABLES.format(more=""))
    changed.write_text(TABLES.format(more=', F.count("area").alias("areas")'))
    env = {**os.environ,
           "FRESHROUTE_BOOTSTRAP_SERVERS": broker, "FRESHROUTE_REDIS_URL": redis_url, "FRESHROUTE_NAMESPACE": namespace,
           "FRESHROUTE_TOPIC_PREFIX": namespace, "FRESHROUTE_CHECKPOINT_DIR": str(checkpoints),
           "FRESHROUTE_CHANGELOG_PARTITIONS": "4", "FRESHROUTE_PIPELINE_MODE": "realtime",
           "FRESHROUTE_REALTIME_CHECKPOINT_INTERVAL": "5 seconds", "FRESHROUTE_RETAIN_PREVIOUS": "1s",
           "FRESHROUTE_TABLES_FILE": str(tables)}
    versions = TableVersionStore(MetadataStore.from_url(redis_url, namespace).redis, namespace)
    metadata = MetadataStore.from_url(redis_url, namespace)

    def counts_caught_up(pipeline: PipelineProcess) -> None:
        _, want = recompute(read_topic(broker, input_topic))
        wait_until(lambda: not mismatches(materialize(read_topic(broker, counts_topic)), want), 120,
                   "area_counts to equal a recomputation of the input", interval_s=1, check=pipeline.check)

    def stopped(pipeline: PipelineProcess) -> None:
        if pipeline.alive():
            pipeline.proc.send_signal(signal.SIGTERM)
        assert pipeline.wait_exit(120) == 0, pipeline.tail()

    produce_readings(broker, input_topic, 500, rng)
    run = PipelineProcess(env, tmp_path / "pipeline.log")
    try:
        counts_caught_up(run)
        shared = checkpoints / "readings.tables"
        wait_until(lambda: committed_batches(shared), 60, "the shared query's checkpoint", check=run.check)
        assert recorded_tables(shared) == ["area_counts", "sensor_stats"]
        deployed = cli(env, "deploy", "sensor_stats", "--tables", str(changed), "--timeout", "5m")
        assert deployed.returncode == 0, deployed.stderr
        wait_until(lambda: read_topic(broker, f"{namespace}sensor_stats-v2-changelog"), 120, "version 2's rows",
                   check=run.check)
        switched = cli(env, "switch", "sensor_stats", "--force", "--retain-previous", "1s")
        assert switched.returncode == 0, switched.stderr
        wait_until(lambda: states(versions, "sensor_stats") == {1: "retired", 2: "serving"}, 60,
                   "version 1 to be retired", check=run.check)
        assert "sensor_stats" not in metadata.tables() and "sensor_stats-v2" in metadata.tables()
        # The queries start again with version 1 a ghost in the shared query, and that start deletes its changelog.
        wait_until(lambda: describe_topic(admin, v1_topic) is None, 120, "version 1's changelog to be deleted",
                   interval_s=1, check=run.check)
        produce_readings(broker, input_topic, 300, rng)
        counts_caught_up(run)
        assert describe_topic(admin, v1_topic) is None  # its rows are written nowhere: not made again
        assert recorded_tables(shared) == ["area_counts", "sensor_stats"]
        text = run.log.read_text()
        assert "a retired version shares its query with other tables: the queries start again" in text
        assert "table sensor_stats: version 1 is retired, computed in the query it shares" in text
        assert "Traceback" not in text and "QUERY_CHANGED" not in text
    finally:
        stopped(run)

    # Stopped and started again: the shared query resumes from its checkpoint, version 1 still a ghost.
    again = PipelineProcess(env, tmp_path / "pipeline-again.log")
    try:
        wait_until(lambda: "registered tables" in again.log.read_text(), 120, "the pipeline to run again",
                   check=again.check)
        produce_readings(broker, input_topic, 100, rng)
        counts_caught_up(again)
        assert describe_topic(admin, v1_topic) is None
        assert states(versions, "sensor_stats") == {1: "retired", 2: "serving"}
        assert "sensor_stats" not in metadata.tables()
        text = again.log.read_text()
        assert "table sensor_stats: version 1 is retired, computed in the query it shares" in text
        assert "Traceback" not in text and "QUERY_CHANGED" not in text
    finally:
        stopped(again)

"""Exactly-once effect in micro-batches: the pipeline is killed -9 mid-stream and restarted; the changelog equals a
recomputation (tests/integration/test_pipeline_realtime.py kills a Real-time pipeline).

Real broker, real Redis, real Spark, the pipeline as its own process (``python -m pipeline``).
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from confluent_kafka.admin import AdminClient

from freshroute.keys import partition_for
from freshroute.metadata.store import MetadataStore
from pipeline.checkpoints import committed_batches, query_checkpoint_of
from pipeline.topics import ensure_topic

from .pipeline_support import (SENSORS, PipelineProcess, materialize, mismatches, produce_readings, read_topic,
                               recompute)

pytestmark = [pytest.mark.integration, pytest.mark.beside]

CHANGELOG_PARTITIONS = 8


@pytest.mark.timeout(1500)
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
           "FRESHROUTE_PIPELINE_MODE": "microbatch",
           # Several batches for the backlog, so that the kill lands mid-stream.
           "FRESHROUTE_MAX_RECORDS_PER_BATCH": "1500"}
    started: list[PipelineProcess] = []
    try:
        # 1. First run: wait until batches landed in the changelog, then kill -9 the whole process tree.
        first = PipelineProcess(env, tmp_path / "pipeline-1.log")
        started.append(first)
        # Spark's start plus the cold first batch: seconds on an idle machine, minutes on a loaded one.
        deadline = time.monotonic() + 480
        while committed_batches(query_checkpoint_of(checkpoints, "sensor_stats")) < 1:
            assert first.alive(), f"pipeline exited early:\n{first.tail()}"
            assert time.monotonic() < deadline, f"no batch committed within 480 s:\n{first.tail()}"
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
        deadline = time.monotonic() + 480
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
        assert second.proc.wait(120) == 0, second.tail()
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

"""The pipeline's supervision without Spark: Redis registration that survives outages, failure policy."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import pytest

from freshroute.metadata import TableSpec
from freshroute.settings import load
from pipeline.job import (QUERY_TABLES_FILE, ChangelogLost, InputDataLost, Pipeline, PipelineFailed, QueryChanged, QueryRun,
                          TableRegistrar, TableRun, check_changelog_kept, check_query_tables, committed_batches,
                          log_progress, query_checkpoint_of)
from pipeline.settings import PipelineSettings
from pipeline.sink import ChangelogWriter, Written

SPEC = TableSpec("sensor_stats", "sensor_stats-changelog", 8, "sensor", {"count": "bigint"})


class FlakyStore:
    """Refuses the first ``failures`` registrations, then records them."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.registered: list[list[TableSpec]] = []
        self.calls = 0

    def register_tables(self, specs):
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        self.registered.append(list(specs))


def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_registrar_retries_while_redis_is_down_with_one_clear_line_per_outage(caplog):
    store = FlakyStore(failures=3)
    stop = threading.Event()
    caplog.set_level(logging.INFO, logger="pipeline")
    registrar = TableRegistrar(store, [SPEC], stop, "127.0.0.1:6379", "ns", every_s=0.05)
    registrar.start()
    try:
        wait_for(lambda: len(store.registered) >= 2)  # registered, then re-registered (Redis may lose it)
    finally:
        stop.set()
        registrar.join(timeout=5)
    assert not registrar.is_alive()
    assert store.registered[0] == [SPEC]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert warnings == ["Redis at 127.0.0.1:6379 is unavailable (Error 111 connecting to 127.0.0.1:6379. Connection "
                        "refused.): table specs not registered; retrying, the stream keeps running"]
    assert infos == ["registered tables sensor_stats in Redis at 127.0.0.1:6379 (namespace ns)"]


def test_registrar_stops_promptly_even_while_redis_is_down():
    stop = threading.Event()
    registrar = TableRegistrar(FlakyStore(failures=10**9), [SPEC], stop, "h:1", "ns", every_s=10)
    registrar.start()
    time.sleep(0.1)
    stop.set()
    registrar.join(timeout=3)
    assert not registrar.is_alive()


@pytest.fixture
def pipeline() -> Pipeline:
    return Pipeline(load(PipelineSettings, redis_url="redis://127.0.0.1:1/0"))


def table_run(p: Pipeline, name: str = "sensor_stats") -> TableRun:
    t = p.definition.tables[name]
    return TableRun(t, SPEC, ChangelogWriter(t.name, SPEC.topic, 8, t.key, p.producer))


def run_of(p: Pipeline, *tables: str, name: str = "sensor_stats") -> QueryRun:
    return QueryRun(name, [table_run(p, t) for t in tables or (name,)], 500)


def test_lost_input_data_stops_the_pipeline_with_the_sources_message(pipeline):
    error = ("[STREAM_FAILED] Query [id = 1] terminated with exception: [KAFKA_DATA_LOSS.PARTITION_OFFSET_CHANGED] "
             "Some data may have been lost because they are not available in Kafka any more; Partition readings-1's "
             "offset was changed from 40 to 3.\n\tat org.apache.spark.sql.kafka010...\n")
    with pytest.raises(InputDataLost, match=r"^table sensor_stats: Some data may have been lost .* changed from 40 to "
                                            r"3\. To reprocess .* delete .*sensor_stats\.$") as e:
        pipeline._restart_or_fail(run_of(pipeline), error, threading.Event())
    assert e.value.code == "INPUT_DATA_LOST" and e.value.details["query"] == "sensor_stats"


def test_a_changed_aggregation_stops_the_pipeline_at_once_naming_the_checkpoint(pipeline):
    error = ("[STREAM_FAILED] Query [id = 1] terminated with exception: [STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE] "
             "Provided value schema does not match existing state value schema.\n\tat org.apache.spark...\n")
    run = run_of(pipeline)
    with pytest.raises(QueryChanged, match=r"^table sensor_stats: its checkpoint .*sensor_stats holds the state of an "
                                           r"earlier definition .*STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE.*Delete ") as e:
        pipeline._restart_or_fail(run, error, threading.Event())
    assert e.value.code == "QUERY_CHANGED" and run.failures == []  # no restart tried


def test_a_query_failing_again_and_again_stops_the_pipeline(pipeline):
    run = run_of(pipeline)
    run.failures = [time.monotonic()] * 8
    with pytest.raises(PipelineFailed, match=r"table sensor_stats: query failed 9 times .* last error: boom"):
        pipeline._restart_or_fail(run, "boom\n  at somewhere", threading.Event())


def test_a_failed_query_is_not_restarted_once_stopping(pipeline):
    run = run_of(pipeline)
    stop = threading.Event()
    stop.set()
    pipeline._restart_or_fail(run, "Python worker failed to connect back.", stop)
    assert run.query is None and len(run.failures) == 1


def test_a_vanished_changelog_with_committed_batches_is_refused(tmp_path):
    checkpoint = tmp_path / "sensor_stats"
    check_changelog_kept("t-changelog", existed=False, checkpoint=checkpoint)  # first start: nothing to lose
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / ".0.crc").write_text("")
    check_changelog_kept("t-changelog", existed=False, checkpoint=checkpoint)
    for i in range(3):
        (checkpoint / "commits" / str(i)).write_text("v1")
    assert committed_batches(checkpoint) == 3
    check_changelog_kept("t-changelog", existed=True, checkpoint=checkpoint)
    with pytest.raises(ChangelogLost, match=rf"changelog topic t-changelog does not exist, but the checkpoint "
                                            rf"{checkpoint} records 3 batch\(es\).*Delete {checkpoint}"):
        check_changelog_kept("t-changelog", existed=False, checkpoint=checkpoint)


def test_progress_line_says_where_the_batch_time_went(pipeline, caplog):
    run = run_of(pipeline)
    writer = run.tables[0].writer
    writer.written[12] = Written(90, 410.4, 22.6)
    writer.written[13] = Written(70, 300.0, 10.0)  # the next batch ran before Spark reported this one
    progress = SimpleNamespace(name="sensor_stats", batchId=12, numInputRows=80, batchDuration=560,
                               durationMs={"latestOffset": 8, "walCommit": 30, "getBatch": 0, "queryPlanning": 40,
                                           "addBatch": 450, "commitOffsets": 25, "triggerExecution": 560},
                               inputRowsPerSecond=50.0, processedRowsPerSecond=142.0)
    caplog.set_level(logging.INFO, logger="pipeline")
    log_progress(run, progress)
    assert caplog.records[-1].getMessage() == (
        "table sensor_stats batch 12: 80 input rows, 90 changelog records in 560 ms (offsets 8 ms, offset log 30 ms, "
        "planning 40 ms, run 450 ms (collect 410 ms, produce 23 ms), commit log 25 ms; input 50 rows/s, "
        "processed 142 rows/s)")


def test_a_shared_querys_progress_line_names_its_tables_and_what_each_wrote(pipeline, caplog):
    run = run_of(pipeline, "area_counts", "sensor_stats", name="readings")
    run.tables[0].writer.written[4] = Written(3, 120.0, 8.0, deletes=1)
    run.tables[1].writer.written[4] = Written(20, 120.0, 8.0)
    caplog.set_level(logging.INFO, logger="pipeline")
    log_progress(run, SimpleNamespace(name="readings", batchId=4, numInputRows=25, batchDuration=200,
                                      durationMs={"addBatch": 150}, inputRowsPerSecond=50.0,
                                      processedRowsPerSecond=125.0))
    assert caplog.records[-1].getMessage() == (
        "query readings (area_counts, sensor_stats) batch 4: 25 input rows, changelog records area_counts 3 "
        "(1 deletes), sensor_stats 20 in 200 ms (run 150 ms (collect 120 ms, produce 8 ms); input 50 rows/s, "
        "processed 125 rows/s)")


def test_a_querys_checkpoint_is_resumed_only_with_the_tables_it_was_written_for(tmp_path):
    checkpoint = tmp_path / "readings"
    check_query_tables(checkpoint, "readings", ["area_counts", "sensor_stats"])  # first start: recorded
    assert (checkpoint / QUERY_TABLES_FILE).read_text() == '{"tables":["area_counts","sensor_stats"]}'
    (checkpoint / "commits").mkdir()
    (checkpoint / "commits" / "0").write_text("v1")
    check_query_tables(checkpoint, "readings", ["area_counts", "sensor_stats"])
    with pytest.raises(QueryChanged, match=r"query 'readings': its checkpoint .*readings was written for tables "
                                           r"\['area_counts', 'sensor_stats'\], and the tables file now puts "
                                           r"\['area_counts', 'sensor_stats', 'sensor_windows'\] in it\. Delete"):
        check_query_tables(checkpoint, "readings", ["area_counts", "sensor_stats", "sensor_windows"])
    (checkpoint / QUERY_TABLES_FILE).write_text("{not json")
    with pytest.raises(QueryChanged, match=r"with an unreadable freshroute-tables\.json"):
        check_query_tables(checkpoint, "readings", ["area_counts", "sensor_stats"])


def test_a_tables_checkpoint_is_found_through_its_querys_record(tmp_path):
    check_query_tables(tmp_path / "readings", "readings", ["area_counts", "sensor_stats"])
    assert query_checkpoint_of(tmp_path, "sensor_stats") == tmp_path / "readings"
    assert query_checkpoint_of(tmp_path, "other") == tmp_path / "other"


def test_a_checkpoint_from_before_shared_queries_is_its_one_tables_own(tmp_path):
    checkpoint = tmp_path / "sensor_stats"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text("v1")
    check_query_tables(checkpoint, "sensor_stats", ["sensor_stats"])
    assert (checkpoint / QUERY_TABLES_FILE).is_file()
    legacy = tmp_path / "area_counts"
    (legacy / "commits").mkdir(parents=True)
    (legacy / "commits" / "0").write_text("v1")
    with pytest.raises(QueryChanged, match=r"written for tables \['area_counts'\]"):
        check_query_tables(legacy, "area_counts", ["area_counts", "sensor_stats"])


def test_progress_is_logged_once_per_batch_read(pipeline, caplog):
    run = run_of(pipeline)
    caplog.set_level(logging.INFO, logger="pipeline")
    for batch in (3, 3, 5, 4, None):  # the loop reads the same report again, skips one, then an older one
        log_progress(run, None if batch is None else SimpleNamespace(
            name="sensor_stats", batchId=batch, numInputRows=1, batchDuration=10, durationMs={},
            inputRowsPerSecond=None, processedRowsPerSecond=None))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["table sensor_stats batch 3",
                                                                      "table sensor_stats batch 5"]
    assert run.logged_batch == 5


def test_the_pipeline_says_warm_once_every_querys_recent_batches_ran_quick_in_the_median(pipeline, caplog):
    from pipeline.job import WARM_BATCHES, WARM_LOG

    stats, counts = run_of(pipeline), run_of(pipeline, name="area_counts")
    pipeline.queries = {"sensor_stats": stats, "area_counts": counts}
    caplog.set_level(logging.INFO, logger="pipeline")

    def warm_lines() -> int:
        return sum(WARM_LOG in r.getMessage() for r in caplog.records)

    # Slow batches (JIT still compiling): the median of the last ones is over the bound.
    for ms in [2400, 2000, 1900, 300, 900]:
        pipeline._note_warmth(stats, ms)
    for _ in range(WARM_BATCHES):
        pipeline._note_warmth(counts, 350)
    assert warm_lines() == 0  # one query warm is not the pipeline warm
    pipeline._note_warmth(stats, 400)
    assert warm_lines() == 0  # 2000, 1900, 300, 900, 400: median 900
    pipeline._note_warmth(stats, 500)  # the trigger interval itself still counts
    assert warm_lines() == 1  # 1900, 300, 900, 400, 500: median 500, and counts' are quick: warm, one slow batch or not
    pipeline._note_warmth(stats, 5000)
    pipeline._note_warmth(stats, 100)
    assert warm_lines() == 1  # said once, whatever comes after


def test_a_shape_realtime_mode_refuses_stops_the_pipeline_naming_the_table_and_sparks_reason(pipeline):
    from pipeline.realtime import RealtimeRefused

    error = ("[STREAM_FAILED] Query [id = 1] terminated with exception: [STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_"
             "IN_ALLOWLIST] Streaming real-time mode has the following limitation: The operator(s): "
             "org.apache.spark.sql.execution.python.ArrowEvalPythonExec is not in the operator allowlist.\n\tat x\n")
    run = run_of(pipeline)
    with pytest.raises(RealtimeRefused, match=r"^table 'sensor_stats' cannot run in Real-time Mode \(Spark: "
                                              r"STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_IN_ALLOWLIST: .*"
                                              r"ArrowEvalPythonExec.*pipeline_mode='microbatch'") as e:
        pipeline._restart_or_fail(run, error, threading.Event())
    assert e.value.code == "REALTIME_REFUSED" and run.failures == []
    v1 = "[STREAMING_REAL_TIME_MODE.CHECKPOINT_FORMAT_V1_NOT_SUPPORTED] cannot start on a v1 checkpoint\n"
    with pytest.raises(QueryChanged, match=r"written by micro-batches, and Real-time Mode cannot resume from it"):
        pipeline._restart_or_fail(run, v1, threading.Event())


@pytest.mark.parametrize("master, slots, want", [
    ("local[*]", 22, "local[22]"), ("local[32]", 22, "local[32]"), ("spark://h:7077", 22, "spark://h:7077")])
def test_a_local_master_is_sized_to_the_realtime_queries_task_slots(master, slots, want):
    from pipeline.job import local_master

    assert local_master(master, slots) == want


def test_a_local_master_too_small_for_the_realtime_queries_is_refused():
    from pipeline.job import NotEnoughSlots, local_master

    with pytest.raises(NotEnoughSlots, match=r"spark_master local\[4\] runs 4 task\(s\) at once, and the Real-time "
                                             r"queries hold 22 .*local\[22\]"):
        local_master("local[4]", 22)


def test_realtime_queries_are_warm_once_every_task_runs_and_each_table_has_caught_up_since_they_started():
    from freshroute.freshness import InputLag
    from pipeline.job import realtime_warm

    stage = SimpleNamespace(numActiveTasks=6)
    tracker = SimpleNamespace(getActiveStageIds=lambda: [1], getStageInfo=lambda _id: stage)
    spark = SimpleNamespace(sparkContext=SimpleNamespace(statusTracker=lambda: tracker))
    queries = [SimpleNamespace(query=SimpleNamespace(isActive=True),
                               tables=[SimpleNamespace(table=SimpleNamespace(name=n))]) for n in ("a", "b")]
    started = 1_000
    # Each table at its input's end at some moment since the start, never both at once: warm.
    lags = {"a": InputLag(3, 1_500, 2_000), "b": InputLag(2, 1_800, 2_000)}
    assert realtime_warm(spark, queries, lags, 6, started)
    assert not realtime_warm(spark, queries, lags, 7, started)  # a task not running yet
    lags["b"] = InputLag(4_000, started, 2_000)  # never caught up since the start
    assert not realtime_warm(spark, queries, lags, 6, started)
    del lags["b"]  # nothing heard of it yet
    assert not realtime_warm(spark, queries, lags, 6, started)


@pytest.mark.parametrize("spark_jit, realtime, microbatches, options", [
    ("auto", False, True, " -XX:TieredStopAtLevel=1"),  # micro-batches only: compiling well never pays back
    ("auto", True, True, ""),
    ("auto", True, False, ""),
    ("tiered", False, True, ""),
    ("client", True, False, " -XX:TieredStopAtLevel=1"),
])
def test_the_spark_jit_setting_picks_the_jvms_compilers(spark_jit, realtime, microbatches, options):
    from pipeline.job import jit_options

    assert jit_options(spark_jit, realtime=realtime, microbatches=microbatches) == options

"""The pipeline's supervision without Spark: Redis registration that survives outages, failure policy, progress lines
and when the pipeline is warm."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import pytest

from freshroute.metadata.tables import TableSpec
from freshroute.settings import load
from pipeline.checkpoints import QueryChanged
from pipeline.failures import InputDataLost, PipelineFailed
from pipeline.job import Pipeline
from pipeline.logs import WARM_LOG, log_progress
from pipeline.microbatch_query import WARM_BATCHES, MicrobatchQuery
from pipeline.outputs import TableRun
from pipeline.realtime_query import RealtimeQuery
from pipeline.registrar import TableRegistrar
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


def test_registrar_gives_each_table_a_version_record_and_says_once_when_its_definition_changed(caplog):
    from freshroute.metadata.store import MetadataStore
    from freshroute.metadata.version_store import TableVersionStore
    from tests.unit.memory_redis import MemoryRedis

    redis = MemoryRedis()
    store, versions = MetadataStore(redis.sync, "ns"), TableVersionStore(redis.sync, "ns")

    def registered(fingerprint: str, recomputed: bool = False) -> None:
        stop = threading.Event()
        registrar = TableRegistrar(store, [SPEC], stop, "h:1", "ns", every_s=0.02, versions=versions,
                                   fingerprints={"sensor_stats": fingerprint},
                                   recomputed={"sensor_stats"} if recomputed else set(),
                                   definition=f"file-of-{fingerprint}")
        registrar.start()
        try:
            wait_for(lambda: versions.record("sensor_stats") is not None)
            time.sleep(0.1)  # a few rounds more
        finally:
            stop.set()
            registrar.join(timeout=5)

    registered("fp1")
    first = versions.record("sensor_stats")
    assert first.serving == 1 and first.versions[1].fingerprint == "fp1"
    assert first.versions[1].definition == "file-of-fp1"  # the tables file it was defined in, kept by the pipeline
    caplog.set_level(logging.WARNING, logger="pipeline")
    registered("fp2")  # the pipeline restarted with another definition of the table
    assert versions.record("sensor_stats") == first  # what is served is still what version 1 computed
    changed = [r.getMessage() for r in caplog.records if "definition changed" in r.getMessage()]
    assert changed == ["table sensor_stats: its definition changed since version 1 was built (fingerprint fp1, now "
                       "fp2): its query goes on from the state of the old one, so its rows mix both definitions until "
                       "it is recomputed (delete its checkpoint)"]
    registered("fp2", recomputed=True)  # its checkpoint deleted: the table is computed afresh by the new definition
    assert versions.record("sensor_stats").versions[1].fingerprint == "fp2"
    assert versions.record("sensor_stats").versions[1].definition == "file-of-fp2"
    registered("fp2")
    assert len([r for r in caplog.records if "definition changed" in r.getMessage()]) == 1


def test_registrar_keeps_the_records_on_disk_and_gives_them_back_to_a_redis_that_lost_them(tmp_path, caplog):
    from freshroute.metadata.store import MetadataStore
    from freshroute.metadata.table_versions import VersionedTable
    from freshroute.metadata.version_store import TableVersionStore
    from pipeline.version_mirror import MIRROR, saved
    from tests.unit.memory_redis import MemoryRedis

    redis = MemoryRedis()
    store, versions = MetadataStore(redis.sync, "ns"), TableVersionStore(redis.sync, "ns")
    switched = VersionedTable.first("sensor_stats", "fp1", 1_000, "f1").begun("fp2", 2_000, "f2")[0]
    switched = switched.switched(2, 3_000, 3_600_000)  # version 2 served, version 1 kept for a rollback
    versions.restore(switched)

    def registered(until) -> None:
        stop = threading.Event()
        registrar = TableRegistrar(store, [SPEC], stop, "h:1", "ns", every_s=0.02, versions=versions,
                                   fingerprints={"sensor_stats": "fp2"}, definition="f2", mirror=tmp_path)
        registrar.start()
        try:
            wait_for(until)
        finally:
            stop.set()
            registrar.join(timeout=5)

    registered(lambda: (tmp_path / MIRROR).is_file())
    assert saved(tmp_path) == {"sensor_stats": switched}
    redis.sync.flushall()  # Redis restarted without its data
    caplog.set_level(logging.WARNING, logger="pipeline")
    registered(lambda: versions.record("sensor_stats") is not None)
    assert versions.record("sensor_stats") == switched  # not a first version made anew: version 2 is still served
    assert f"table sensor_stats: Redis had lost its version record; restored as the pipeline kept it in " \
           f"{tmp_path / MIRROR} (version 2 served)" in caplog.messages


def test_the_pipeline_fingerprints_each_table_of_its_tables_file(pipeline):
    from pipeline.versions import Planner

    def unused(*args):
        raise AssertionError(f"no version is begun or failed for tables without records: {args}")

    plan = Planner(lambda t: "realtime", lambda physical: True, unused, unused, unused).plan(pipeline.definition, {})
    prints = plan.fingerprints
    assert set(prints) == set(pipeline.definition.tables)
    assert all(len(fp) == 16 for fp in prints.values()) and len(set(prints.values())) == len(prints)


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


def run_of(p: Pipeline, *tables: str, name: str = "sensor_stats") -> MicrobatchQuery:
    q = MicrobatchQuery(p.context, name, [p.definition.tables[t] for t in tables or (name,)])
    q.runs = [table_run(p, t) for t in tables or (name,)]
    return q


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


def test_progress_line_says_where_the_batch_time_went(pipeline, caplog):
    run = run_of(pipeline)
    writer = run.runs[0].writer
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
    run.runs[0].writer.written[4] = Written(3, 120.0, 8.0, deletes=1)
    run.runs[1].writer.written[4] = Written(20, 120.0, 8.0)
    caplog.set_level(logging.INFO, logger="pipeline")
    log_progress(run, SimpleNamespace(name="readings", batchId=4, numInputRows=25, batchDuration=200,
                                      durationMs={"addBatch": 150}, inputRowsPerSecond=50.0,
                                      processedRowsPerSecond=125.0))
    assert caplog.records[-1].getMessage() == (
        "query readings (area_counts, sensor_stats) batch 4: 25 input rows, changelog records area_counts 3 "
        "(1 deletes), sensor_stats 20 in 200 ms (run 150 ms (collect 120 ms, produce 8 ms); input 50 rows/s, "
        "processed 125 rows/s)")


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
    stats, counts = run_of(pipeline), run_of(pipeline, name="area_counts")
    pipeline.queries = {"sensor_stats": stats, "area_counts": counts}
    pipeline.context.microbatches = True
    caplog.set_level(logging.INFO, logger="pipeline")

    def batches(q: MicrobatchQuery, *ms: int) -> None:
        for m in ms:
            q.batch_ended(SimpleNamespace(batchDuration=m, sources=[]))
            pipeline._note_warmth()

    def warm_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if WARM_LOG in r.getMessage()]

    # Slow batches (JIT still compiling): the median of the last ones is over the bound.
    batches(stats, 2400, 2000, 1900, 300, 900)
    batches(counts, *[350] * WARM_BATCHES)
    assert warm_lines() == []  # one query warm is not the pipeline warm
    batches(stats, 400)
    assert warm_lines() == []  # 2000, 1900, 300, 900, 400: median 900
    batches(stats, 500)  # the trigger interval itself still counts
    # 1900, 300, 900, 400, 500: median 500, and counts' are quick: warm, one slow batch or not
    assert warm_lines() == [f"{WARM_LOG}: the median of the last 5 micro-batches of every query ran within its trigger "
                            f"interval (at least 500 ms)"]
    assert stats.runs[0].last_progress.batchDuration == 500  # each batch's report is its tables' latest
    batches(stats, 5000, 100)
    assert len(warm_lines()) == 1  # said once, whatever comes after


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
    # A source's tables in one query: Spark names the operator, the error every table the query computes.
    shared = run_of(pipeline, "area_counts", "sensor_stats", name="readings.tables")
    with pytest.raises(RealtimeRefused, match=r"^query readings.tables \(area_counts, sensor_stats\) cannot run in "
                                              r"Real-time Mode \(Spark: STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_"
                                              r"IN_ALLOWLIST: .*ArrowEvalPythonExec.*\)\. Give the table whose shape "
                                              r"Spark refuses pipeline_mode='microbatch'") as e:
        pipeline._restart_or_fail(shared, error, threading.Event())
    assert e.value.details == {"query": "readings.tables", "tables": ["area_counts", "sensor_stats"]}
    v1 = "[STREAMING_REAL_TIME_MODE.CHECKPOINT_FORMAT_V1_NOT_SUPPORTED] cannot start on a v1 checkpoint\n"
    with pytest.raises(QueryChanged, match=r"written by micro-batches, and Real-time Mode cannot resume from it"):
        pipeline._restart_or_fail(run, v1, threading.Event())


def test_realtime_queries_are_warm_once_every_task_runs_and_each_table_has_caught_up_since_they_started(pipeline,
                                                                                                        caplog):
    from freshroute.metadata.progress import InputLag

    c = pipeline.context
    stage = SimpleNamespace(numActiveTasks=6)
    tracker = SimpleNamespace(getActiveStageIds=lambda: [1], getStageInfo=lambda _id: stage)
    c.spark = SimpleNamespace(sparkContext=SimpleNamespace(statusTracker=lambda: tracker))
    c.input_lag = SimpleNamespace(latest={}, started_ms=1_000)
    c.slots = 6
    queries = {n: RealtimeQuery(c, n, [pipeline.definition.tables[n]]) for n in ("area_counts", "sensor_stats")}
    for q in queries.values():
        q.query = SimpleNamespace(isActive=True)

    def warm() -> bool:
        return all(q.warm() for q in queries.values())

    # Each table at its input's end at some moment since the start, never both at once: warm.
    lags = c.input_lag.latest
    lags.update(area_counts=InputLag(3, 1_500, 2_000), sensor_stats=InputLag(2, 1_800, 2_000))
    assert warm()
    c.slots = 7
    assert not warm()  # a task not running yet
    c.slots = 6
    lags["sensor_stats"] = InputLag(4_000, 1_000, 2_000)  # never caught up since the start
    assert not warm()
    del lags["sensor_stats"]  # nothing heard of it yet
    assert not warm()
    queries["area_counts"].query = SimpleNamespace(isActive=False)
    lags["sensor_stats"] = InputLag(2, 1_800, 2_000)
    assert not warm()  # a query stopped
    queries["area_counts"].query = SimpleNamespace(isActive=True)
    caplog.set_level(logging.INFO, logger="pipeline")
    pipeline.queries = dict(queries)
    pipeline._note_warmth()
    assert [r.getMessage() for r in caplog.records] == [
        f"{WARM_LOG}: every Real-time query's tasks are running, and every table has caught up with its input"]


def test_beside_micro_batches_the_pipeline_is_warm_when_they_are(pipeline):
    c = pipeline.context
    c.microbatches = True
    realtime = RealtimeQuery(c, "sensor_stats", [pipeline.definition.tables["sensor_stats"]])
    batched = run_of(pipeline, name="area_counts")
    pipeline.queries = {"sensor_stats": realtime, "area_counts": batched}
    assert realtime.warm() and not batched.warm()  # the session's task count says nothing of Real-time tasks here
    for _ in range(WARM_BATCHES):
        batched.batch_ended(SimpleNamespace(batchDuration=100, sources=[]))
    pipeline._note_warmth()
    assert pipeline._warm


def test_a_realtime_checkpoint_says_how_long_it_stopped_processing_and_a_micro_batch_nothing(pipeline, caplog):
    c = pipeline.context
    realtime = RealtimeQuery(c, "sensor_stats", [pipeline.definition.tables["sensor_stats"]])
    interval = c.settings.realtime_checkpoint_ms
    report = SimpleNamespace(batchId=3, batchDuration=interval + 640, numInputRows=10, durationMs={},
                             inputRowsPerSecond=1.0, processedRowsPerSecond=1.0, sources=[])
    assert realtime.pause_ms(report) == 640
    assert realtime.pause_ms(SimpleNamespace(batchDuration=interval - 5)) == 0  # stopped early: no pause beyond it
    caplog.set_level(logging.INFO, logger="pipeline")
    assert log_progress(realtime, report)
    assert caplog.records[-1].getMessage().endswith("; processing stopped 640 ms")
    batched = run_of(pipeline, name="area_counts")
    assert batched.pause_ms(report) is None


def test_a_failing_query_of_a_version_beside_fails_that_version_and_any_other_query_stops_the_pipeline(pipeline):
    from dataclasses import replace

    from freshroute.metadata.table_versions import VersionState
    from pipeline.versions import PlannedVersion, VersionPlan

    failed = []
    pipeline._versions = SimpleNamespace(fail=lambda table, version, why: failed.append((table, version, why)))
    t = replace(pipeline.definition.tables["sensor_stats"], name="sensor_stats-v2", query="sensor_stats-v2")
    pipeline.plan = VersionPlan(pipeline.definition, {"sensor_stats-v2": PlannedVersion("sensor_stats", 2,
                                                                                         VersionState.BUILDING)})
    pipeline.context.beside = pipeline.plan.beside
    beside = MicrobatchQuery(pipeline.context, "sensor_stats-v2", [t])
    pipeline.queries = {"sensor_stats-v2": beside}

    def refused():
        raise RuntimeError("[UNRESOLVED_COLUMN] top")

    assert pipeline._beside_or_fail(beside, refused) is False
    assert failed == [("sensor_stats", 2, f"tables file {pipeline.settings.tables_file}, table sensor_stats-v2: "
                                          f"[UNRESOLVED_COLUMN] top")]
    assert pipeline.queries == {}  # dropped; the pipeline goes on
    served = run_of(pipeline)
    with pytest.raises(RuntimeError):
        pipeline._beside_or_fail(served, refused)
    rejects = RealtimeQuery.__new__(RealtimeQuery)
    rejects.tables = []  # a source's rejected records: no table, never a version's
    with pytest.raises(RuntimeError):
        pipeline._beside_or_fail(rejects, refused)


def test_the_specs_of_versions_held_as_they_stand_are_registered_as_redis_has_them(pipeline, caplog):
    from freshroute.metadata.table_versions import VersionState
    from pipeline.versions import PlannedVersion, VersionPlan

    held = {n: PlannedVersion(n, 1, VersionState.SERVING) for n in ("sensor_stats", "lost")}
    pipeline.plan = VersionPlan(pipeline.definition, held=held)
    other = TableSpec("other", "other-changelog", 8, "k", {"n": "bigint"})
    store = SimpleNamespace(tables=lambda: {"sensor_stats": SPEC, "other": other})
    assert pipeline._held_specs(store) == [SPEC]
    assert caplog.messages == ["tables lost: held as they stand, but Redis has lost their specs: not served until the "
                               "versions built beside them are switched to"]

    def away():
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    assert pipeline._held_specs(SimpleNamespace(tables=away)) == []
    pipeline.plan = VersionPlan(pipeline.definition)
    assert pipeline._held_specs(SimpleNamespace(tables=away)) == []  # nothing held: Redis not even asked


def test_registrar_keeps_how_the_tables_file_defines_each_table_for_the_next_start():
    from freshroute.metadata.store import MetadataStore
    from freshroute.metadata.version_store import TableVersionStore
    from tests.unit.memory_redis import MemoryRedis

    redis = MemoryRedis()
    store, versions = MetadataStore(redis.sync, "ns"), TableVersionStore(redis.sync, "ns")
    stop = threading.Event()
    registrar = TableRegistrar(store, [SPEC], stop, "h:1", "ns", every_s=0.02, versions=versions,
                               fingerprints={"sensor_stats": "fp1"}, proposed={"sensor_stats": "fp2"})
    registrar.start()
    try:
        wait_for(lambda: (r := versions.record("sensor_stats")) is not None and r.proposed == "fp2")
    finally:
        stop.set()
        registrar.join(timeout=5)
    record = versions.record("sensor_stats")
    assert record.versions[1].fingerprint == "fp1" and record.proposal() == "fp2"


def test_a_deploy_asked_for_ends_the_wait_for_a_start_with_it(pipeline):
    due = threading.Event()
    pipeline._watcher = SimpleNamespace(due=due)
    stop = threading.Event()
    due.set()
    assert pipeline.wait(stop) is True
    due.clear()
    stop.set()
    assert pipeline.wait(stop) is False


def test_a_retirement_leaving_a_version_in_its_shared_query_ends_the_wait_for_a_start_without_it(pipeline, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    pipeline.restart.set()
    assert pipeline.wait(threading.Event()) is True
    assert caplog.messages == ["a retired version shares its query with other tables: the queries start again, "
                               "computing it there for the query's state only"]


def test_a_ghost_has_no_input_lag_no_reflected_mark_no_read_back_and_warmth_does_not_wait_for_it(pipeline):
    from freshroute.metadata.progress import InputLag

    c = pipeline.context
    c.ghosts = frozenset({"sensor_stats"})
    marked, reached, running = [], [], []
    c.reflected = SimpleNamespace(batches_ended=lambda runs, offsets: marked.extend(r.table.name for r in runs))
    c.input_lag = SimpleNamespace(latest={"area_counts": InputLag(3, 1_500, 2_000)}, started_ms=1_000,
                                  running=lambda names: running.extend(names))
    c.follower = SimpleNamespace(reached=lambda table, offsets: reached.append(table))
    c.spark = SimpleNamespace(sparkContext=SimpleNamespace(statusTracker=lambda: SimpleNamespace(
        getActiveStageIds=lambda: [1], getStageInfo=lambda _id: SimpleNamespace(numActiveTasks=2))))
    c.slots = 2
    tables = [pipeline.definition.tables[n] for n in ("area_counts", "sensor_stats")]
    q = RealtimeQuery(c, "readings.tables", tables)
    q.runs = [table_run(pipeline, "area_counts"), TableRun(tables[1], SPEC, table_run(pipeline).writer, ghost=True)]
    q.query = SimpleNamespace(isActive=True, lastProgress=None)
    offsets = '{"readings": {"0": 5}}'
    q.batch_ended(SimpleNamespace(batchDuration=100, sources=[SimpleNamespace(endOffset=offsets)]))
    assert marked == ["area_counts"] and reached == ["area_counts"]
    assert [r.table.name for r in q.runs_read_back()] == ["area_counts"]
    assert q.warm()  # sensor_stats never gets an input lag: it is not waited for
    pipeline.queries = {q.name: q}
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert pipeline.wait(stop) is False
    assert set(running) == {"area_counts"}


def test_a_ghosts_checkpoint_is_the_shared_query_that_records_it_among_others_and_has_state(tmp_path, monkeypatch):
    import orjson

    from pipeline import job
    from pipeline.checkpoints import QUERY_TABLES_FILE

    pipeline = Pipeline(load(PipelineSettings, redis_url="redis://127.0.0.1:1/0", checkpoint_dir=str(tmp_path)))
    given = {}
    monkeypatch.setattr(job, "Planner", lambda *args: given.setdefault("shared", args[-1]) and SimpleNamespace(
        plan=lambda *a: None))
    pipeline._plan(SimpleNamespace(records=lambda: {}, fail=None), "digest")
    shared = given["shared"]
    query = pipeline.settings.query_checkpoint("readings.tables")
    assert shared("sensor_stats") is None  # no checkpoint yet: the query starts without it
    query.mkdir(parents=True)
    (query / QUERY_TABLES_FILE).write_bytes(orjson.dumps({"tables": ["area_counts", "sensor_stats"]}))
    assert shared("sensor_stats") is None  # nothing to resume: the query starts afresh without it
    (query / "commits").mkdir()
    (query / "commits" / "0").write_text("v1")
    assert shared("sensor_stats") == query and shared("area_counts") == query
    assert shared("sensor_stats-v2") is None  # a query of its own


def test_registrar_leaves_the_fingerprint_of_a_version_switched_to_since_the_start_as_it_was_begun():
    from freshroute.metadata.store import MetadataStore
    from freshroute.metadata.table_versions import VersionedTable
    from freshroute.metadata.version_store import TableVersionStore
    from tests.unit.memory_redis import MemoryRedis

    redis = MemoryRedis()
    store, versions = MetadataStore(redis.sync, "ns"), TableVersionStore(redis.sync, "ns")
    # Started serving version 1 (fp1) with version 2 (fp2) built beside from the input; then switched to by hand.
    versions.restore(VersionedTable.first("sensor_stats", "fp1", 1_000).begun("fp2", 2_000)[0].switched(2, 3_000,
                                                                                                        60_000))
    stop = threading.Event()
    registrar = TableRegistrar(store, [SPEC], stop, "h:1", "ns", every_s=0.02, versions=versions,
                               fingerprints={"sensor_stats": "fp1"}, recomputed={"sensor_stats-v2"},
                               serving={"sensor_stats": 1})
    registrar.start()
    try:
        time.sleep(0.2)  # a few rounds
    finally:
        stop.set()
        registrar.join(timeout=5)
    assert versions.record("sensor_stats").versions[2].fingerprint == "fp2"

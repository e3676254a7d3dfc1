"""The pipeline process: one Spark session, one streaming query per table, one changelog producer.

Each table runs as its own query with its own checkpoint (``checkpoint_dir/<table>``):
offsets, commits and RocksDB state. A query that fails is restarted from its checkpoint
(which replays the failed batch) a bounded number of times; lost input data is not
retried, it stops the pipeline with a message saying what happened.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from freshroute.errors import ConfigError, FatalError, FreshrouteError
from freshroute.metadata import MetadataStore, TableSpec
from freshroute.settings import is_loopback
from pipeline.input_lag import InputLagPublisher
from pipeline.offsets import InputDataLost
from pipeline.settings import PipelineSettings
from pipeline.sink import ChangelogProducer, ChangelogWriter
from pipeline.tables import (DELETE_COLUMN, METADATA_COLUMNS, WINDOW_START_COLUMN, Source, Table, TablesDefinition,
                             TablesFileError, check_output_columns, check_source_fields, load_tables)
from pipeline.window_expiry import WindowExpiry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("pipeline")

_LOG4J2 = Path(__file__).resolve().parent / "log4j2.properties"
# Restarts of one table's query tolerated within the window before the pipeline gives up. Generous:
# on a loaded machine Spark's Python source worker may miss its fixed 10 s start-up deadline.
_MAX_RESTARTS = 8
_RESTART_WINDOW_S = 600.0
_REGISTER_EVERY_S = 10.0
# The last micro-batches of every table, whose median ran within the trigger interval (at least
# WARM_BATCH_MS): the JIT has compiled the hot paths and the Python workers are up. Until then
# a batch takes seconds, and freshness with it; the line is what `local up` waits for. A median,
# not every batch: with several tables' queries sharing two cores, one batch in a few runs long
# on a warm pipeline too.
WARM_BATCHES = 5
WARM_BATCH_MS = 500
WARM_LOG = "pipeline warm"


class PipelineFailed(FatalError):
    """A table's query kept failing; the last error says why."""

    code = "PIPELINE_FAILED"


class ChangelogLost(FatalError):
    """A table's changelog topic is gone while its checkpoint says batches were written to it."""

    code = "CHANGELOG_LOST"


def committed_batches(checkpoint: Path) -> int:
    """Micro-batches a query's checkpoint records as done (Spark's ``commits`` log)."""
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0


def check_changelog_kept(topic: str, existed: bool, checkpoint: Path) -> None:
    """Refuse to resume a table whose changelog vanished (e.g. a memory-only broker restarted).

    The query would carry on from its checkpoint and write only the keys that change from
    now on, so a restored replica would silently miss every other key.
    """
    done = committed_batches(checkpoint)
    if not existed and done:
        raise ChangelogLost(f"changelog topic {topic} does not exist, but the checkpoint {checkpoint} records {done} "
                            f"batch(es) written to it: the broker lost it (a memory-only broker restarted?). Delete "
                            f"{checkpoint} to recompute the table from its input.", topic=topic,
                            checkpoint=str(checkpoint))


def build_session(settings: PipelineSettings) -> "SparkSession":
    """A local Spark session tuned for small, frequent micro-batches over RocksDB state."""
    # Spark's Python workers must run this interpreter (and see this environment's packages).
    # Through a wrapper that keeps Spark's bundled pyspark.zip off their path (see the script).
    local = settings.spark_master.startswith("local")
    os.environ["FRESHROUTE_WORKER_PYTHON"] = sys.executable
    # On a cluster the workers' own Python: nothing of this host's file system reaches them.
    os.environ["PYSPARK_PYTHON"] = (str(Path(__file__).with_name("python_worker.sh")) if local
                                    else settings.spark_worker_python or sys.executable)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if local or is_loopback(urlsplit(settings.spark_master.split(",")[0]).hostname or ""):
        # A session whose cluster is on this host talks to it on loopback only.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(settings.spark_master)
        .appName(f"freshroute-pipeline-{settings.namespace}")
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_LOG4J2}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        # Counting state rows costs a read before every write; only a metric depends on it.
        .config("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
        # Aggregations without watermarks gain nothing from empty batches; each costs ~1 s.
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        # Without Hadoop's native library, the default checkpoint file manager (FileContext) runs
        # `readlink` for every rename: FileSystem renames need none, and a local rename is atomic
        # either way. The file system stays Hadoop's checksummed LocalFileSystem: RocksDB's
        # snapshot upload needs exactly that class (FileSystem.getLocal), and with the raw one
        # every upload failed, so state changelog files piled up and a restart replayed them all.
        .config("spark.sql.streaming.checkpointFileManagerClass",
                "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager")
        # Streaming disables adaptive execution anyway; saying so up front saves a warning per query.
        .config("spark.sql.adaptive.enabled", "false")
    )
    if not local:
        builder = builder.config("spark.executor.memory", settings.spark_executor_memory)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not local:
        from pipeline.shipping import project_zip

        shipped = project_zip(settings.checkpoint_dir.resolve().parent / "pyfiles")
        spark.sparkContext.addPyFile(str(shipped))
        log.info("shipping %s to the executors of %s", shipped.name, settings.spark_master)
    from pipeline.kafka_source import KafkaSource

    spark.dataSource.register(KafkaSource)
    return spark


def check_spark_master(master: str, timeout_s: float = 3.0) -> None:
    """Before Spark starts: a standalone master that accepts no connection is a setting that will not work.

    Spark itself would create the session, retry registering for a minute and then stop it.
    """
    if not master.startswith("spark://"):
        return
    import socket

    tried = []
    for address in master[len("spark://"):].split(","):
        parts = urlsplit(f"spark://{address}")
        try:
            host, port = parts.hostname, parts.port or 7077
        except ValueError:
            raise ConfigError(f"spark_master: {master!r} is not spark://HOST:PORT[,HOST:PORT…]",
                              setting="spark_master") from None
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except OSError as e:
            tried.append(f"{host}:{port} ({e.strerror or type(e).__name__})")
    raise ConfigError(f"spark_master: no Spark master answers at {master}: tried {', '.join(tried)}",
                      setting="spark_master")


def source_rows(spark: "SparkSession", settings: PipelineSettings, src: Source, table: str) -> "DataFrame":
    """The source topic as a stream of parsed rows: the schema's fields plus the Kafka record columns."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    from pipeline.kafka_source import FORMAT

    try:
        schema = _parse_datatype_string(src.schema)
    except Exception as e:
        raise TablesFileError(f"source {src.name!r}: schema {src.schema!r} is not a Spark DDL schema: "
                              f"{str(e).splitlines()[0]}", source=src.name) from None
    if not isinstance(schema, StructType):
        raise TablesFileError(f"source {src.name!r}: schema {src.schema!r} must list fields", source=src.name)
    check_source_fields(src, schema.fieldNames())
    topic = settings.input_topic(src.topic)
    if settings.source_format == "kafka":
        return _parsed(jvm_kafka_stream(spark, settings, topic), schema)
    raw = (
        spark.readStream.format(FORMAT)
        .option("topic", topic)
        .option("kafka", orjson.dumps(settings.kafka()).decode())
        .option("max_records_per_batch", str(settings.max_records_per_batch))
        .option("create_partitions", str(settings.input_partitions))
        # About one read task per core: a task costs more than reading thousands of records.
        .option("read_tasks", str(spark.sparkContext.defaultParallelism))
        .option("hint", f"To reprocess from the start, delete {settings.table_checkpoint(table)}.")
        .load()
    )
    return _parsed(raw, schema)


def _parsed(raw: "DataFrame", schema: Any) -> "DataFrame":
    from pyspark.sql import functions as F

    return (raw.select(F.from_json("value", schema).alias("_value"), *METADATA_COLUMNS)
            .select("_value.*", *METADATA_COLUMNS))


class SourceUnavailable(ConfigError):
    """The configured source format is not installed in this Spark."""

    code = "SOURCE_UNAVAILABLE"


def jvm_kafka_stream(spark: "SparkSession", settings: PipelineSettings, topic: str) -> "DataFrame":
    """The topic through Spark's own Kafka connector, in the built-in source's columns.

    The seam for engines that need that connector (Spark's Real-time Mode among them): the
    tables see the same rows either way. librdkafka settings are passed as ``kafka.*``
    options; those without a Java client equivalent must be given in the Java client's terms.
    """
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("kafka").option("subscribe", topic).option("startingOffsets", "earliest")
              .option("failOnDataLoss", "true"))
    for key, value in settings.kafka().items():
        reader = reader.option(f"kafka.{key}", str(value))
    if settings.max_records_per_batch:
        reader = reader.option("maxOffsetsPerTrigger", str(settings.max_records_per_batch))
    try:
        raw = reader.load()
    except Exception as e:
        # [KAFKA_DATA_SOURCE_NOT_ENABLED] or [DATA_SOURCE_NOT_FOUND], by Spark version.
        if "DATA_SOURCE_NOT" not in str(e):
            raise
        raise SourceUnavailable(
            "source_format 'kafka' needs Spark's Kafka connector on the classpath "
            f"(org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.version}, through spark.jars.packages or "
            "spark.jars); without it use source_format 'freshroute_kafka'", setting="source_format") from None
    return raw.select(F.col("key").cast("string"), F.col("value").cast("string"), "topic", "partition", "offset",
                      "timestamp")


@dataclass
class TableRun:
    """One table's query and what it needs to be restarted."""

    table: Table
    spec: TableSpec
    writer: ChangelogWriter
    query: "StreamingQuery | None" = None
    failures: list[float] = field(default_factory=list)
    finished: bool = False
    logged_batch: int = -1
    recent_ms: list[int] = field(default_factory=list)  # the last WARM_BATCHES batches' durations
    last_progress: Any = None  # the last micro-batch's progress report seen (for metrics)
    late_rows_dropped: int = 0  # input rows past their window's grace, since start
    windows_expired: int = 0  # windows tombstoned after their retention, since start


class Pipeline:
    """Wires tables → queries → changelog writers; :func:`run` drives it."""

    def __init__(self, settings: PipelineSettings, definition: TablesDefinition | None = None) -> None:
        self.settings = settings
        self.definition = definition or load_tables(settings.tables_file)
        self.spark: "SparkSession | None" = None
        self.producer = ChangelogProducer(settings.kafka())
        self.runs: dict[str, TableRun] = {}
        self._stop = threading.Event()
        self._registrar: TableRegistrar | None = None
        self._input_lag: InputLagPublisher | None = None
        self._warm = False

    # start
    def start(self) -> None:
        from pipeline.topics import admin_client, check_replication, describe_topic, ensure_topic

        admin = admin_client(self.settings.kafka())
        check_replication(admin, self.settings.changelog_replication_factor)
        # Before Spark starts: a lost changelog is known in milliseconds, not after the JVM's warm-up.
        for t in self.definition.tables.values():
            topic = self.settings.changelog_topic(t.name)
            check_changelog_kept(topic, describe_topic(admin, topic) is not None,
                                 self.settings.table_checkpoint(t.name))
        check_spark_master(self.settings.spark_master)
        started = time.monotonic()
        self.spark = build_session(self.settings)
        log.info("spark session ready in %.1fs (master %s, %d shuffle partitions)",
                 time.monotonic() - started, self.settings.spark_master, self.settings.shuffle_partitions)
        for t in self.definition.tables.values():
            df = self._table_frame(t)
            topic = self.settings.changelog_topic(t.name)
            info = ensure_topic(admin, topic, self.settings.changelog_partitions, self.settings.changelog_config(),
                                replication_factor=self.settings.changelog_replication_factor)
            if info.replication_factor != self.settings.changelog_replication_factor:
                log.warning("changelog %s has replication factor %d (setting says %d); Kafka's partition "
                            "reassignment changes it", topic, info.replication_factor,
                            self.settings.changelog_replication_factor)
            if len(info.partitions) != self.settings.changelog_partitions:
                # Existing records are partitioned by the existing count: keep it.
                log.warning("changelog %s has %d partitions (setting says %d); keeping %d", topic,
                            len(info.partitions), self.settings.changelog_partitions, len(info.partitions))
            value_schema = {f.name: f.dataType.simpleString() for f in df.schema.fields
                            if f.name not in (t.key, DELETE_COLUMN, WINDOW_START_COLUMN)}
            standbys = self.settings.standby_replicas if t.standby_replicas is None else t.standby_replicas
            spec = TableSpec(t.name, topic, len(info.partitions), t.key, value_schema, standbys, window=t.window)
            expiry = None
            if t.window is not None:
                checkpoint = self.settings.table_checkpoint(t.name)
                expiry = WindowExpiry(checkpoint.with_name(checkpoint.name + ".windows"))
            writer = ChangelogWriter(t.name, topic, spec.partitions, t.key, self.producer, t.window, expiry)
            self.runs[t.name] = TableRun(t, spec, writer)
            self._start_query(self.runs[t.name], df)
        store = MetadataStore.at(self.settings.redis(), self.settings.namespace)
        self._registrar = TableRegistrar(store, [r.spec for r in self.runs.values()], self._stop,
                                         str(self.settings.redis()), self.settings.namespace)
        self._registrar.start()
        self._input_lag = InputLagPublisher(MetadataStore.at(self.settings.redis(), self.settings.namespace),
                                            self._stop, str(self.settings.redis()))
        self._input_lag.start()

    def _table_frame(self, t: Table) -> "DataFrame":
        assert self.spark is not None
        src = self.definition.sources[t.source]
        rows = source_rows(self.spark, self.settings, src, t.name)
        try:
            df = t.dataframe(self.spark, rows)
        except TablesFileError:
            raise
        except Exception as e:
            raise TablesFileError(f"table {t.name!r} in {self.definition.path}: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}", table=t.name) from None
        delete_type = next((f.dataType.simpleString() for f in df.schema.fields if f.name == DELETE_COLUMN), None)
        check_output_columns(t, df.columns, delete_type)
        return df

    def _start_query(self, run: TableRun, df: "DataFrame") -> None:
        s = self.settings
        writer = (df.writeStream.queryName(run.table.name).outputMode("update")
                  .foreachBatch(run.writer.write_batch)
                  .option("checkpointLocation", str(s.table_checkpoint(run.table.name))))
        writer = writer.trigger(availableNow=True) if s.available_now else writer.trigger(processingTime=f"{self._trigger_ms(run)} milliseconds")
        assert self.spark is not None
        # A query takes the session's settings as it starts. A windowed table's watermark moves at the end of a
        # batch: a batch without input then publishes it (and Spark evicts what it closed), so a quiet stream's
        # windows still become final. Only when the watermark moved: a keyed table never runs one.
        no_data = "spark.sql.streaming.noDataMicroBatches.enabled"
        self.spark.conf.set(no_data, "true" if run.table.window is not None else "false")
        try:
            run.query = writer.start()
        finally:
            self.spark.conf.set(no_data, "false")
        log.info("table %s: streaming %s → %s (%d partitions × 1 active + %d standbys, key %s), checkpoint %s",
                 run.table.name, s.input_topic(self.definition.sources[run.table.source].topic), run.spec.topic,
                 run.spec.partitions, run.spec.standby_replicas, run.table.key, s.table_checkpoint(run.table.name))

    # run
    def wait(self, stop: threading.Event) -> None:
        """Supervise the queries until ``stop`` is set, or (available-now) every table is done."""
        while not stop.is_set():
            for run in self.runs.values():
                if run.query is not None and not run.finished:
                    progress = run.query.lastProgress
                    seen = run.logged_batch
                    if log_progress(run, progress):
                        run.last_progress = progress
                        self._note_warmth(run, progress.batchDuration)
                        if self._input_lag is not None:
                            self._input_lag.observe(run.table.name, progress)
                        if run.table.window is not None:
                            self._windows_progress(run, progress, seen)
                if run.finished or run.query is None or run.query.isActive:
                    continue
                error = run.query.exception()
                if error is None:
                    run.finished = True
                    log.info("table %s: caught up with its input, query finished", run.table.name)
                    continue
                self._restart_or_fail(run, str(error), stop)
            if self.runs and all(r.finished for r in self.runs.values()):
                return
            stop.wait(0.5)

    def _windows_progress(self, run: TableRun, progress: Any, seen: int) -> None:
        """Count the late rows of every batch since ``seen``, and publish the watermark (expiring windows)."""
        from pipeline.metrics import late_rows, watermark_ms

        reports = [progress]
        if progress.batchId > seen + 1 and run.query is not None:
            # Batches that ended between two reads: Spark keeps the recent ones.
            reports = [p for p in run.query.recentProgress if seen < p.batchId <= progress.batchId]
        late = sum(late_rows(p) for p in reports)
        if late:
            run.late_rows_dropped += late
            log.info("table %s: %d input row(s) arrived past their window's grace and were dropped", run.table.name,
                     late)
        wm = watermark_ms(progress)
        if wm is None:
            return
        try:
            run.windows_expired += run.writer.advance_watermark(wm)
        except FreshrouteError as e:  # the next batch's report tries again
            log.warning("table %s: watermark not published: %s", run.table.name, e.message)

    def _note_warmth(self, run: TableRun, batch_ms: int) -> None:
        """Log :data:`WARM_LOG` once the last :data:`WARM_BATCHES` batches of every table ran within the bound, in
        the median."""
        if self._warm:
            return
        run.recent_ms = [*run.recent_ms, batch_ms][-WARM_BATCHES:]
        if all(len(r.recent_ms) == WARM_BATCHES and sorted(r.recent_ms)[WARM_BATCHES // 2] <= self._warm_bound(r)
               for r in self.runs.values()):
            self._warm = True
            log.info("%s: the median of the last %d micro-batches of every table ran within its trigger interval "
                     "(at least %d ms)", WARM_LOG, WARM_BATCHES, WARM_BATCH_MS)

    def _warm_bound(self, run: TableRun) -> int:
        return max(self._trigger_ms(run), WARM_BATCH_MS)

    def _trigger_ms(self, run: TableRun) -> int:
        """The table's micro-batch interval: its own, else the pipeline's."""
        return self.settings.trigger_ms if run.table.trigger_ms is None else run.table.trigger_ms

    def _restart_or_fail(self, run: TableRun, error: str, stop: threading.Event) -> None:
        lost = re.search(r"InputDataLost: (.+)", error)
        if lost:
            raise InputDataLost(lost.group(1).strip(), table=run.table.name)
        now = time.monotonic()
        run.failures = [t for t in run.failures if now - t < _RESTART_WINDOW_S] + [now]
        summary = _first_line(error)
        if len(run.failures) > _MAX_RESTARTS:
            raise PipelineFailed(f"table {run.table.name}: query failed {len(run.failures)} times within "
                                 f"{_RESTART_WINDOW_S:.0f}s; last error: {summary}", table=run.table.name)
        delay = min(30.0, 2.0 ** len(run.failures))
        log.error("table %s: query failed (%s); restarting from its checkpoint in %.0fs (attempt %d of %d)",
                  run.table.name, summary, delay, len(run.failures), _MAX_RESTARTS)
        log.debug("table %s: full error:\n%s", run.table.name, error)
        if stop.wait(delay):
            return
        self._start_query(run, self._table_frame(run.table))

    # stop
    def stop(self) -> None:
        """Stop every query (an interrupted batch is replayed on the next start), then the producer and Spark."""
        self._stop.set()
        for run in self.runs.values():
            if run.query is not None:
                try:
                    run.query.stop()
                except Exception as e:  # stopping must go on for the other tables
                    log.warning("table %s: stopping the query failed: %s", run.table.name, _first_line(str(e)))
        self.producer.close()
        for run in self.runs.values():
            if run.writer.expiry is not None:
                run.writer.expiry.close()
        if self.spark is not None:
            self.spark.stop()
            self.spark = None
        for thread in (self._registrar, self._input_lag):
            if thread is not None:
                thread.join(timeout=5)


class TableRegistrar(threading.Thread):
    """Keeps the table specs in Redis: retried while Redis is down, rewritten after it loses them.

    Redis holds soft state only, and the stream does not depend on it: a Redis outage
    costs store nodes and routers the news of a new table, never a micro-batch.
    """

    def __init__(self, store: Any, specs: list[TableSpec], stop: threading.Event, where: str, namespace: str,
                 every_s: float = _REGISTER_EVERY_S) -> None:
        super().__init__(name="table-registrar", daemon=True)
        self.store = store
        self.specs = specs
        self.stop_event = stop
        self.where = where
        self.namespace = namespace
        self.every_s = every_s

    def run(self) -> None:
        healthy: bool | None = None
        backoff = min(1.0, self.every_s)
        while not self.stop_event.is_set():
            try:
                self.store.register_tables(self.specs)
            except Exception as e:  # any Redis trouble: logged once per outage, retried with backoff
                if healthy is not False:
                    log.warning("Redis at %s is unavailable (%s): table specs not registered; retrying, the "
                                "stream keeps running", self.where, _first_line(str(e)))
                healthy = False
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, self.every_s)
                continue
            if healthy is not True:
                log.info("registered tables %s in Redis at %s (namespace %s)",
                         ", ".join(s.name for s in self.specs), self.where, self.namespace)
            healthy, backoff = True, min(1.0, self.every_s)
            self.stop_event.wait(self.every_s)


def log_progress(run: TableRun, p: Any) -> bool:
    """One INFO line per micro-batch, so that an operator sees the pipeline is alive and how fast it goes.

    Read from the query's last progress by the supervising loop rather than pushed to a Python
    StreamingQueryListener: the listener turns every report into dozens of Py4J round trips,
    which cost the JVM about a seventh of a core at two batches a second. A batch that ends
    between two reads of the loop goes unlogged; the next line's batch id shows the gap.
    """
    if p is None or p.batchId <= run.logged_batch:
        return False
    run.logged_batch = p.batchId
    written = run.writer.written.get(p.batchId)
    changed = f", {written.records} changelog records" + (f" ({written.deletes} deletes)" if written.deletes else "") \
        if written else ""
    sink = f"collect {written.collect_ms:.0f} ms, produce {written.produce_ms:.0f} ms" if written else ""
    log.info("table %s batch %d: %d input rows%s in %d ms (%s; input %.0f rows/s, processed %.0f rows/s)",
             p.name, p.batchId, p.numInputRows, changed, p.batchDuration, batch_phases(p.durationMs, sink),
             p.inputRowsPerSecond or 0.0, p.processedRowsPerSecond or 0.0)
    return True


# Where a micro-batch's time goes, in the order Spark spends it: offsets from the source and
# the offset log, planning, running the batch (read, state, foreachBatch), the commit log.
BATCH_PHASES = (("latestOffset", "offsets"), ("walCommit", "offset log"), ("queryPlanning", "planning"),
                ("addBatch", "run"), ("commitOffsets", "commit log"))


def batch_phases(duration_ms: Any, run_detail: str = "") -> str:
    """``offsets 12 ms, offset log 30 ms, …`` from a progress report's ``durationMs``."""
    phases = dict(duration_ms or {})
    return ", ".join(f"{label} {phases[name]} ms" + (f" ({run_detail})" if name == "addBatch" and run_detail else "")
                     for name, label in BATCH_PHASES if name in phases)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return text[:500]


def configure_logging() -> None:
    """INFO lines on stderr, unless the embedding program configured logging already."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "py4j.clientserver", "py4j.java_gateway"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run(settings: PipelineSettings) -> None:
    """Run the pipeline until SIGTERM/SIGINT (with ``available_now``: until the input present at start is done)."""
    configure_logging()
    stop = threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum: int, _frame: Any) -> None:
            if stop.is_set():
                # A second signal while stopping: the operator wants out now.
                os._exit(128 + signum)
            log.info("received %s: stopping the queries", signal.Signals(signum).name)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    pipeline: Pipeline | None = None
    metrics: Any = None
    try:
        pipeline = Pipeline(settings)
        log.info("pipeline: %d table(s) from %s: %s", len(pipeline.definition.tables), pipeline.definition.path,
                 ", ".join(pipeline.definition.tables))
        pipeline.start()
        if settings.metrics_port is not None:
            from freshroute.prometheus import serve_metrics
            from pipeline.metrics import PipelineCollector

            runs = pipeline.runs
            metrics = serve_metrics(PipelineCollector(runs.values), settings.metrics_host, settings.metrics_port)
            log.info("pipeline metrics on http://%s:%d/metrics", settings.metrics_host, metrics.server_address[1])
        pipeline.wait(stop)
    except FreshrouteError as e:
        # The one line an operator needs, whatever the caller does with the exception.
        log.error("pipeline stopped: %s: %s", e.code, e.message)
        raise
    finally:
        if metrics is not None:
            metrics.shutdown()
        if pipeline is not None:
            pipeline.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("pipeline stopped")

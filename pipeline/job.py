"""The pipeline process: one Spark session, a streaming query per table or group of tables.

A table runs in Spark's Real-time Mode (:mod:`pipeline.realtime`: long-running tasks, each change written by
Spark's Kafka sink within milliseconds) or in micro-batches (:mod:`pipeline.sink`, for shapes Real-time Mode
refuses), as the pipeline's ``pipeline_mode`` or the table says. A Real-time table has a query of its own; a
micro-batch table runs in its own query, or in one it shares with other tables of its source (``query=`` in the
tables file): one read of the input, one plan and one checkpoint per trigger for all of them. A query's
checkpoint (``checkpoint_dir/<query>``) holds its offsets, commits and RocksDB state. A query that fails
is restarted from its checkpoint (which replays the failed batch) a bounded number of times; lost input
data is not retried, it stops the pipeline with a message saying what happened.
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
from typing import TYPE_CHECKING, Any, Iterable
from urllib.parse import urlsplit

import orjson

from freshroute import class_archive
from freshroute.errors import ConfigError, FatalError, FreshrouteError
from freshroute.metadata import MetadataStore, TableSpec
from freshroute.settings import is_loopback
from pipeline.follower import OutputFollower, committed_offsets, follow
from pipeline.input_lag import InputLagPublisher, source_offsets
from pipeline.lineage import aggregates, with_lineage
from pipeline.realtime import RealtimeRefused, changelog_records, dead_letters, refused, start_query, task_slots
from pipeline.settings import PipelineSettings
from pipeline.recompute import Recomputation
from pipeline.reflected import ReflectionPublisher
from pipeline.sink import ChangelogProducer, ChangelogWriter, QuerySink, RejectWriter
from pipeline.tables import (DELETE_COLUMN, INTERNAL_COLUMNS, MICROBATCH, REALTIME, Source, Table, TablesDefinition,
                             TablesFileError, check_modes, check_output_columns, check_source_fields, load_tables,
                             queries, union_tables)
from pipeline.validation import RAW_KEY, RAW_VALUE, REJECTED_BRANCH, InvalidInput, required_fields, split
from pipeline.window_expiry import WindowExpiry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("pipeline")

_LOG4J2 = Path(__file__).resolve().parent / "log4j2.properties"
# Restarts of one query tolerated within the window before the pipeline gives up. Generous:
# on a loaded machine Spark's Python source worker may miss its fixed 10 s start-up deadline.
_MAX_RESTARTS = 8
_RESTART_WINDOW_S = 600.0
_REGISTER_EVERY_S = 10.0
# The last micro-batches of every query, whose median ran within the trigger interval (at least
# WARM_BATCH_MS): the JIT has compiled the hot paths and the Python workers are up. Until then
# a batch takes seconds, and freshness with it; the line is what `local up` waits for. A median,
# not every batch: with several queries sharing two cores, one batch in a few runs long on a
# warm pipeline too.
WARM_BATCHES = 5
WARM_BATCH_MS = 500
WARM_LOG = "pipeline warm"


# Beside Spark's own files in a query's checkpoint: the tables whose state it holds.
QUERY_TABLES_FILE = "freshroute-tables.json"


class PipelineFailed(FatalError):
    """A query kept failing; the last error says why."""

    code = "PIPELINE_FAILED"


class InputDataLost(FatalError):
    """The input topic no longer holds offsets the checkpoint says were there (or are still to be read)."""

    code = "INPUT_DATA_LOST"


class InputTopicMissing(ConfigError):
    """A source names an input topic the broker does not have."""

    code = "INPUT_TOPIC_MISSING"


class ChangelogLost(FatalError):
    """A table's changelog topic is gone while its checkpoint says batches were written to it."""

    code = "CHANGELOG_LOST"


def committed_batches(checkpoint: Path) -> int:
    """Micro-batches a query's checkpoint records as done (Spark's ``commits`` log)."""
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0


class QueryChanged(ConfigError):
    """A query's checkpoint holds the state of other tables, or of another definition of its tables, than the tables
    file now gives it."""

    code = "QUERY_CHANGED"


def check_query_tables(checkpoint: Path, query: str, tables: list[str]) -> None:
    """Refuse to resume a query whose tables changed, then record its tables in its checkpoint.

    A query's state is per operator, in plan order: resumed with a table added or removed, its
    tables would start without their history or read another table's. A checkpoint without the
    record predates shared queries: it is its one table's own.
    """
    record = checkpoint / QUERY_TABLES_FILE
    if committed_batches(checkpoint):
        had = recorded_tables(checkpoint) if record.is_file() else [query]
        if had != tables:
            was = f"for tables {had}" if had is not None else f"with an unreadable {QUERY_TABLES_FILE}"
            raise QueryChanged(f"query {query!r}: its checkpoint {checkpoint} was written {was}, and the tables file "
                               f"now puts {tables} in it. Delete {checkpoint} to recompute them all from the input, "
                               f"or give a new table a query of its own.", query=query, checkpoint=str(checkpoint))
    checkpoint.mkdir(parents=True, exist_ok=True)
    record.write_bytes(orjson.dumps({"tables": tables}))


def recorded_tables(checkpoint: Path) -> list[str] | None:
    """The tables a query's checkpoint records; None when it records none that can be read."""
    try:
        return orjson.loads((checkpoint / QUERY_TABLES_FILE).read_bytes())["tables"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None


def query_checkpoint_of(checkpoint_dir: Path, table: str) -> Path:
    """The checkpoint of the query a table runs in: the one whose record names it, else the table's own."""
    for record in sorted(checkpoint_dir.glob(f"*/{QUERY_TABLES_FILE}")):
        if table in (recorded_tables(record.parent) or ()):
            return record.parent
    return checkpoint_dir / table


def check_changelog_kept(topic: str, existed: bool, checkpoint: Path) -> None:
    """Refuse to resume a table whose changelog vanished (deleted, or a broker that lost its storage).

    The query would carry on from its checkpoint and write only the keys that change from
    now on, so a restored replica would silently miss every other key.
    """
    done = committed_batches(checkpoint)
    if not existed and done:
        raise ChangelogLost(f"changelog topic {topic} does not exist, but the checkpoint {checkpoint} records {done} "
                            f"batch(es) written to it: the broker lost it (deleted, or a broker restarted without its storage?). Delete "
                            f"{checkpoint} to recompute the table from its input.", topic=topic,
                            checkpoint=str(checkpoint))


class NotEnoughSlots(ConfigError):
    """The Spark master cannot run every Real-time query's tasks at once."""

    code = "NOT_ENOUGH_TASK_SLOTS"


def local_master(master: str, slots: int) -> str:
    """The local master that runs ``slots`` tasks at once: ``local[*]`` sized to them (Real-time queries hold their
    tasks for their life, however few cores there are); an explicit ``local[N]`` is kept if it has room."""
    found = re.fullmatch(r"local\[(\*|\d+)\](?:\[\d+\])?|local", master)
    if found is None:
        return master
    if found.group(0) == "local" or found.group(1) != "*":
        have = 1 if found.group(0) == "local" else int(found.group(1))
        if have < slots:
            raise NotEnoughSlots(f"spark_master {master} runs {have} task(s) at once, and the Real-time queries hold "
                                 f"{slots} (a task per input partition, and per shuffle partition of an aggregation): "
                                 f"use local[*] (sized to them) or local[{slots}]", setting="spark_master")
        return master
    return f"local[{slots}]"


def jit_options(spark_jit: str, realtime: bool, microbatches: bool) -> str:
    """The Spark JVMs' options for the ``spark_jit`` setting, with a leading space ("" for the JVM's default)."""
    # "auto": the client compiler only for micro-batches, whose small, frequent batches keep the optimising compiler
    # busy for minutes after start (about a third of a core) for code that runs a few milliseconds a batch.
    # Real-time tasks run the same code for hours: at high rates it is worth compiling well.
    client = spark_jit == "client" or (spark_jit == "auto" and microbatches and not realtime)
    return " -XX:TieredStopAtLevel=1" if client else ""


def build_session(settings: PipelineSettings, slots: int = 0, microbatches: bool = True,
                  java_options: str | None = None) -> "SparkSession":
    """A Spark session for the pipeline's queries: ``slots`` task slots held by Real-time queries (a local master is
    sized for them and ``microbatches`` more), and the JIT tuned for micro-batches when any table runs them. The
    driver maps its class archive (:mod:`freshroute.class_archive`) unless ``java_options`` say otherwise."""

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

    jit = jit_options(settings.spark_jit, realtime=bool(slots), microbatches=microbatches)
    master = local_master(settings.spark_master, slots + (2 if microbatches else 0)) if slots else settings.spark_master
    builder = (
        SparkSession.builder.master(master)
        .appName(f"freshroute-pipeline-{settings.namespace}")
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_LOG4J2}{jit}"
                f"{java_options if java_options is not None else archive_options(settings.jars_dir)}")
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
        if jit:
            builder = builder.config("spark.executor.extraJavaOptions", jit.strip())
    # Spark's Kafka connector, resolved by Maven (jvm/pom.xml): spark.jars puts it on the driver's classpath and
    # ships it to a cluster's executors.
    builder = builder.config("spark.jars", ",".join(str(j) for j in connector_jars(settings.jars_dir)))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not local:
        from pipeline.shipping import project_zip

        shipped = project_zip(settings.checkpoint_dir.resolve().parent / "pyfiles")
        spark.sparkContext.addPyFile(str(shipped))
        log.info("shipping %s to the executors of %s", shipped.name, settings.spark_master)
    return spark


class ConnectorMissing(ConfigError):
    """Spark's Kafka connector is not where the settings say."""

    code = "CONNECTOR_MISSING"


def driver_archive(jars_dir: Path) -> Path:
    """The Spark driver's class archive (:mod:`freshroute.class_archive`) for this PySpark and connector."""
    import pyspark

    return class_archive.archive_path(jars_dir / "class-archive", "spark-driver",
                                      [pyspark.__version__, *(j.name for j in connector_jars(jars_dir))])


def archive_options(jars_dir: Path) -> str:
    """The JVM options that map the driver's class archive, when there is one for these jars."""
    try:
        return "".join(f" {o}" for o in class_archive.mapping(driver_archive(jars_dir)))
    except ConnectorMissing:
        return ""  # the session says so, in its own words


def connector_jars(jars_dir: Path) -> list[Path]:
    """The jars of Spark's Kafka connector (and what it adds to PySpark's own), as jvm/pom.xml pins it."""
    folder = jars_dir / "spark-kafka"
    jars = sorted(folder.glob("*.jar"))
    if not any(j.name.startswith("spark-sql-kafka-0-10_2.13-") for j in jars):
        raise ConnectorMissing(f"Spark's Kafka connector is missing from {folder}: it is resolved by "
                               f"`mvn -f jvm/pom.xml package` (`./dev up` does)", setting="jars_dir")
    return jars


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


def source_schema(src: Source) -> Any:
    """The source's schema as a Spark ``StructType``; a TablesFileError naming the source when it is not one."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    try:
        schema = _parse_datatype_string(src.schema)
    except Exception as e:
        raise TablesFileError(f"source {src.name!r}: schema {src.schema!r} is not a Spark DDL schema: "
                              f"{str(e).splitlines()[0]}", source=src.name) from None
    if not isinstance(schema, StructType):
        raise TablesFileError(f"source {src.name!r}: schema {src.schema!r} must list fields", source=src.name)
    check_source_fields(src, schema.fieldNames())
    return schema


def table_frame(spark: "SparkSession", definition: TablesDefinition, t: Table, rows: "DataFrame",
                built: Any = None) -> "DataFrame":
    """Table ``t``'s frame over its source's parsed ``rows``, its columns checked; whatever its definition gets wrong
    (a missing column, SQL Spark cannot analyse) a TablesFileError naming the file and the table."""
    try:
        df = t.dataframe(spark, rows, built)
    except TablesFileError:
        raise
    except Exception as e:
        raise TablesFileError(f"table {t.name!r} in {definition.path}: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}", table=t.name) from None
    delete_type = next((f.dataType.simpleString() for f in df.schema.fields if f.name == DELETE_COLUMN), None)
    check_output_columns(t, df.columns, delete_type, definition.path)
    return df


def version_times(spark: "SparkSession", t: Table, path: Path) -> Any:
    """What a micro-batch table's frame gets besides its definition: a versioned table's version time (None:
    nothing); ``path``: the tables file, to name."""
    if not t.versioned:
        return None

    def refuse(why: str) -> TablesFileError:
        return TablesFileError(f"table {t.name!r} in {path} cannot keep a history: {why}", table=t.name)

    return lambda df: with_lineage(spark, df, refuse, version_time=True)


def source_rows(spark: "SparkSession", settings: PipelineSettings, src: Source, tables: Iterable[Table] = (),
                realtime: bool = False) -> tuple["DataFrame", "DataFrame"]:
    """The source topic as a stream of valid parsed rows — the schema's fields plus the Kafka record columns — and
    one of its rejected records (:mod:`pipeline.validation`); ``tables``: every table of the source, whose keys and
    window time columns a record must have."""
    schema = source_schema(src)
    tables = list(tables)
    # A Real-time batch reads the clock once, at its start, and lasts a checkpoint interval: a record's time is
    # judged against a clock up to that much behind.
    slack_ms = settings.realtime_checkpoint_ms if realtime else 0
    return split(kafka_stream(spark, settings, settings.input_topic(src.topic), realtime), src, schema,
                 required_fields(schema, [t.key for t in tables]),
                 [t.window.time_column for t in tables if t.window is not None], slack_ms)


def kafka_stream(spark: "SparkSession", settings: PipelineSettings, topic: str, realtime: bool = False) -> "DataFrame":
    """The topic through Spark's own Kafka source, offsets in the query's checkpoint.

    The deployment's Kafka settings are passed as ``kafka.*`` options: the Java client's names, which are
    librdkafka's too for the common ones (``security.protocol``, ``sasl.*``); others must be given in
    the Java client's terms.
    """
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("kafka").option("subscribe", topic).option("startingOffsets", "earliest")
              .option("failOnDataLoss", "true"))
    if not realtime:
        # A task's consumer fetches ahead of the range it reads; at the partition's end the broker holds
        # that fetch for fetch.max.wait.ms (500 ms by default) and the task waits on it. Measured on the
        # demo stack: batches of 570–650 ms became 360–540 ms, and `local up` warm in 18 s, not >90 s.
        # (A Real-time task's fetch returns as soon as a record arrives, and waiting long is what idles it.)
        reader = reader.option("kafka.fetch.max.wait.ms", "10")
    for key, value in settings.kafka().items():
        reader = reader.option(f"kafka.{key}", str(value))
    if settings.max_records_per_batch and not realtime:
        reader = reader.option("maxOffsetsPerTrigger", str(settings.max_records_per_batch))
    # The record's bytes as they came: what a rejected record's dead letter carries.
    return reader.load().select(F.col("key").alias(RAW_KEY), F.col("value").alias(RAW_VALUE),
                                F.col("key").cast("string").alias("key"), "topic", "partition", "offset", "timestamp")


@dataclass
class TableRun:
    """One table: its spec, its changelog writer, and what its query's batches did for it."""

    table: Table
    spec: TableSpec
    writer: ChangelogWriter
    last_progress: Any = None  # its query's last micro-batch's progress report seen (for metrics)
    late_rows_dropped: int = 0  # input rows past their window's grace, since start
    windows_expired: int = 0  # windows tombstoned after their retention, since start


@dataclass
class QueryRun:
    """One streaming query, of one or more tables of one source, and what it needs to be restarted."""

    name: str
    tables: list[TableRun]
    trigger_ms: int
    mode: str = MICROBATCH
    query: "StreamingQuery | None" = None
    rejects: RejectWriter | None = None  # its source's rejected records, if this query writes them
    failures: list[float] = field(default_factory=list)
    finished: bool = False
    logged_batch: int = -1
    recent_ms: list[int] = field(default_factory=list)  # the last WARM_BATCHES batches' durations

    @property
    def windowed(self) -> TableRun | None:
        """The query's windowed table: its watermark is the query's."""
        return next((r for r in self.tables if r.table.window is not None), None)

    @property
    def realtime(self) -> bool:
        return self.mode == REALTIME

    @property
    def label(self) -> str:
        names = [r.table.name for r in self.tables]
        if not names:
            return f"query {self.name}"
        return f"table {self.name}" if names == [self.name] else f"query {self.name} ({', '.join(names)})"


def lasting_failure(q: QueryRun, error: str, settings: PipelineSettings) -> FreshrouteError | None:
    """The error a query's failure stands for when a restart would meet it again (lost input, a changed definition,
    an invalid record), or None when a restart may help."""
    # Spark's Kafka source fails a query whose checkpointed offsets the topic no longer holds (failOnDataLoss):
    # a restart would fail the same way, and going on would silently skip input.
    lost = re.search(r"\[KAFKA_DATA_LOSS[^\]]*\]\s*([^\n]+)", error)
    if lost:
        checkpoint = settings.query_checkpoint(q.name)
        return InputDataLost(f"{q.label}: {lost.group(1).strip()} To reprocess the input the broker still holds, "
                             f"delete {checkpoint}.", query=q.name, checkpoint=str(checkpoint))
    # A table whose aggregation changed finds state of another shape in its checkpoint: every restart would fail
    # alike, so the pipeline stops at once and says what to do.
    changed = re.search(r"\[(STATE_STORE_(?:KEY|VALUE)_SCHEMA_NOT_COMPATIBLE|"
                        r"STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA)[^\]]*\]", error)
    if changed:
        checkpoint = settings.query_checkpoint(q.name)
        return QueryChanged(f"{q.label}: its checkpoint {checkpoint} holds the state of an earlier definition of "
                            f"its tables (Spark: {changed.group(1)}). Delete {checkpoint} to recompute them from "
                            f"the input, or give the changed table a query of its own (query=...).",
                            query=q.name, checkpoint=str(checkpoint))
    # A shape Real-time Mode cannot run: so it stays.
    refused = re.search(r"\[(STREAMING_REAL_TIME_MODE[^\]]*)\]\s*([^\n]*)", error)
    if refused:
        name = q.tables[0].table.name if q.tables else q.name
        if "CHECKPOINT_FORMAT_V1" in refused.group(1):
            checkpoint = settings.query_checkpoint(q.name)
            return QueryChanged(f"{q.label}: its checkpoint {checkpoint} was written by micro-batches, and Real-time "
                                f"Mode cannot resume from it (Spark: {refused.group(1)}). Delete {checkpoint} to "
                                f"recompute the table from its input, or give it pipeline_mode='microbatch'.",
                                query=q.name, checkpoint=str(checkpoint))
        return RealtimeRefused(f"table {name!r} cannot run in Real-time Mode (Spark: {refused.group(1)}: "
                               f"{refused.group(2).strip()}). Give the table pipeline_mode='microbatch' in the tables "
                               f"file to run it in micro-batches", table=name)
    # A source that fails on invalid input: a restart would meet the same record.
    invalid = re.search(r"INVALID_INPUT: ([^\n]+)", error)
    if invalid:
        return InvalidInput(f"{q.label}: {invalid.group(1).strip()}. Fix or remove the record (or let the source "
                            f"dead-letter it: on_invalid='dead_letter'), then start the pipeline again.",
                            query=q.name)
    return None


def mark_recomputation(admin: Any, settings: PipelineSettings, definition: TablesDefinition, query: str,
                       tables: list[Table]) -> None:
    """A query starting without a checkpoint over changelogs that hold keys: note where they and its input end,
    so that the keys it no longer produces are found once it has caught up (:mod:`pipeline.recompute`)."""
    from freshroute.changelog_reader import end_offsets
    from pipeline.recompute import MARK_FILE
    from pipeline.topics import describe_topic

    s = settings
    checkpoint = s.query_checkpoint(query)
    if committed_batches(checkpoint) or (checkpoint / MARK_FILE).exists():
        return
    topics = {t.name: describe_topic(admin, s.changelog_topic(t.name)) for t in tables if t.window is None}
    ends = end_offsets(admin, {info.name: info.partitions for info in topics.values() if info is not None})
    changelogs = {name: ends[info.name] for name, info in topics.items() if info is not None}
    if not any(any(e.values()) for e in changelogs.values()):
        return
    source = describe_topic(admin, s.input_topic(definition.sources[tables[0].source].topic))
    assert source is not None, "inputs are checked first"
    Recomputation(checkpoint, end_offsets(admin, {source.name: source.partitions}), changelogs).save()
    log.info("query %s starts without a checkpoint over changelogs that hold keys (%s): keys it no longer "
             "produces are looked for once it has read its input to where it ends now", query,
             ", ".join(changelogs))


def realtime_warm(spark: "SparkSession", queries: list[QueryRun], lags: dict[str, Any], slots: int,
                  since_ms: int) -> bool:
    """Whether Real-time queries are warm: all their tasks run, every one of the ``slots`` they hold, and every table
    has caught up with its input since ``since_ms`` (``lags``: each table's last input lag) — what arrived while
    Spark started, run through a JIT still cold. Each on its own: with input arriving all the time, the tables are
    seldom all at its end at one instant."""
    if any(lags.get(r.table.name) is None or lags[r.table.name].caught_up_ms <= since_ms
           for q in queries for r in q.tables):
        return False
    tracker = spark.sparkContext.statusTracker()
    running = 0
    for stage in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage)
        running += info.numActiveTasks if info is not None else 0
    return running >= slots and all(q.query is not None and q.query.isActive for q in queries)


def codegen(spark: "SparkSession", on: bool) -> None:
    """Code generation for the next query to start. Off for micro-batches: it costs more than it saves at a batch's
    few hundred rows (every batch plans the query again and generates each stage's code anew before the compiled
    class cache is even consulted; interpreted, a batch takes about a third less CPU). On for Real-time queries,
    planned once and run for hours."""
    spark.conf.set("spark.sql.codegen.wholeStage", "true" if on else "false")
    spark.conf.set("spark.sql.codegen.factoryMode", "FALLBACK" if on else "NO_CODEGEN")


def check_inputs(settings: PipelineSettings, definition: TablesDefinition, admin: Any) -> None:
    """Every source's topic exists (or, with ``create_input_topics``, is made): a typo is an error, not an
    empty table."""
    from freshroute.topics import describe_topic
    from pipeline.topics import ensure_topic

    s = settings
    for src in definition.sources.values():
        topic = s.input_topic(src.topic)
        if describe_topic(admin, topic) is not None:
            continue
        if not s.create_input_topics:
            raise InputTopicMissing(f"source {src.name!r}: input topic {topic} does not exist on {s.bootstrap_servers}"
                                    f"; create it, fix the name in {definition.path}, or set "
                                    f"create_input_topics", source=src.name, topic=topic)
        ensure_topic(admin, topic, s.input_partitions, {}, replication_factor=s.changelog_replication_factor)
        log.info("source %s: created input topic %s (%d partitions)", src.name, topic, s.input_partitions)


def reject_writer(settings: PipelineSettings, admin: Any, src: Source, producer: ChangelogProducer) -> RejectWriter:
    """The writer of the source's rejected records; its dead-letter topic made if need be (with the input's
    partitions and the changelogs' replication)."""
    from freshroute.topics import describe_topic
    from pipeline.topics import ensure_topic

    s = settings
    topic = s.input_topic(src.rejected_topic)
    partitions = 1
    if src.on_invalid == "dead_letter":
        source = describe_topic(admin, s.input_topic(src.topic))
        info = ensure_topic(admin, topic, len(source.partitions) if source else 1, {},
                            replication_factor=s.changelog_replication_factor)
        partitions = len(info.partitions)
    log.info("source %s: records that do not fit its schema are %s", src.name,
             {"dead_letter": f"written to {topic}", "skip": "counted and dropped",
              "fail": "the end of the pipeline"}[src.on_invalid])
    return RejectWriter(src.name, src.on_invalid, topic, partitions, producer)


def table_run(settings: PipelineSettings, definition: TablesDefinition, t: Table, df: "DataFrame", admin: Any,
              producer: ChangelogProducer, rejects: RejectWriter | None = None) -> TableRun:
    """The table's changelog topic (created if need be), spec and writer."""
    from freshroute.topics import history_topic_config, keep_history, topic_config
    from pipeline.topics import ensure_topic

    s = settings
    topic = s.changelog_topic(t.name)
    history = history_topic_config(t.history_retention_ms) if t.versioned else {}
    info = ensure_topic(admin, topic, s.changelog_partitions, {**s.changelog_config(), **history},
                        replication_factor=s.changelog_replication_factor)
    if t.versioned and (changed := keep_history(admin, topic, topic_config(admin, topic), t.history_retention_ms)):
        log.info("table %s: %s", t.name, changed)
    if info.replication_factor != s.changelog_replication_factor:
        log.warning("changelog %s has replication factor %d (setting says %d); Kafka's partition "
                    "reassignment changes it", topic, info.replication_factor, s.changelog_replication_factor)
    if len(info.partitions) != s.changelog_partitions:
        # Existing records are partitioned by the existing count: keep it.
        log.warning("changelog %s has %d partitions (setting says %d); keeping %d", topic,
                    len(info.partitions), s.changelog_partitions, len(info.partitions))
    value_schema = {f.name: f.dataType.simpleString() for f in df.schema.fields
                    if f.name != t.key and f.name not in INTERNAL_COLUMNS}
    standbys = s.standby_replicas if t.standby_replicas is None else t.standby_replicas
    spec = TableSpec(t.name, topic, len(info.partitions), t.key, value_schema, standbys, window=t.window,
                     input_topic=s.input_topic(definition.sources[t.source].topic),
                     pipeline_mode=s.mode_of(t), history_retention_ms=t.history_retention_ms)
    expiry = WindowExpiry(s.window_index(t.name)) if t.window is not None else None
    return TableRun(t, spec, ChangelogWriter(t.name, topic, spec.partitions, t.key, producer, t.window, expiry,
                                             t.stale_keys, rejects))


def windows_progress(q: QueryRun, run: TableRun, progress: Any, seen: int) -> None:
    """Count the late rows of every batch since ``seen``, and publish the watermark (expiring windows)."""
    from pipeline.metrics import late_rows, watermark_ms

    reports = [progress]
    if progress.batchId > seen + 1 and q.query is not None:
        # Batches that ended between two reads: Spark keeps the recent ones.
        reports = [p for p in q.query.recentProgress if seen < p.batchId <= progress.batchId]
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


class Pipeline:
    """Wires tables → queries → changelog writers; :func:`run` drives it."""

    def __init__(self, settings: PipelineSettings, definition: TablesDefinition | None = None) -> None:
        self.settings = settings
        self.definition = definition or load_tables(settings.tables_file)
        self.spark: "SparkSession | None" = None
        self.producer = ChangelogProducer(settings.kafka())
        self.runs: dict[str, TableRun] = {}
        self.queries: dict[str, QueryRun] = {}
        self._stop = threading.Event()
        self._registrar: TableRegistrar | None = None
        self._input_lag: InputLagPublisher | None = None
        self._follower: OutputFollower | None = None
        self._reflected: ReflectionPublisher | None = None
        self._input_partitions: dict[str, int] = {}  # source → partitions of its input topic
        self._slots = 0  # the task slots the Real-time queries hold
        self._warm = False

    # start
    def start(self) -> None:
        from freshroute.topics import describe_topic
        from pipeline.topics import admin_client, check_replication

        s = self.settings
        admin = admin_client(s.kafka())
        check_replication(admin, s.changelog_replication_factor, s.bootstrap_servers)
        # Before Spark starts: a lost changelog or a changed query is known in milliseconds, not after the JVM's
        # warm-up.
        grouped = queries(self.definition)
        check_modes(self.definition, s.mode_of)
        modes = {name: s.mode_of(tables[0]) for name, tables in grouped.items()}
        for name, tables in grouped.items():
            checkpoint = s.query_checkpoint(name)
            # First: a table new to the query has no changelog yet, which is not the broker's doing.
            check_query_tables(checkpoint, name, [t.name for t in tables])
            for t in tables:
                topic = s.changelog_topic(t.name)
                check_changelog_kept(topic, describe_topic(admin, topic) is not None, checkpoint)
        check_inputs(s, self.definition, admin)
        for name, tables in grouped.items():
            if modes[name] == MICROBATCH:
                mark_recomputation(admin, self.settings, self.definition, name, tables)
        used = {t.source for t in self.definition.tables.values()}
        self._input_partitions = {name: len(describe_topic(admin, s.input_topic(src.topic)).partitions)
                                  for name, src in self.definition.sources.items() if name in used}
        # A source whose tables all run in Real-time Mode has a query of its own for its rejected records.
        rejecting = sorted(src for src in used if self._rejects_query(self.definition.sources[src]) is None
                           and self.definition.sources[src].on_invalid != "skip")
        slots = sum(task_slots(self._input_partitions[tables[0].source], True, s.shuffle_partitions)
                    for name, tables in grouped.items() if modes[name] == REALTIME)
        slots += sum(task_slots(self._input_partitions[src], False, 0) for src in rejecting)
        check_spark_master(s.spark_master)
        started = time.monotonic()
        self.spark = build_session(s, slots, microbatches=MICROBATCH in modes.values())
        log.info("spark session ready in %.1fs (master %s, %d shuffle partitions)",
                 time.monotonic() - started, self.spark.sparkContext.master, s.shuffle_partitions)
        rejects = {name: reject_writer(s, admin, self.definition.sources[name], self.producer) for name in sorted(used)}
        self._reflected = ReflectionPublisher(MetadataStore.at(s.redis(), s.namespace), lambda: admin_client(s.kafka()),
                                              self._stop, rejects.values())
        self._reflected.start()
        frames: dict[str, "DataFrame"] = {}  # a Real-time query's frame, made once for its spec and its start
        for name, tables in grouped.items():
            source = rejects[tables[0].source]
            if modes[name] == REALTIME:
                t = tables[0]
                frames[name] = self._realtime_frame(t)
                run = table_run(s, self.definition, t, frames[name], admin, self.producer, source)
                self.runs[t.name] = run
                self.queries[name] = QueryRun(name, [run], self._trigger_ms(tables), REALTIME)
                continue
            batched, rejected = self._table_frames(name, tables)
            runs = [table_run(s, self.definition, t, df, admin, self.producer, source)
                    for t, df in zip(tables, batched)]
            self.runs.update((r.table.name, r) for r in runs)
            self.queries[name] = QueryRun(name, runs, self._trigger_ms(tables),
                                          rejects=source if rejected is not None else None)
            self._start_query(self.queries[name], (batched, rejected))
        for src in rejecting:
            name = f"{src}.rejected"
            self.queries[name] = QueryRun(name, [], 0, REALTIME, rejects=rejects[src])
        # The tasks the Real-time queries will run (the local master was sized as if each aggregated).
        self._slots = sum(task_slots(self._input_partitions[q.tables[0].table.source],
                                     aggregates(frames[q.name]), s.shuffle_partitions) if q.tables else
                          task_slots(self._input_partitions[q.rejects.source], False, 0)
                          for q in self.queries.values() if q.realtime and (q.tables or q.rejects))
        self._input_lag = InputLagPublisher(MetadataStore.at(s.redis(), s.namespace), self._stop, str(s.redis()))
        self._input_lag.start()
        # From where the Real-time queries' topics end before they start: it misses none of their records.
        self._follower = follow(s, [(r, s.query_checkpoint(q.name)) for q in self.queries.values() if q.realtime
                                    for r in q.tables], list(rejects.values()), self._input_lag, self._stop)
        for q in self.queries.values():
            if q.realtime:
                # What its last committed checkpoint read is in the changelog: a mark from the start.
                self._reflected.batches_ended(q.tables, committed_offsets(s.query_checkpoint(q.name)))
                self._start_realtime(q, frames.get(q.name))
        admin.poll(0)  # the admin client's librdkafka log lines, queued while it worked, to the pipeline's log
        store = MetadataStore.at(s.redis(), s.namespace)
        self._registrar = TableRegistrar(store, [r.spec for r in self.runs.values()], self._stop, str(s.redis()),
                                         s.namespace)
        self._registrar.start()

    def _realtime_frame(self, t: Table) -> "DataFrame":
        """A Real-time table's frame over a read of its source of its own, with its rows' input positions."""
        assert self.spark is not None
        s, spark = self.settings, self.spark
        src = self.definition.sources[t.source]
        rows, _ = source_rows(spark, s, src, [u for u in self.definition.tables.values() if u.source == src.name],
                              realtime=True)
        partitions = self._input_partitions[src.name]
        return self._table_frame(t, rows, lambda df: with_lineage(
            spark, df, lambda why: refused(t.name, why), input_partitions=partitions, version_time=t.versioned))

    def _start_realtime(self, q: QueryRun, frame: "DataFrame | None" = None) -> None:
        """Start a Real-time query: a table's changelog records (from ``frame``, else a new one), or (a query of no
        table) its source's rejected records, through Spark's Kafka sink."""
        assert self.spark is not None
        s = self.settings
        if q.tables:
            run = q.tables[0]
            src = self.definition.sources[run.table.source]
            assert run.writer.rejects is not None
            records = changelog_records(run.table, frame if frame is not None else self._realtime_frame(run.table),
                                        run.spec.topic, src, run.writer.rejects.topic)
        else:
            assert q.rejects is not None
            src = self.definition.sources[q.rejects.source]
            _, rejected = source_rows(self.spark, s, src, [t for t in self.definition.tables.values()
                                                           if t.source == src.name], realtime=True)
            records = dead_letters(src, rejected, q.rejects.topic, q.rejects.partitions)
        codegen(self.spark, True)
        q.query = start_query(records, q.name, s, [r.spec.topic for r in self.runs.values() if r.table.window])
        source = s.input_topic(src.topic)
        for r in q.tables:
            log.info("table %s: streaming %s → %s in Real-time Mode (%d partitions × 1 active + %d standbys, key %s), "
                     "checkpoint %s every %s", r.table.name, source, r.spec.topic, r.spec.partitions,
                     r.spec.standby_replicas, r.table.key, s.query_checkpoint(q.name), s.realtime_checkpoint_interval)
        if not q.tables:
            log.info("source %s: its rejected records → %s in Real-time Mode", src.name, q.rejects.topic)

    def _table_frames(self, query: str, tables: list[Table]) -> tuple[list["DataFrame"], "DataFrame | None"]:
        """The tables' streaming DataFrames over one read of their source, and its rejected records if this query is
        the one that writes them (:meth:`_rejects_query`)."""
        assert self.spark is not None
        src = self.definition.sources[tables[0].source]
        rows, rejected = source_rows(self.spark, self.settings, src,
                                     [t for t in self.definition.tables.values() if t.source == src.name])
        return [self._table_frame(t, rows, version_times(self.spark, t, self.definition.path)) for t in tables], \
            rejected if self._rejects_query(src) == query else None

    def _rejects_query(self, src: Source) -> str | None:
        """The micro-batch query that counts and writes the source's rejected records (every query of the source
        filters them): the one with the longest trigger, since each batch reads the input once more for them. None
        when all its tables run in Real-time Mode: they have a query of their own."""
        own = {name: tables for name, tables in queries(self.definition).items()
               if tables[0].source == src.name and self.settings.mode_of(tables[0]) == MICROBATCH}
        return min(own, key=lambda name: (-self._trigger_ms(own[name]), name)) if own else None

    def _trigger_ms(self, tables: list[Table]) -> int:
        """A query's trigger: its tables' (they name the same, or none: the pipeline's)."""
        return self.settings.trigger_ms if tables[0].trigger_ms is None else tables[0].trigger_ms

    def _table_frame(self, t: Table, rows: "DataFrame", built: Any = None) -> "DataFrame":
        assert self.spark is not None
        return table_frame(self.spark, self.definition, t, rows, built)

    def _start_query(self, q: QueryRun, frames: tuple[list["DataFrame"], "DataFrame | None"]) -> None:
        s = self.settings
        tables, rejected = frames
        branches = [(r.table.name, frame) for r, frame in zip(q.tables, tables)]
        if rejected is not None and q.rejects is not None:
            branches.append((REJECTED_BRANCH, rejected))
        df = union_tables(branches)
        sink = QuerySink([r.writer for r in q.tables], self.producer, s.kafka(),
                         Recomputation.load(s.query_checkpoint(q.name)), q.rejects)
        codegen(self.spark, False)
        writer = (df.writeStream.queryName(q.name).outputMode("update").foreachBatch(sink.write_batch)
                  .option("checkpointLocation", str(s.query_checkpoint(q.name))))
        writer = writer.trigger(availableNow=True) if s.available_now else writer.trigger(processingTime=f"{q.trigger_ms} milliseconds")
        assert self.spark is not None
        # A query takes the session's settings as it starts. A windowed table's watermark moves at the end of a
        # batch: a batch without input then publishes it (and Spark evicts what it closed), so a quiet stream's
        # windows still become final. Only when the watermark moved: a query of keyed tables never runs one.
        no_data = "spark.sql.streaming.noDataMicroBatches.enabled"
        self.spark.conf.set(no_data, "true" if q.windowed is not None else "false")
        try:
            q.query = writer.start()
        finally:
            self.spark.conf.set(no_data, "false")
        source = s.input_topic(self.definition.sources[q.tables[0].table.source].topic)
        for r in q.tables:
            log.info("table %s: streaming %s → %s (%d partitions × 1 active + %d standbys, key %s), query %s, "
                     "checkpoint %s", r.table.name, source, r.spec.topic, r.spec.partitions, r.spec.standby_replicas,
                     r.table.key, q.name, s.query_checkpoint(q.name))

    # run
    def wait(self, stop: threading.Event) -> None:
        """Supervise the queries until ``stop`` is set, or (available-now) every query is done."""
        while not stop.is_set():
            for q in self.queries.values():
                if q.query is not None and not q.finished:
                    progress = q.query.lastProgress
                    seen = q.logged_batch
                    if log_progress(q, progress):
                        if not q.realtime:
                            self._note_warmth(q, progress.batchDuration)
                        for run in q.tables:
                            run.last_progress = progress
                            if q.realtime:
                                # A Real-time batch's end: the checkpoint's offsets, beside what its rows say.
                                if self._follower is not None and progress.sources:
                                    self._follower.reached(run.table.name,
                                                           source_offsets(progress.sources[0].endOffset) or {})
                            elif self._input_lag is not None:
                                self._input_lag.observe(run.table.name, progress)
                            if self._reflected is not None and progress.sources:
                                self._reflected.batches_ended([run], source_offsets(progress.sources[0].endOffset))
                        if q.windowed is not None:
                            windows_progress(q, q.windowed, progress, seen)
                if q.finished or q.query is None or q.query.isActive:
                    continue
                error = q.query.exception()
                if error is None:
                    q.finished = True
                    log.info("%s: caught up with its input, query finished", q.label)
                    continue
                self._restart_or_fail(q, str(error), stop)
            if self.queries and all(q.finished for q in self.queries.values()):
                return
            self._note_realtime_warmth()
            if self._input_lag is not None:
                self._input_lag.running(r.table.name for q in self.queries.values()
                                        if q.query is not None and q.query.isActive for r in q.tables)
            stop.wait(0.5)

    def _note_realtime_warmth(self) -> None:
        """With only Real-time queries: log :data:`WARM_LOG` once they are warm (:func:`realtime_warm`)."""
        if self._warm or any(not q.realtime for q in self.queries.values()) or self.spark is None:
            return
        lag = self._input_lag
        if lag is not None and realtime_warm(self.spark, list(self.queries.values()), lag.latest, self._slots,
                                             lag.started_ms):
            self._warm = True
            log.info("%s: every Real-time query's tasks are running, and every table has caught up with its input",
                     WARM_LOG)

    def _note_warmth(self, q: QueryRun, batch_ms: int) -> None:
        """Log :data:`WARM_LOG` once the last :data:`WARM_BATCHES` batches of every query ran within the bound, in
        the median."""
        if self._warm:
            return
        q.recent_ms = [*q.recent_ms, batch_ms][-WARM_BATCHES:]
        if all(r.realtime or (len(r.recent_ms) == WARM_BATCHES and
                              sorted(r.recent_ms)[WARM_BATCHES // 2] <= max(r.trigger_ms, WARM_BATCH_MS))
               for r in self.queries.values()):
            self._warm = True
            log.info("%s: the median of the last %d micro-batches of every query ran within its trigger interval "
                     "(at least %d ms)", WARM_LOG, WARM_BATCHES, WARM_BATCH_MS)

    def _restart_or_fail(self, q: QueryRun, error: str, stop: threading.Event) -> None:
        lasting = lasting_failure(q, error, self.settings)
        if lasting is not None:
            raise lasting
        now = time.monotonic()
        q.failures = [t for t in q.failures if now - t < _RESTART_WINDOW_S] + [now]
        summary = _first_line(error)
        if len(q.failures) > _MAX_RESTARTS:
            raise PipelineFailed(f"{q.label}: query failed {len(q.failures)} times within {_RESTART_WINDOW_S:.0f}s; "
                                 f"last error: {summary}", query=q.name)
        delay = min(30.0, 2.0 ** len(q.failures))
        log.error("%s: query failed (%s); restarting from its checkpoint in %.0fs (attempt %d of %d)",
                  q.label, summary, delay, len(q.failures), _MAX_RESTARTS)
        log.debug("%s: full error:\n%s", q.label, error)
        if stop.wait(delay):
            return
        if q.realtime:
            self._start_realtime(q)
        else:
            self._start_query(q, self._table_frames(q.name, [r.table for r in q.tables]))

    # stop
    def stop(self) -> None:
        """Stop every query (an interrupted batch is replayed on the next start), then the producer and Spark."""
        self._stop.set()
        for q in self.queries.values():
            if q.query is not None:
                try:
                    q.query.stop()
                except Exception as e:  # stopping must go on for the other queries
                    log.warning("%s: stopping the query failed: %s", q.label, _first_line(str(e)))
        self.producer.close()
        for run in self.runs.values():
            if run.writer.expiry is not None:
                run.writer.expiry.close()
        if self.spark is not None:
            self.spark.stop()
            self.spark = None
        for thread in (self._registrar, self._input_lag, self._follower, self._reflected):
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


def log_progress(q: QueryRun, p: Any) -> bool:
    """One INFO line per micro-batch, so that an operator sees the pipeline is alive and how fast it goes.

    Read from the query's last progress by the supervising loop rather than pushed to a Python
    StreamingQueryListener: the listener turns every report into dozens of Py4J round trips,
    which cost the JVM about a seventh of a core at two batches a second. A batch that ends
    between two reads of the loop goes unlogged; the next line's batch id shows the gap.
    """
    if p is None or p.batchId <= q.logged_batch:
        return False
    q.logged_batch = p.batchId
    written = [(r.table.name, r.writer.written.get(p.batchId)) for r in q.tables]
    seen = [w for _, w in written if w]

    def records(w: Any) -> str:
        return f"{w.records}" + (f" ({w.deletes} deletes)" if w.deletes else "")

    changed = sink = ""
    if seen:
        changed = (f", {records(seen[0])} changelog records" if len(q.tables) == 1 else
                   ", changelog records " + ", ".join(f"{name} {records(w)}" for name, w in written if w))
        sink = f"collect {seen[0].collect_ms:.0f} ms, produce {seen[0].produce_ms:.0f} ms"
    log.info("%s batch %d: %d input rows%s in %d ms (%s; input %.0f rows/s, processed %.0f rows/s)",
             q.label, p.batchId, p.numInputRows, changed, p.batchDuration, batch_phases(p.durationMs, sink),
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

            runs, queries_ = pipeline.runs, pipeline.queries
            metrics = serve_metrics(PipelineCollector(runs.values, lambda: [q.rejects for q in queries_.values()
                                                                           if q.rejects is not None]),
                                    settings.metrics_host, settings.metrics_port)
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

"""The pipeline's Spark session: its master sized to the task slots the queries hold, its JVMs' options, Spark's Kafka
connector on its classpath, and code generation as each kind of query wants it."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from freshroute import class_archive
from freshroute.errors import ConfigError
from freshroute.settings import is_loopback

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.settings import PipelineSettings

log = logging.getLogger("pipeline")

_LOG4J2 = Path(__file__).resolve().parent / "log4j2.properties"
SHUFFLE_FLUSH_MS = 1  # spark.shuffle.streaming.networkBufferMaxWaitTimeMs: see build_session


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
    # The client compiler alone gets the JVM's small code cache (48 MB): a micro-batch driver filled it within a
    # minute, and a full cache turns the compiler off for good. The tiered default's size is only reserved.
    return " -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m" if client else ""


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
        # A Real-time shuffle holds a partly filled buffer this long before sending it on (50 ms by default): at the
        # demo's rate every row waited for it. 5 ms took an event → changelog row from 28–31 ms to 8 ms at the
        # median, 1 ms a millisecond further at no cost at rest; at high rates buffers fill before it
        # (docs/benchmarks.md).
        .config("spark.shuffle.streaming.networkBufferMaxWaitTimeMs", str(SHUFFLE_FLUSH_MS))
    )
    if not local:
        builder = builder.config("spark.executor.memory", settings.spark_executor_memory)
        if jit:
            builder = builder.config("spark.executor.extraJavaOptions", jit.strip())
    # Spark's Kafka connector, resolved by Maven (jvm/pom.xml): spark.jars puts it on the driver's classpath and
    # ships it to a cluster's executors.
    builder = builder.config("spark.jars", ",".join(str(j) for j in connector_jars(settings.jars_dir)))
    for key, value in settings.spark_conf.items():
        builder = builder.config(key, value)
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


def codegen(spark: "SparkSession", on: bool) -> None:
    """Code generation for the next query to start. Off for micro-batches: it costs more than it saves at a batch's
    few hundred rows (every batch plans the query again and generates each stage's code anew before the compiled
    class cache is even consulted; interpreted, a batch takes about a third less CPU). On for Real-time queries,
    planned once and run for hours."""
    spark.conf.set("spark.sql.codegen.wholeStage", "true" if on else "false")
    spark.conf.set("spark.sql.codegen.factoryMode", "FALLBACK" if on else "NO_CODEGEN")


def running_tasks(spark: "SparkSession") -> int:
    """The tasks the session runs now, in every active stage."""
    tracker = spark.sparkContext.statusTracker()
    running = 0
    for stage in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage)
        running += info.numActiveTasks if info is not None else 0
    return running

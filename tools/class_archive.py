"""Make the Spark driver's class archive (:mod:`pipeline.class_archive`): ``python -m tools.class_archive``.

A training session runs the pipeline's kinds of work — JSON in and out, a stateful aggregation in RocksDB, windows
with a watermark — and its JVM writes every class it loaded as it exits. ``./dev`` runs this once per JVM, PySpark
and connector; it takes about 30 s.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from pathlib import Path

from pipeline.class_archive import archive_path
from pipeline.job import build_session, connector_jars
from pipeline.settings import PipelineSettings

log = logging.getLogger("pipeline")


def _train(jars_dir: Path, out: Path) -> None:
    """A Spark session whose JVM writes the classes it loaded to ``out`` as it exits, having done the pipeline's
    kinds of work."""
    from pyspark import SparkContext
    from pyspark.sql import functions as F

    checkpoints = out.parent / f"training-{os.getpid()}"
    settings = PipelineSettings(jars_dir=jars_dir, spark_master="local[2]", shuffle_partitions=2)
    spark = build_session(settings, java_options=f" -XX:ArchiveClassesAtExit={out} -Xlog:cds=error")
    jvm = SparkContext._gateway.proc
    try:
        events = (spark.readStream.format("rate").option("rowsPerSecond", 200).load()
                  .select(F.to_json(F.struct((F.col("value") % 7).cast("string").alias("sensor"),
                                             F.col("value").cast("double").alias("reading"),
                                             F.col("timestamp").alias("ts"))).alias("json"))
                  .select(F.from_json("json", "sensor string, reading double, ts timestamp").alias("e"))
                  .select("e.*"))
        stats = events.groupBy("sensor").agg(F.count("*").alias("count"), F.sum("reading"), F.max_by("reading", "ts"))
        windows = (events.withWatermark("ts", "5 seconds").groupBy("sensor", F.window("ts", "2 seconds"))
                   .agg(F.avg("reading")))
        queries = [df.select(F.to_json(F.struct("*")).alias("value")).writeStream.format("noop")
                   .outputMode("update").trigger(processingTime="500 milliseconds")
                   .option("checkpointLocation", str(checkpoints / name)).start()
                   for name, df in (("stats", stats), ("windows", windows))]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(len(q.recentProgress) < 3 for q in queries):
            time.sleep(0.5)
        for q in queries:
            q.stop()
    finally:
        spark.stop()
        shutil.rmtree(checkpoints, ignore_errors=True)
        # The JVM exits when its standard input closes, and writes the archive as it does.
        jvm.stdin.close()
        jvm.wait(120)


def main() -> int:
    """Make the archive unless it exists (exit 0), or say why it could not (exit 1: Spark then starts without it)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    jars_dir = PipelineSettings().jars_dir
    path = archive_path(jars_dir, connector_jars(jars_dir))
    if path.is_file():
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob("*.jsa*"):
        stale.unlink()
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    started = time.monotonic()
    # Spark's and the JVM's own lines go to a log beside the archive; only the outcome is shown.
    training_log = path.with_name("training.log")
    shown = os.dup(1), os.dup(2)
    with open(training_log, "wb") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            _train(jars_dir, partial)
        except Exception:  # noqa: BLE001 — said below, with the log that has the rest
            log.exception("the training session failed")
        finally:
            os.dup2(shown[0], 1)
            os.dup2(shown[1], 2)
    if not partial.is_file():
        log.error("the JVM wrote no class archive (see %s): the Spark driver starts without one", training_log)
        return 1
    partial.rename(path)
    log.info("the Spark driver's class archive: %s (%.0f MB, made in %.0f s)", path.name,
             path.stat().st_size / 1e6, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())

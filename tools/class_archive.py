"""Make the class archives of the Spark driver and the embedded broker (:mod:`freshroute.class_archive`).

``python -m tools.class_archive``: for each archive not made yet, a training run does that JVM's usual work — a
Spark session runs JSON in and out, a stateful aggregation in RocksDB and windows with a watermark; a broker
starts, takes a topic and some records, and stops — and the JVM writes every class it loaded as it exits. ``./dev``
runs it after resolving the jars (``./dev up`` in the background, once the stack serves); the first time takes about
40 s, later ones nothing; ``--check`` only says whether both are made. Spark's and the JVMs' own
lines go to ``training.log`` beside the archives; only the outcome is shown.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from freshroute import class_archive
from pipeline.session import build_session, driver_archive
from pipeline.settings import PipelineSettings
from tools.local import broker
from tools.local.services import free_port

log = logging.getLogger("class-archive")


def train_spark_driver(jars_dir: Path, out: Path) -> None:
    """A Spark session whose JVM writes the classes it loaded to ``out`` as it exits, having done the pipeline's
    kinds of work."""
    from pyspark import SparkContext
    from pyspark.sql import functions as F

    checkpoints = out.parent / f"training-{os.getpid()}"
    settings = PipelineSettings(jars_dir=jars_dir, spark_master="local[2]", shuffle_partitions=2)
    spark = build_session(settings, java_options="".join(f" {o}" for o in class_archive.making(out)))
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


def train_broker(jars_dir: Path, out: Path) -> None:
    """A one-node broker on a free loopback port that takes a topic and some records, then stops cleanly: its JVM
    writes the classes it loaded to ``out`` as it exits."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    home = out.parent / f"training-broker-{os.getpid()}"
    node = broker.BrokerNode(1, "127.0.0.1", free_port(), free_port(), home)
    proc = subprocess.Popen(broker.prepare(node, broker.Quorum.of(broker.new_cluster_id(), (node,)), jars_dir,
                                           java_options=class_archive.making(out)))
    try:
        quiet = {"bootstrap.servers": node.address, "log_level": 0}
        admin = AdminClient(quiet)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                admin.create_topics([NewTopic("training", 2, 1)])["training"].result(5)
                break
            except Exception:  # noqa: BLE001 — not up yet
                time.sleep(0.2)
        producer = Producer({**quiet, "enable.idempotence": True})
        for i in range(100):
            producer.produce("training", key=str(i).encode(), value=b"x")
        producer.flush(10)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's (and its children's) standard output and error written to ``path`` meanwhile."""
    shown = os.dup(1), os.dup(2)
    with open(path, "ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(shown[0], 1)
            os.dup2(shown[1], 2)


def make(path: Path, train: Callable[[Path], None]) -> bool:
    """Make the archive at ``path`` by ``train`` unless it exists; whether it is there now."""
    if path.is_file():
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name.rsplit("-", 1)[0]
    for stale in path.parent.glob(f"{name}-*.jsa*"):
        stale.unlink()
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    training_log = path.with_name("training.log")
    log.info("making class archive %s (once: its JVM then starts in about half the time)", name)
    started = time.monotonic()
    with _output_to(training_log):
        try:
            train(partial)
        except Exception:  # noqa: BLE001 — said below, with the log that has the rest
            log.exception("the training run of %s failed", name)
    if not partial.is_file():
        log.error("the JVM wrote no %s class archive (see %s): it starts without one", name, training_log)
        return False
    partial.rename(path)
    log.info("class archive %s: %.0f MB, made in %.0f s", path.name, path.stat().st_size / 1e6,
             time.monotonic() - started)
    return True


def main(argv: list[str] | None = None) -> int:
    """Make every archive not made yet; exit 1 if one could not be (its JVM then only starts slower). With
    ``--check``, make none: exit 1 if one is missing."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    jars_dir = PipelineSettings().jars_dir
    archives = {driver_archive(jars_dir): lambda out: train_spark_driver(jars_dir, out),
                broker.archive(jars_dir): lambda out: train_broker(jars_dir, out)}
    if "--check" in (sys.argv[1:] if argv is None else argv):
        return 0 if all(path.is_file() for path in archives) else 1
    made = [make(path, train) for path, train in archives.items()]
    return 0 if all(made) else 1


if __name__ == "__main__":
    sys.exit(main())

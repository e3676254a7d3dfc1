"""The pipeline's Spark session: settings whose effect shows only hours later, checked at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# One Spark session for both tests (a session's start is most of their time), no pipeline, no broker: settings read
# back, no timing held to a bound. They run in the background lane with the pipeline modules of end results
# (./dev test), not in the foreground's turn.
pytestmark = [pytest.mark.integration, pytest.mark.beside]

_PROBE = textwrap.dedent('''
    from pipeline.session import build_session
    from pipeline.settings import PipelineSettings

    spark = build_session(PipelineSettings(spark_conf={"spark.sql.streaming.stateStore.minDeltasForSnapshot": "7"}))
    jvm = spark.sparkContext._jvm
    for key in ("spark.shuffle.streaming.networkBufferMaxWaitTimeMs",
                "spark.sql.streaming.stateStore.minDeltasForSnapshot"):
        print(key, spark.conf.get(key))
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    # What RocksDB's snapshot upload asks for: a ClassCastException unless the class is a LocalFileSystem.
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf)
    print("local file system:", local.getClass().getName())
    args = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    print("jit:", "client" if "-XX:TieredStopAtLevel=1" in list(args) else "tiered")
''')

_JVM_KAFKA = textwrap.dedent('''
    from pipeline.sources import kafka_stream

    df = kafka_stream(spark, PipelineSettings(), "readings")
    print("columns:", ",".join(df.columns), "streaming:", df.isStreaming)
    spark.stop()
''')


@pytest.fixture(scope="module")
def session_output(tmp_path_factory) -> subprocess.CompletedProcess:
    """The probe, then the Kafka source read through the same session (the settings the source is given are the
    default ones, as a pipeline's): what the process printed."""
    return subprocess.run([sys.executable, "-c", _PROBE + _JVM_KAFKA], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path_factory.mktemp("session"))


@pytest.mark.timeout(300)
def test_the_local_file_system_is_the_one_rocksdb_snapshot_uploads_need(session_output):
    out = session_output
    assert out.returncode == 0, out.stderr[-3000:]
    assert "local file system: " in out.stdout, out.stderr[-3000:]
    # The suite's pipelines run the client compiler only (FRESHROUTE_SPARK_JIT, tests/integration/conftest.py).
    assert "jit: client" in out.stdout, out.stdout
    # A Real-time shuffle sends a partly filled buffer on after 1 ms, not Spark's 50; spark_conf adds settings.
    assert "spark.shuffle.streaming.networkBufferMaxWaitTimeMs 1\n" in out.stdout, out.stdout
    assert "spark.sql.streaming.stateStore.minDeltasForSnapshot 7\n" in out.stdout, out.stdout


@pytest.mark.timeout(300)
def test_the_session_reads_kafka_through_sparks_own_connector(session_output):
    out = session_output
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == ("columns: _freshroute_raw_key,_freshroute_raw_value,key,topic,partition,"
                                                   "offset,timestamp streaming: True")

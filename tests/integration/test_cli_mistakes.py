"""A user's mistakes at the command line end in one named error, exit 2, no traceback, and nothing left running.

Each case runs the real ``freshroute`` command against addresses where nothing listens (or a path that cannot be a
data directory): the broker, Redis and router a newcomer forgot to start.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from tools.local.services import free_port

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no pipeline (a short Spark analysis at most), no shared stack

# Each command gives up on what does not answer within its own timeout (10 s or less); far past that it hangs.
HANG_S = 90
ONE_LINE = re.compile(r"^freshroute: ([A-Z_]+): (.+)$", re.M)


def freshroute(*args: str, timeout_s: float = 60.0) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "FRESHROUTE_REDIS_URL": nowhere_redis()})
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, out + err, time.monotonic() - started


def nowhere_redis() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


def nowhere() -> str:
    return f"127.0.0.1:{free_port()}"


def named(output: str) -> tuple[str, str]:
    assert "Traceback" not in output, output
    m = ONE_LINE.search(output)
    assert m, output
    return m.group(1), m.group(2)


class Started:
    """A ``freshroute`` command run on a thread of its own from now on; ``outcome()`` is what ``freshroute`` returned
    (or raised), its time counted to its own end."""

    def __init__(self, *args: str) -> None:
        self._got: tuple[int, str, float] | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=args, daemon=True)
        self._thread.start()

    def _run(self, *args: str) -> None:
        try:
            self._got = freshroute(*args)
        except BaseException as e:  # noqa: BLE001 — raised in the test that reads it
            self._got = e

    def join(self) -> None:
        self._thread.join(HANG_S)

    def outcome(self) -> tuple[int, str, float]:
        self.join()
        if isinstance(self._got, BaseException):
            raise self._got
        assert self._got is not None, "the command did not end"
        return self._got


@pytest.fixture(scope="module", autouse=True)
def without_a_broker(redis_service, tmp_path_factory):
    """The two commands that wait out their broker timeout (10 s each), started together as the module starts: they
    wait beside each other and beside the module's first tests, not one after the other (about 20 s of the module's
    time). By test: the broker address it was given, its checkpoint directory (the pipeline's), and the command."""
    table_broker, pipeline_broker = nowhere(), nowhere()
    namespace = f"t{uuid.uuid4().hex[:10]}"
    checkpoint = tmp_path_factory.mktemp("pipeline-without-a-broker") / "checkpoint"
    started = {
        "table add": (table_broker, None,
                      Started("table", "add", "orders", "--topic", "orders", "--bootstrap-servers", table_broker,
                              "--redis-url", redis_service.address, "--namespace", namespace)),
        "pipeline": (pipeline_broker, checkpoint,
                     Started("pipeline", "--bootstrap-servers", pipeline_broker, "--redis-url", nowhere_redis(),
                             "--checkpoint-dir", str(checkpoint))),
    }
    yield started
    for _, _, command in started.values():  # a test deselected or failed early: its command still ends here
        command.join()


@pytest.mark.parametrize("data_dir, why", [("file", "is a file, not a directory"),
                                           ("file/below", "Not a directory")])
def test_a_store_node_whose_data_dir_cannot_hold_stores_says_so_before_it_listens(tmp_path, data_dir, why):
    (tmp_path / "file").write_text("not a directory")
    port = free_port()
    rc, out, took = freshroute("store-node", "--node-id", "n1", "--data-dir", str(tmp_path / data_dir),
                               "--port", str(port), "--bootstrap-servers", nowhere(), "--redis-url", nowhere_redis())
    code, message = named(out)
    assert (rc, code) == (2, "CONFIG_ERROR") and f"data_dir {tmp_path / data_dir}" in message and why in message, out
    assert took < HANG_S


def test_table_add_without_a_broker_names_the_broker_and_its_flag(without_a_broker):
    broker, _, started = without_a_broker["table add"]
    rc, out, took = started.outcome()
    code, message = named(out)
    assert (rc, code) == (2, "UNAVAILABLE") and f"the broker at {broker} (--bootstrap-servers)" in message, out
    assert took < HANG_S


def test_table_list_without_redis_names_redis_and_its_flag():
    redis = nowhere_redis()
    rc, out, _ = freshroute("table", "list", "--redis-url", redis)
    code, message = named(out)
    assert (rc, code) == (2, "UNAVAILABLE") and f"the metadata store at {redis} (--redis-url)" in message, out


def test_a_pipeline_without_a_broker_names_it_before_spark_starts(without_a_broker):
    broker, checkpoint, started = without_a_broker["pipeline"]
    rc, out, took = started.outcome()
    code, message = named(out)
    assert (rc, code) == (2, "UNAVAILABLE") and f"the broker at {broker} (bootstrap_servers)" in message, out
    assert not checkpoint.exists() and took < HANG_S


def test_a_direct_lookup_says_why_the_store_nodes_were_not_read_beside_the_routers_failure():
    redis, router = nowhere_redis(), f"http://{nowhere()}"
    rc, out, took = freshroute("lookup", "sensor_stats", "sensor-1", "--direct", "--redis-url", redis,
                               "--router", router)
    assert rc == 2 and "Traceback" not in out, out
    import orjson

    error = orjson.loads(out.strip().splitlines()[-1])["error"]
    assert error["code"] == "REPLICA_UNAVAILABLE" and router in error["message"], error
    assert "metadata store (Redis, 127.0.0.1:" in error["direct_failure"], error
    assert took < HANG_S


BROKEN = {
    "key": ('''
        from pyspark.sql import functions as F
        from pipeline.tables import source, table

        source("orders", schema="order_id STRING, customer STRING, amount DOUBLE")

        @table(name="by_device", key="device", source="orders")
        def by_device(orders):
            return orders.groupBy("customer").agg(F.count("amount").alias("orders"))
    ''', "table 'by_device' in {path}: key column 'device' is not among its columns ['customer', 'orders']"),
    "sql": ('''
        from pipeline.tables import source, sql_table

        source("orders", schema="order_id STRING, customer STRING, amount DOUBLE")
        sql_table(name="by_region", key="region", source="orders",
                  sql="SELECT region, count(*) AS orders FROM orders GROUP BY region")
    ''', "table 'by_region' in {path}: AnalysisException: [UNRESOLVED_COLUMN"),
    "history": ('''
        from pyspark.sql import functions as F
        from pipeline.tables import source, table

        source("orders", schema="order_id STRING, customer STRING, amount DOUBLE")

        @table(name="totals", key="customer", source="orders", history_retention="7d")
        def totals(orders):
            return orders.select("customer", "amount").groupBy("customer").agg(F.sum("amount").alias("total"))
    ''', "table 'totals' in {path} cannot keep a history: the rows it aggregates no longer have the source's "
        "timestamp column"),
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_local_up_refuses_a_table_that_cannot_be_built_before_anything_starts(tmp_path, broken):
    from tools.local.stack import Stack

    text, expected = BROKEN[broken]
    path = tmp_path / "tables.py"
    path.write_text(textwrap.dedent(text))
    home = tmp_path / "home"
    rc, out, took = freshroute("local", "up", "--home", str(home), "--tables-file", str(path), "--rest-port", "0",
                               "--grpc-port", "0", "--broker-port", "0", "--redis-port", "0", "--store-port", "0",
                               timeout_s=120)
    code, message = named(out)
    assert (rc, code) == (2, "TABLES_FILE_ERROR") and message.startswith(expected.format(path=path)), out[-2000:]
    # Refused before anything started: no broker, no component recorded, no component's log.
    assert took < HANG_S and "Apache Kafka" not in out and not (home / "logs").exists(), out[-2000:]
    assert not (home / "state.json").exists() or Stack.load(home).components == {}

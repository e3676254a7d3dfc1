"""A user's own tables file (DataFrame and SQL forms in one shared query) as a backfill; a changed table
recomputed, the keys it no longer produces tombstoned; starts that must refuse."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from pipeline.topics import ensure_topic
from tools.local.services import free_port, start_broker

from .backfill_support import TABLES, backfill, base_env
from .pipeline_support import PipelineProcess, materialize, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.beside]


@pytest.mark.timeout(900)
def test_backfill_of_a_user_tables_file_then_a_lost_changelog_is_refused(redis_url, namespace, tmp_path):
    """A backfill stops by itself with exact tables; recomputed with a changed table, the keys it no longer produces
    are tombstoned; after a broker restart the pipeline refuses to resume."""
    port = free_port()
    own_broker = start_broker(tmp_path / "broker-1", port=port)
    try:
        env = backfill(own_broker.address, redis_url, namespace, tmp_path)
        recompute_without_two_customers(own_broker.address, env, namespace, tmp_path)
        # A table added to the query: its checkpoint holds the other two tables' state only.
        grown = tmp_path / "grown_tables.py"
        grown.write_text(TABLES + textwrap.dedent('''
            sql_table(name="big_orders", key="customer", source="orders", query="orders",
                      sql="SELECT customer, count(*) AS n FROM orders WHERE amount > 400 GROUP BY customer")
        '''))
        refused = PipelineProcess({**env, "FRESHROUTE_TABLES_FILE": str(grown), "FRESHROUTE_AVAILABLE_NOW": "false"},
                                  tmp_path / "pipeline-grown.log")
        assert refused.wait_exit(60) == 2, refused.tail()
        text = refused.log.read_text()
        assert (f"QUERY_CHANGED: query 'orders': its checkpoint {tmp_path / 'checkpoints' / 'orders'} was written "
                f"for tables ['customer_totals', 'orders_per_minute'], and the tables file now puts ['big_orders', "
                f"'customer_totals', 'orders_per_minute'] in it.") in text
        assert "Traceback" not in text
    finally:
        own_broker.stop()

    # The broker restarts and comes back empty: resuming would publish only keys that change from
    # now on, so the pipeline stops before Spark even starts, naming the checkpoint to delete.
    restarted = start_broker(tmp_path / "broker-2", port=port)
    try:
        resumed = PipelineProcess({**env, "FRESHROUTE_AVAILABLE_NOW": "false"}, tmp_path / "pipeline-2.log")
        assert resumed.wait_exit(60) == 2, resumed.tail()
        text = resumed.log.read_text()
        assert (f"CHANGELOG_LOST: changelog topic {namespace}customer_totals-changelog does not exist, but the "
                f"checkpoint {tmp_path / 'checkpoints' / 'orders'} records") in text
        assert "Traceback" not in text
    finally:
        restarted.stop()


def recompute_without_two_customers(broker: str, env: dict[str, str], namespace: str, tmp_path: Path) -> None:
    """The query's checkpoint deleted and customer_totals changed to leave out c0 and c1: once the recomputation has
    read the input to its end, those two keys are tombstoned in the batch that does; every other key is recomputed."""
    import shutil

    before = materialize(read_topic(broker, f"{namespace}customer_totals-changelog"))
    assert {"c0", "c1"} <= set(before)
    changed = tmp_path / "changed_tables.py"
    changed.write_text(TABLES.replace(
        '@table(name="customer_totals", key="customer", source="orders", query="orders")',
        '@table(name="customer_totals", key="customer", source="orders", query="orders", stale_keys="tombstone")'
    ).replace('return orders.groupBy("customer")', 'return orders.where("customer NOT IN (\'c0\', \'c1\')").groupBy("customer")'))
    checkpoint = tmp_path / "checkpoints" / "orders"
    shutil.rmtree(checkpoint)
    run = PipelineProcess({**env, "FRESHROUTE_TABLES_FILE": str(changed)}, tmp_path / "pipeline-recomputed.log")
    assert run.wait_exit(600) == 0, run.tail()
    text = run.log.read_text()
    assert ("table customer_totals: the recomputation caught up with its input, and 2 key(s) it no longer produces "
            "are tombstoned: c0, c1") in text, run.tail()
    assert "table orders_per_minute: the recomputation caught up with its input; every key it held it produces again" \
        in text
    assert orjson.loads((checkpoint / "recomputation.done.json").read_bytes()) == {
        "stale_keys": {"customer_totals": 2, "orders_per_minute": 0}}
    after = materialize(read_topic(broker, f"{namespace}customer_totals-changelog"))
    assert after == {k: v for k, v in before.items() if k not in ("c0", "c1")}


def test_a_broken_tables_file_stops_the_process_naming_file_and_line(broker, redis_url, namespace, tmp_path):
    tables_file = tmp_path / "broken.py"
    tables_file.write_text(textwrap.dedent('''
        from pipeline.tables import source, sql_table

        source("orders", schema="customer STRING")
        sql_table(name="t", key="customer", source="order", sql="SELECT customer, count(*) AS n FROM order")
    '''))
    env = {**base_env(broker, redis_url, namespace, tmp_path), "FRESHROUTE_TABLES_FILE": str(tables_file)}
    broken = PipelineProcess(env, tmp_path / "pipeline.log")
    assert broken.wait_exit(60) == 2, broken.tail()
    text = broken.log.read_text()
    assert f"TABLES_FILE_ERROR: tables file {tables_file}: table 't' reads source 'order', which is not declared" in text
    assert "Traceback" not in text


def test_a_changelog_replication_factor_above_the_broker_count_stops_the_pipeline_before_spark(
        broker, redis_url, namespace, tmp_path):
    env = {**base_env(broker, redis_url, namespace, tmp_path), "FRESHROUTE_CHANGELOG_REPLICATION_FACTOR": "3",
           "FRESHROUTE_CHANGELOG_MIN_INSYNC_REPLICAS": "2"}
    started = time.monotonic()
    refused = PipelineProcess(env, tmp_path / "pipeline.log")
    assert refused.wait_exit(60) == 2, refused.tail()
    text = refused.log.read_text()
    assert ("CONFIG_ERROR: changelog_replication_factor 3 is above the cluster's 1 broker(s)" in text), text[-2000:]
    assert "Traceback" not in text and "spark session ready" not in text
    assert time.monotonic() - started < 30
    refused.wait_group_gone(30)
    assert not AdminClient({"bootstrap.servers": broker}).list_topics(timeout=10).topics.get(
        f"{namespace}sensor_stats-changelog")


def test_a_spark_master_that_does_not_answer_stops_the_pipeline_naming_the_setting(broker, redis_url, namespace,
                                                                                  tmp_path):
    dead = free_port()
    ensure_topic(AdminClient({"bootstrap.servers": broker}), f"{namespace}readings", 4)
    env = {**base_env(broker, redis_url, namespace, tmp_path), "FRESHROUTE_SPARK_MASTER": f"spark://127.0.0.1:{dead}"}
    refused = PipelineProcess(env, tmp_path / "pipeline.log")
    assert refused.wait_exit(60) == 2, refused.tail()
    text = refused.log.read_text()
    assert f"CONFIG_ERROR: spark_master: no Spark master answers at spark://127.0.0.1:{dead}" in text, text[-2000:]
    assert "Traceback" not in text and "spark session ready" not in text
    refused.wait_group_gone(30)


def test_an_input_topic_that_does_not_exist_stops_the_pipeline_naming_it_and_creates_nothing(
        broker, redis_url, namespace, tmp_path):
    env = base_env(broker, redis_url, namespace, tmp_path)
    refused = PipelineProcess(env, tmp_path / "pipeline.log")
    assert refused.wait_exit(60) == 2, refused.tail()
    text = refused.log.read_text()
    assert (f"INPUT_TOPIC_MISSING: source 'readings': input topic {namespace}readings does not exist on {broker}; "
            f"create it, fix the name in ") in text, text[-2000:]
    assert "Traceback" not in text and "spark session ready" not in text
    refused.wait_group_gone(30)
    topics = AdminClient({"bootstrap.servers": broker}).list_topics(timeout=10).topics
    assert not [t for t in topics if t.startswith(namespace)], topics

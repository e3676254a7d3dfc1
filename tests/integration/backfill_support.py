"""A user's own tables file (DataFrame and SQL forms in one shared query) over orders in the broker, run as a
backfill and checked against a recomputation: the start of the tests that change its tables."""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import time
from collections import defaultdict
from pathlib import Path

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from freshroute.keys import partition_for
from freshroute.metadata.store import MetadataStore
from pipeline.topics import ensure_topic

from .pipeline_support import PipelineProcess, materialize, mismatches, read_topic

TABLES = '''
from pyspark.sql import functions as F

from pipeline.tables import source, sql_table, table

source("orders", schema="customer STRING, amount DOUBLE, items INT", topic="shop-orders")


@table(name="customer_totals", key="customer", source="orders", query="orders")
def customer_totals(orders):
    return orders.groupBy("customer").agg(F.sum("items").alias("items"), F.max("amount").alias("largest"))


sql_table(name="orders_per_minute", key="minute", source="orders", query="orders", sql="""
    SELECT date_format(window.start, "yyyy-MM-dd'T'HH:mm") AS minute, count(*) AS orders, sum(amount) AS revenue
    FROM orders
    GROUP BY window(timestamp, '1 minute')
""")
'''


def base_env(broker: str, redis_url: str, namespace: str, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "FRESHROUTE_BOOTSTRAP_SERVERS": broker, "FRESHROUTE_REDIS_URL": redis_url,
            "FRESHROUTE_NAMESPACE": namespace, "FRESHROUTE_TOPIC_PREFIX": namespace,
            "FRESHROUTE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "FRESHROUTE_CHANGELOG_PARTITIONS": "4",
            # A backfill runs micro-batches; the runs after it keep the shared queries it wrote.
            "FRESHROUTE_PIPELINE_MODE": "microbatch"}


def backfill(broker: str, redis_url: str, namespace: str, tmp_path: Path) -> dict[str, str]:
    """Orders into the broker, a backfill run over them, and the tables checked against a recomputation."""
    tables_file = tmp_path / "shop_tables.py"
    tables_file.write_text(TABLES)
    topic = f"{namespace}shop-orders"
    ensure_topic(AdminClient({"bootstrap.servers": broker}), topic, 3)
    rng = random.Random(5)
    start_ms = (int(time.time()) // 60 - 10) * 60_000  # ten minutes ago, on a minute boundary
    p = Producer({"bootstrap.servers": broker, "linger.ms": 10, "enable.idempotence": True})
    orders = []
    for i in range(2000):
        order = {"customer": f"c{rng.randrange(40)}", "amount": round(rng.uniform(1, 500), 2), "items": rng.randrange(1, 9)}
        ts = start_ms + i * 150  # 2000 orders over 5 minutes
        p.produce(topic, key=order["customer"].encode(), value=orjson.dumps(order), timestamp=ts)
        orders.append((ts, order))
    assert p.flush(30) == 0

    env = {**base_env(broker, redis_url, namespace, tmp_path), "FRESHROUTE_TABLES_FILE": str(tables_file),
           "FRESHROUTE_AVAILABLE_NOW": "true", "FRESHROUTE_MAX_RECORDS_PER_BATCH": "1200"}
    run = PipelineProcess(env, tmp_path / "pipeline.log")
    assert run.wait_exit(600) == 0, run.tail()
    # Both tables ran as one query: one checkpoint, which records them; beside it, the tables file that defined them
    # and their version records.
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == [".definitions", ".versions.json", "orders"]
    copy, = (tmp_path / "checkpoints" / ".definitions").iterdir()
    assert copy.read_text() == TABLES
    assert orjson.loads((tmp_path / "checkpoints" / "orders" / "freshroute-tables.json").read_bytes()) == {
        "tables": ["customer_totals", "orders_per_minute"]}

    totals: dict[str, dict] = defaultdict(lambda: {"items": 0, "largest": -math.inf})
    minutes: dict[str, dict] = defaultdict(lambda: {"orders": 0, "revenue": 0.0})
    for ts, o in orders:
        totals[o["customer"]]["items"] += o["items"]
        totals[o["customer"]]["largest"] = max(totals[o["customer"]]["largest"], o["amount"])
        minute = dt.datetime.fromtimestamp(ts / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M")
        minutes[minute]["orders"] += 1
        minutes[minute]["revenue"] += o["amount"]
    assert len(minutes) == 5

    totals_log = read_topic(broker, f"{namespace}customer_totals-changelog")
    minutes_log = read_topic(broker, f"{namespace}orders_per_minute-changelog")
    assert mismatches(materialize(totals_log), dict(totals)) == []
    assert mismatches(materialize(minutes_log), dict(minutes)) == []
    assert all(p == partition_for(k, 4) for p, _o, _t, k, _v in totals_log + minutes_log)

    specs = MetadataStore.from_url(redis_url, namespace).tables()
    assert specs["customer_totals"].value_schema == {"items": "bigint", "largest": "double"}
    assert specs["orders_per_minute"].key_column == "minute"
    assert specs["orders_per_minute"].value_schema == {"orders": "bigint", "revenue": "double"}
    return env

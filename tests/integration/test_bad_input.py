"""Bad input never reaches a table: the real pipeline over a real broker, with the demo's tables and a user's source of
nested and decimal fields, fed every kind of bad record beside good ones.

The tables equal a recomputation over the valid records only (the keyed tables of one source agree), the
dead-letter topics hold exactly the bad records with their reasons and origin, the counters match, and a reading
stamped half an hour ahead, or an order whose own time field is ten years ahead, leaves each windowed table's
watermark where the real records put it.
"""

from __future__ import annotations

import os
import textwrap
import time
from collections import Counter

import httpx
import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tools.local.services import free_port
from freshroute.windows import WATERMARK_KEY, parse_watermark, split_window_key
from pipeline.topics import ensure_topic

from .cluster_support import scrape
from .pipeline_support import REPO, PipelineProcess, materialize, mismatches, read_topic
from .stack_fixture import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.beside]

ORDERS = textwrap.dedent('''

    source("orders", schema="order_id STRING NOT NULL, amount DECIMAL(10,2), customer STRUCT<name: STRING, score: DOUBLE>, "
                             "placed_at TIMESTAMP NOT NULL", topic="orders")

    sql_table(name="customer_totals", key="name", source="orders",
              sql="SELECT customer.name AS name, count(*) AS orders, sum(amount) AS total, max(customer.score) AS best "
                  "FROM orders GROUP BY customer.name")

    # Event time from a field of the record: one order placed years ahead must not move this table's watermark.
    sql_table(name="customer_hours", key="name", source="orders",
              window=tumbling("1 hour", retention="30 days", time="placed_at"),
              sql="SELECT customer.name AS name, window, count(*) AS orders FROM orders GROUP BY customer.name, window")
''')


def reading(sensor: str | None, area: str | None, value) -> bytes:
    doc = {"sensor": sensor, "area": area, "reading": value}
    return orjson.dumps({k: v for k, v in doc.items() if v is not None})


@pytest.mark.timeout(600)
def test_bad_records_are_dead_lettered_with_their_reason_and_the_tables_hold_only_the_good(broker, redis_url, namespace,
                                                                                           tmp_path):
    tables_file = tmp_path / "tables.py"
    tables_file.write_text((REPO / "pipeline" / "demo_tables.py").read_text() + ORDERS)
    admin = AdminClient({"bootstrap.servers": broker})
    ensure_topic(admin, f"{namespace}readings", 2, {"max.message.bytes": "3000000"})  # room for a too-large one
    ensure_topic(admin, f"{namespace}orders", 2)
    now = int(time.time() * 1000)
    sent: list[tuple[str, bytes | None, bytes | None, int]] = []  # (topic, key, value, timestamp)
    good: list[tuple[str, str, float, int]] = []
    for i in range(30):  # a clean sensor over the last minute: its windows must fill and become final
        good.append(("sensor-c", "cabin", float(i), now - 60_000 + 2_000 * i))
    for i in range(20):
        good.append(("sensor-a", "wheel", 1.0 + i, now - 30_000 + 1_000 * i))
    for sensor, area, value, ts in good:
        sent.append(("readings", sensor.encode(), reading(sensor, area, value), ts))
    bad_readings = {
        "non_finite": [b'{"sensor":"sensor-a","area":"wheel","reading":NaN}',
                       b'{"sensor":"sensor-a","area":"wheel","reading":Infinity}',
                       b'{"sensor":"sensor-a","area":"wheel","reading":1e999}'],
        "wrong_type": [b'{"sensor":"sensor-a","area":"wheel","reading":"abc"}'],
        "missing_field": [b'{"sensor":"sensor-a","area":"wheel","reading":null}', b'{"sensor":"sensor-a","area":"wheel"}',
                          b'{"area":"wheel","reading":5.0}'],
        "not_json": [b"not json", b"[1,2,3]", b'{"sensor":"sensor-a","area":"wh\xff","reading":1.0}', None],
        "too_large": [reading("sensor-a", "wheel", 1.0)[:-1] + b',"pad":"' + b"x" * 1_100_000 + b'"}'],
    }
    for values in bad_readings.values():
        for v in values:
            sent.append(("readings", b"sensor-a", v, now))
    # Half an hour ahead: past the source's 5 minutes of skew, within the hour Kafka's brokers take by default
    # (message.timestamp.after.max.ms); an event-time field could be years ahead.
    future = now + 30 * 60_000
    sent.append(("readings", b"sensor-a", reading("sensor-a", "wheel", 42.0), future))  # future_timestamp
    placed = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now / 1000)).encode()
    good_orders = [("o1", "12.50", "ann", 0.5), ("o2", "7.25", "ann", 0.9), ("o3", "100.00", "bob", 0.1)]
    for oid, amount, name, score in good_orders:
        sent.append(("orders", oid.encode(), b'{"order_id":"%s","amount":%s,"customer":{"name":"%s","score":%s},'
                     b'"placed_at":"%s"}' % (oid.encode(), amount.encode(), name.encode(), str(score).encode(), placed),
                     now))
    bad_orders = {"wrong_type": [b'{"order_id":"o4","amount":"abc","customer":{"name":"ann","score":1.0},'
                                 b'"placed_at":"%s"}' % placed,
                                 b'{"order_id":"o5","amount":1.00,"customer":"bob","placed_at":"%s"}' % placed],
                  "non_finite": [b'{"order_id":"o6","amount":3.00,"customer":{"name":"bob","score":NaN},'
                                 b'"placed_at":"%s"}' % placed],
                  "missing_field": [b'{"amount":3.00,"customer":{"name":"bob","score":0.2},"placed_at":"%s"}' % placed,
                                    b'{"order_id":"o7","amount":3.00,"customer":{"name":"bob","score":0.2}}'],
                  # Ten years ahead in the record's own time field (the broker takes the record: its timestamp is now).
                  "future_timestamp": [b'{"order_id":"o8","amount":3.00,"customer":{"name":"bob","score":0.2},'
                                       b'"placed_at":"2036-11-27T00:00:00Z"}']}
    for values in bad_orders.values():
        for v in values:
            sent.append(("orders", b"o-bad", v, now))
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 5, "message.max.bytes": 3_000_000})
    refused = []
    for topic, key, value, ts in sent:
        producer.produce(f"{namespace}{topic}", key=key, value=value, timestamp=ts,
                         on_delivery=lambda err, _m: refused.append(err) if err else None)
    assert producer.flush(30) == 0 and refused == []

    metrics_port = free_port()
    env = {**os.environ, "FRESHROUTE_BOOTSTRAP_SERVERS": broker, "FRESHROUTE_REDIS_URL": redis_url,
           "FRESHROUTE_NAMESPACE": namespace, "FRESHROUTE_TOPIC_PREFIX": namespace,
           "FRESHROUTE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "FRESHROUTE_CHANGELOG_PARTITIONS": "4",
           "FRESHROUTE_TABLES_FILE": str(tables_file), "FRESHROUTE_TRIGGER_MS": "200",
           # Its windows' watermarks are checked below, which a Real-time pipeline does not publish yet
           # (test_pipeline_realtime checks dead letters in Real-time Mode).
           "FRESHROUTE_PIPELINE_MODE": "microbatch",
           "FRESHROUTE_METRICS_PORT": str(metrics_port), "FRESHROUTE_METRICS_HOST": "127.0.0.1"}
    pipeline = PipelineProcess(env, tmp_path / "pipeline.log")
    want_counts = Counter({("readings", r): len(v) for r, v in bad_readings.items()})
    want_counts[("readings", "future_timestamp")] += 1
    want_counts.update({("orders", r): len(v) for r, v in bad_orders.items()})

    def counters() -> Counter:
        try:
            samples = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
        except httpx.TransportError:
            return Counter()  # the pipeline's metrics are not served yet
        return Counter({(s.labels["source"], s.labels["reason"]): int(s.value) for s in samples
                        if s.name == "freshroute_pipeline_rejected_records_total"})

    try:
        wait_until(lambda: counters() == want_counts, 240, "every bad record to be counted", check=pipeline.check)

        # The keyed tables hold the good records only, and agree with each other.
        stats = {sensor: [v for s, _, v, _ in good if s == sensor] for sensor in ("sensor-a", "sensor-c")}
        want_stats = {s: {"count": len(v), "sum": sum(v), "avg": sum(v) / len(v), "min": min(v), "max": max(v),
                          "last": v[-1]} for s, v in stats.items()}

        def tables_done() -> bool:
            return mismatches(materialize(read_topic(broker, f"{namespace}sensor_stats-changelog")), want_stats) == []

        wait_until(tables_done, 120, "sensor_stats to hold the good readings", check=pipeline.check)
        areas = materialize(read_topic(broker, f"{namespace}area_counts-changelog"))
        assert areas == {"cabin": {"count": 30}, "wheel": {"count": 20}}, areas
        # customer_totals is a query of its own (the orders' rejected records, counted above, are customer_hours'):
        # its first batch, which holds every order, is waited for on its own.
        totals_topic = f"{namespace}customer_totals-changelog"
        wait_until(lambda: set(materialize(read_topic(broker, totals_topic))) == {"ann", "bob"}, 120,
                   "customer_totals to hold its customers", check=pipeline.check)
        totals = materialize(read_topic(broker, totals_topic))
        assert totals == {"ann": {"orders": 2, "total": 19.75, "best": 0.9}, "bob": {"orders": 1, "total": 100.0,
                                                                                    "best": 0.1}}, totals

        # Each dead-letter topic holds exactly the bad records: their bytes, reason and origin.
        for topic, bad in (("readings", bad_readings), ("orders", bad_orders)):
            letters = read_topic(broker, f"{namespace}{topic}.rejected", headers=True)
            got = Counter((dict(h)["freshroute.reason"].decode(), v) for _p, _o, _t, _k, v, h in letters)
            # A too-large record's dead letter names it without its bytes (headers: origin and size).
            want = Counter((reason, None if reason == "too_large" else v) for reason, values in bad.items()
                           for v in values)
            if topic == "readings":
                want[("future_timestamp", reading("sensor-a", "wheel", 42.0))] += 1
            assert got == want, (topic, got - want, want - got)
            for _p, _o, ts, _k, _v, h in letters:
                origin = dict(h)
                assert origin["freshroute.source"] == topic.encode() and origin["freshroute.topic"] == \
                    f"{namespace}{topic}".encode() and int(origin["freshroute.offset"]) >= 0

        # The reading from half an hour ahead moved nothing: the watermark is where the real readings put it, and
        # the clean sensor's windows are there, the early ones final.
        def watermarks(topic: str) -> list:
            return [parse_watermark(v) for _p, _o, _t, k, v in read_topic(broker, topic) if k == WATERMARK_KEY]

        wait_until(lambda: watermarks(f"{namespace}sensor_windows-changelog") and
                   watermarks(f"{namespace}customer_hours-changelog"), 60, "both watermarks", check=pipeline.check)
        windows = read_topic(broker, f"{namespace}sensor_windows-changelog")
        marks = [parse_watermark(v) for _p, _o, _t, k, v in windows if k == WATERMARK_KEY]
        assert marks and now - 70_000 < max(marks) < now + 60_000, (marks, now)
        starts = {split_window_key(k)[1] for _p, _o, _t, k, v in windows
                  if k != WATERMARK_KEY and v is not None and split_window_key(k)[0] == b"sensor-c"}
        assert len(starts) >= 6 and min(starts) + 10_000 <= max(marks), (sorted(starts), marks)
        hours = read_topic(broker, f"{namespace}customer_hours-changelog")
        order_marks = [parse_watermark(v) for _p, _o, _t, k, v in hours if k == WATERMARK_KEY]
        assert order_marks and max(order_marks) < now + 60_000, (order_marks, now)
        counts = {split_window_key(k)[0]: orjson.loads(v)["orders"] for _p, _o, _t, k, v in hours
                  if k != WATERMARK_KEY and v is not None}
        assert counts == {b"ann": 2, b"bob": 1}, counts
        assert pipeline.alive()
    finally:
        pipeline.proc.terminate()
        pipeline.wait_exit(60)

"""The pipeline's Kafka source against the real broker, without Spark: true end offsets, exact ranges, data loss."""

from __future__ import annotations

import time

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from pipeline.kafka_source import (ARROW_SCHEMA, KafkaBatchReader, KafkaSlice, KafkaStreamReader, SourceOptions,
                                   close_idle_consumers, read_slice)
from pipeline.offsets import InputDataLost
from freshroute.local.services import free_port, start_broker
from pipeline.topics import describe_topic, ensure_topic

pytestmark = pytest.mark.integration


def produce_batched(bootstrap: str, topic: str, n: int, partitions: int) -> dict[int, list[tuple[int, bytes, bytes]]]:
    """n records spread over partitions, linger high enough that the producer batches them."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "enable.idempotence": True})
    sent: dict[int, list[tuple[int, bytes, bytes]]] = {i: [] for i in range(partitions)}

    def on_delivery(err, msg):
        assert err is None, err
        sent[msg.partition()].append((msg.offset(), msg.key(), msg.value()))

    for i in range(n):
        key = f"sensor-{i % 37}".encode()
        p.produce(topic, key=key, value=orjson.dumps({"sensor": key.decode(), "reading": float(i)}),
                  partition=i % partitions, on_delivery=on_delivery)
    assert p.flush(30) == 0
    return sent


@pytest.fixture
def admin(broker):
    return AdminClient({"bootstrap.servers": broker})


def reader_for(broker: str, topic: str, **kw) -> KafkaStreamReader:
    return KafkaStreamReader(SourceOptions(topic=topic, kafka={"bootstrap.servers": broker}, **kw))


@pytest.fixture(autouse=True)
def _no_idle_consumers_left():
    # Reads here run in this process; their pooled consumers must not outlive the broker.
    yield
    close_idle_consumers()


def test_initial_offset_creates_a_missing_input_topic(broker, admin, namespace):
    topic = f"{namespace}readings"
    r = reader_for(broker, topic, create_partitions=3)
    try:
        start = r.initialOffset()
    finally:
        r.stop()
    info = describe_topic(admin, topic)
    assert info is not None and info.partitions == (0, 1, 2)
    assert start == {"topic_id": info.topic_id, "partitions": {"0": 0, "1": 0, "2": 0}}


def test_latest_offset_is_the_true_end_even_when_list_offsets_lags(broker, admin, namespace):
    topic = f"{namespace}readings"
    ensure_topic(admin, topic, 3)
    sent = produce_batched(broker, topic, 1500, 3)
    true_end = {p: max(o for o, _, _ in recs) + 1 for p, recs in sent.items()}
    assert true_end == {0: 500, 1: 500, 2: 500}

    c = Consumer({"bootstrap.servers": broker, "group.id": "probe-check"})
    listed = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in range(3)}
    c.close()
    assert all(listed[p] <= true_end[p] for p in range(3))  # never above; on the embedded broker often below

    r = reader_for(broker, topic)
    try:
        start = r.initialOffset()
        began = time.monotonic()
        latest = r.latestOffset(start, ReadAllAvailable())
        elapsed = time.monotonic() - began
        assert latest["partitions"] == {"0": 500, "1": 500, "2": 500}
        assert elapsed < 3.0
        # Admission control on the same backlog: 300 rows split evenly.
        assert r.latestOffset(start, ReadMaxRows(300))["partitions"] == {"0": 100, "1": 100, "2": 100}
    finally:
        r.stop()


def test_read_returns_exactly_the_planned_ranges_in_the_declared_schema(broker, admin, namespace):
    topic = f"{namespace}readings"
    ensure_topic(admin, topic, 3)
    sent = produce_batched(broker, topic, 36_000, 3)
    r = reader_for(broker, topic, read_tasks=2)
    try:
        # Over 20,000 records: two read tasks (a smaller batch is read by one).
        start = {"topic_id": "", "partitions": {"0": 100, "1": 0, "2": 1_990}}
        end = {"topic_id": "", "partitions": {"0": 12_000, "1": 1, "2": 12_000}}
        slices = r.partitions(start, end)
    finally:
        r.stop()
    assert len(slices) == 2 and all(isinstance(s, KafkaSlice) for s in slices)
    rows = []
    for s in slices:
        for batch in read_slice(r.options, s):
            assert batch.schema.equals(ARROW_SCHEMA)
            assert batch.num_rows <= 8192
            rows.extend(batch.to_pylist())
    got = sorted((row["partition"], row["offset"], row["key"], row["value"]) for row in rows)
    want = sorted((p, o, k.decode(), v.decode()) for p, recs in sent.items() for o, k, v in recs
                  if int(start["partitions"][str(p)]) <= o < int(end["partitions"][str(p)]))
    assert len(got) == 11_900 + 1 + 10_010
    assert got == want
    assert all(row["topic"] == topic and row["timestamp"] is not None for row in rows)


def test_a_broker_that_lost_its_data_is_reported_not_skipped(tmp_path, namespace):
    """A memory-only broker restart: the topic comes back nearly empty, below the checkpoint."""
    topic = f"{namespace}readings"
    port = free_port()
    first = start_broker(tmp_path / "broker-1", port=port)
    try:
        r = reader_for(first.address, topic, create_partitions=2)
        start = r.initialOffset()
        produce_batched(first.address, topic, 200, 2)
        checkpoint = r.latestOffset(start, ReadAllAvailable())
        assert checkpoint["partitions"] == {"0": 100, "1": 100}
        # Clients are closed before the broker goes: librdkafka may crash when a topic it
        # holds assigned vanishes and comes back, which is not what this test is about.
        r.stop()
    finally:
        first.stop()
    second = start_broker(tmp_path / "broker-2", port=port)
    try:
        r = reader_for(second.address, topic, create_partitions=2,
                       hint="To reprocess from the start, delete the checkpoint.")
        try:
            with pytest.raises(InputDataLost) as e:
                r.latestOffset(checkpoint, ReadAllAvailable())
        finally:
            r.stop()
        assert "delete the checkpoint" in e.value.message
        assert "disappeared" in e.value.message or "recreated" in e.value.message
    finally:
        second.stop()


def test_batch_reader_reads_everything_the_topic_holds_now(broker, admin, namespace):
    topic = f"{namespace}readings"
    ensure_topic(admin, topic, 3)
    sent = produce_batched(broker, topic, 21_000, 3)
    reader = KafkaBatchReader(SourceOptions(topic=topic, kafka={"bootstrap.servers": broker}, read_tasks=2))
    slices = reader.partitions()
    assert len(slices) == 2  # over 20,000 records: two tasks
    got = sorted((row["partition"], row["offset"]) for s in slices for b in reader.read(s) for row in b.to_pylist())
    assert got == sorted((p, o) for p, recs in sent.items() for o, _k, _v in recs)
    with pytest.raises(ValueError, match="does not exist"):
        KafkaBatchReader(SourceOptions(topic=f"{namespace}nope", kafka={"bootstrap.servers": broker})).partitions()

"""The Kafka source's reader without a broker: options, admission control, Available-now, pickling, Arrow rows.

The broker is replaced at the reader's one seam, :meth:`KafkaStreamReader.snapshot`, and
the end-offset probe gets a fake consumer that behaves like the embedded broker (its
ListOffsets answer is below the true end; the Fetch watermark is right).
"""

from __future__ import annotations

import logging
import pickle
import time

import pytest
from confluent_kafka import KafkaError, TopicPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import (IntegerType, LongType, StringType, StructField, StructType, TimestampType)

from pipeline import kafka_source
from pipeline.kafka_source import (ARROW_SCHEMA, SCHEMA, EndOffsetProbe, KafkaSlice, KafkaSource, KafkaStreamReader,
                                   SourceOptions, _Columns, read_ranges, read_slice)
from pipeline.offsets import InputDataLost, TopicSnapshot


class ScriptedReader(KafkaStreamReader):
    """A reader whose broker view is a list of snapshots, one per call."""

    def __init__(self, options: SourceOptions, snapshots: list[TopicSnapshot]) -> None:
        super().__init__(options)
        self.snapshots = snapshots
        self.calls = 0

    def snapshot(self, create: bool) -> TopicSnapshot | None:
        snap = self.snapshots[min(self.calls, len(self.snapshots) - 1)]
        self.calls += 1
        return snap


def opts(**kw) -> SourceOptions:
    return SourceOptions(topic="readings", kafka={"bootstrap.servers": "127.0.0.1:1"}, **kw)


def test_options_parse_from_spark_string_options():
    o = SourceOptions.from_options({"topic": "t", "kafka": '{"bootstrap.servers": "h:1"}', "max_records_per_batch": "500",
                                    "create_partitions": "6", "read_tasks": "3", "hint": "delete /ck"})
    assert o == SourceOptions(topic="t", kafka={"bootstrap.servers": "h:1"}, max_records_per_batch=500,
                              create_partitions=6, read_tasks=3, hint="delete /ck")
    assert SourceOptions.from_options({"topic": "t", "max_records_per_batch": "0"}).max_records_per_batch is None
    with pytest.raises(ValueError, match="topic"):
        SourceOptions.from_options({})


def test_consumer_config_never_commits_and_bounds_partition_fetches():
    c = opts().consumer_config()
    assert c["enable.auto.commit"] is False and c["enable.auto.offset.store"] is False
    assert c["enable.partition.eof"] is True and c["fetch.queue.backoff.ms"] == 0
    assert c["max.partition.fetch.bytes"] == 1 << 20
    assert c["bootstrap.servers"] == "127.0.0.1:1"


def test_default_read_limit_is_admission_control_when_configured():
    assert KafkaStreamReader(opts(max_records_per_batch=100)).getDefaultReadLimit() == ReadMaxRows(100)
    assert isinstance(KafkaStreamReader(opts()).getDefaultReadLimit(), ReadAllAvailable)


def test_latest_offset_honours_max_rows_and_all_available():
    snap = TopicSnapshot("tid", low={0: 0, 1: 0}, end={0: 1000, 1: 1000})
    r = ScriptedReader(opts(max_records_per_batch=100), [snap])
    start = {"topic_id": "tid", "partitions": {"0": 0, "1": 0}}
    assert r.latestOffset(start, ReadMaxRows(100)) == {"topic_id": "tid", "partitions": {"0": 50, "1": 50}}
    # The engine may ask for everything even when a default limit exists (e.g. a trigger's semantics).
    assert r.latestOffset(start, ReadAllAvailable()) == {"topic_id": "tid", "partitions": {"0": 1000, "1": 1000}}
    assert r.reportLatestOffset() == {"topic_id": "tid", "partitions": {"0": 1000, "1": 1000}}


def test_available_now_stops_at_the_end_seen_when_prepared():
    before = TopicSnapshot("tid", low={0: 0}, end={0: 300})
    after = TopicSnapshot("tid", low={0: 0}, end={0: 900})
    r = ScriptedReader(opts(), [before, after])
    r.prepareForTriggerAvailableNow()
    start = {"topic_id": "tid", "partitions": {"0": 0}}
    first = r.latestOffset(start, ReadMaxRows(200))
    assert first["partitions"] == {"0": 200}
    second = r.latestOffset(first, ReadMaxRows(200))
    assert second["partitions"] == {"0": 300}
    assert r.latestOffset(second, ReadMaxRows(200)) == second  # nothing more: the query can finish


def test_latest_offset_reports_a_broker_that_lost_data():
    r = ScriptedReader(opts(hint="To reprocess from the start, delete /ck."),
                       [TopicSnapshot("tid", low={0: 0}, end={0: 12})])
    with pytest.raises(InputDataLost, match=r"ends at offset 12, below the checkpoint's 40.*delete /ck"):
        r.latestOffset({"topic_id": "tid", "partitions": {"0": 40}}, ReadAllAvailable())


def test_latest_offset_reports_a_topic_that_vanished_after_progress():
    r = ScriptedReader(opts(), [None])  # type: ignore[list-item]
    with pytest.raises(InputDataLost, match="disappeared"):
        r.latestOffset({"topic_id": "tid", "partitions": {"0": 40}}, ReadAllAvailable())


def test_partitions_group_ranges_into_read_tasks():
    r = KafkaStreamReader(opts(read_tasks=2))
    slices = r.partitions({"topic_id": "t", "partitions": {"0": 0, "1": 10, "2": 5, "3": 9}},
                          {"topic_id": "t", "partitions": {"0": 20_000, "1": 20, "2": 20_050, "3": 9}})
    assert [s.ranges for s in slices] == [((2, 5, 20_050),), ((0, 0, 20_000), (1, 10, 20))]
    assert all(isinstance(s, KafkaSlice) and s.topic == "readings" for s in slices)


def test_a_small_batch_is_read_by_one_task():
    r = KafkaStreamReader(opts(read_tasks=2))
    slices = r.partitions({"topic_id": "t", "partitions": {"0": 0, "1": 10, "2": 5, "3": 9}},
                          {"topic_id": "t", "partitions": {"0": 100, "1": 20, "2": 50, "3": 9}})
    assert [s.ranges for s in slices] == [((0, 0, 100), (1, 10, 20), (2, 5, 50))]
    assert r.partitions({"topic_id": "t", "partitions": {"0": 5}}, {"topic_id": "t", "partitions": {"0": 5}}) == []


def test_reader_pickles_without_its_kafka_clients():
    r = KafkaStreamReader(opts())
    r._admin = object()
    r._probe = object()  # type: ignore[assignment]
    clone = pickle.loads(pickle.dumps(r))
    assert clone._admin is None and clone._probe is None
    assert clone.options == r.options
    assert r._admin is not None  # the original keeps its clients


def test_declared_schema_is_the_arrow_schema_spark_checks_batches_against():
    spark_schema = StructType([StructField("key", StringType()), StructField("value", StringType()),
                               StructField("topic", StringType()), StructField("partition", IntegerType()),
                               StructField("offset", LongType()), StructField("timestamp", TimestampType())])
    assert KafkaSource({"topic": "t"}).schema() == SCHEMA
    assert SCHEMA == ", ".join(f"{f.name} {f.dataType.typeName().replace('integer', 'int')}" for f in spark_schema.fields)
    assert to_arrow_schema(spark_schema, timezone="UTC").equals(ARROW_SCHEMA)


class FakeMessage:
    def __init__(self, partition, offset, key=None, value=None, ts=(1, 0), error=None):
        self._p, self._o, self._k, self._v, self._ts, self._e = partition, offset, key, value, ts, error

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def key(self):
        return self._k

    def value(self):
        return self._v

    def timestamp(self):
        return self._ts

    def error(self):
        return self._e


def test_rows_become_an_arrow_batch_of_exactly_the_declared_schema():
    cols = _Columns()
    cols.add(FakeMessage(2, 41, b"sensor-1", b'{"reading": 1.5}', ts=(1, 1_700_000_000_123)))
    cols.add(FakeMessage(2, 42, None, None, ts=(0, -1)))
    cols.add(FakeMessage(2, 43, b"\xff", b"x", ts=(2, 5)))
    batch = cols.to_batch("readings", 2)
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [41, 42, 43]
    assert rows[0]["key"] == "sensor-1" and rows[0]["value"] == '{"reading": 1.5}'
    assert rows[0]["timestamp"].timestamp() == pytest.approx(1_700_000_000.123)
    assert rows[1]["key"] is None and rows[1]["value"] is None and rows[1]["timestamp"] is None
    assert rows[2]["key"] == "\ufffd"  # undecodable bytes never fail a batch
    assert {r["topic"] for r in rows} == {"readings"} and {r["partition"] for r in rows} == {2}


class TansuLikeConsumer:
    """ListOffsets answers the last batch's base offset + 1; a fetch brings the true watermark."""

    def __init__(self, true_end: dict[int, int], listed: dict[int, int], answering: set[int]):
        self.true_end, self.listed, self.answering = true_end, listed, answering
        self.assigned: list[TopicPartition] = []
        self.paused: set[int] = set()
        self.fetched: set[int] = set()
        self.unassigned = 0
        self.list_calls: list[int] = []
        self.starts: dict[int, int] = {}

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        if cached:
            return (0, self.true_end[tp.partition] if tp.partition in self.fetched else -1001)
        self.list_calls.append(tp.partition)
        return (0, self.listed[tp.partition])

    def assign(self, tps):
        self.assigned = list(tps)
        self.fetched = set()  # each assignment fetches anew
        self.starts = {tp.partition: tp.offset for tp in tps}

    def consume(self, num_messages=1, timeout=0.0):
        out = []
        for tp in self.assigned:
            p = tp.partition
            if p in self.answering and p not in self.fetched and p not in self.paused:
                self.fetched.add(p)
                if tp.offset < self.true_end[p]:
                    out.append(FakeMessage(p, tp.offset, b"k", b"v"))
                else:
                    out.append(FakeMessage(p, tp.offset, error=KafkaError(KafkaError._PARTITION_EOF)))
        return out[:num_messages] if out else out

    def pause(self, tps):
        self.paused.update(tp.partition for tp in tps)

    def resume(self, tps):
        self.paused.difference_update(tp.partition for tp in tps)

    def unassign(self):
        self.unassigned += 1
        self.assigned = []


def test_probe_finds_the_true_end_below_which_list_offsets_answers():
    consumer = TansuLikeConsumer(true_end={0: 334, 1: 0, 2: 333}, listed={0: 1, 1: 0, 2: 1}, answering={0, 1, 2})
    low, end, uncertain = EndOffsetProbe(consumer, "readings", timeout_s=1.0).ends((0, 1, 2))
    assert end == {0: 334, 1: 0, 2: 333}
    assert low == {0: 0, 1: 0, 2: 0}
    assert uncertain == frozenset()
    assert consumer.unassigned == 1 and consumer.paused == set()  # nothing left assigned or paused


def test_a_known_end_is_fetched_from_without_list_offsets_until_the_topic_changes():
    consumer = TansuLikeConsumer(true_end={0: 334, 1: 20}, listed={0: 1, 1: 20}, answering={0, 1})
    probe = EndOffsetProbe(consumer, "readings", timeout_s=1.0)
    assert probe.ends((0, 1), "id-1")[1] == {0: 334, 1: 20}
    assert sorted(consumer.list_calls) == [0, 1]
    consumer.true_end[0] = 400  # partition 0 grew, partition 1 did not
    low, end, uncertain = probe.ends((0, 1), "id-1")
    assert end == {0: 400, 1: 20} and low == {0: 0, 1: 0} and uncertain == frozenset()
    assert sorted(consumer.list_calls) == [0, 1]  # no ListOffsets: each fetch started at the known end
    assert consumer.starts == {0: 334, 1: 20}
    # A recreated topic (a new id) starts from nothing known: its partitions are listed again.
    consumer.true_end, consumer.listed = {0: 3, 1: 0}, {0: 1, 1: 0}
    assert probe.ends((0, 1), "id-2")[1] == {0: 3, 1: 0}
    assert sorted(consumer.list_calls) == [0, 0, 1, 1] and consumer.starts == {0: 0, 1: 0}


def test_a_known_end_above_the_brokers_watermark_gives_way_to_it():
    # Recreated under the same id (or by a broker without topic ids): the probe must report the
    # lower end, so that the source sees the checkpoint ahead of the topic, not an end that is gone.
    consumer = TansuLikeConsumer(true_end={0: 334}, listed={0: 1}, answering={0})
    probe = EndOffsetProbe(consumer, "readings", timeout_s=1.0)
    assert probe.ends((0,))[1] == {0: 334}
    consumer.true_end[0] = 5
    assert probe.ends((0,))[1:] == ({0: 5}, frozenset())
    assert consumer.list_calls == [0]


def test_a_known_partition_the_broker_leaves_unanswered_keeps_its_end_uncertain_and_is_listed_again():
    consumer = TansuLikeConsumer(true_end={0: 334}, listed={0: 1}, answering={0})
    probe = EndOffsetProbe(consumer, "readings", timeout_s=0.2)
    assert probe.ends((0,), "id")[1:] == ({0: 334}, frozenset())
    consumer.answering = set()
    consumer.true_end[0] = 340
    assert probe.ends((0,), "id")[1:] == ({0: 334}, frozenset({0}))  # a lower bound, as a listed end would be
    consumer.answering = {0}
    assert probe.ends((0,), "id")[1:] == ({0: 340}, frozenset())
    assert consumer.list_calls == [0, 0]  # the unanswered probe forgot what it knew


def test_probe_keeps_the_listed_end_marked_uncertain_when_the_broker_does_not_answer():
    consumer = TansuLikeConsumer(true_end={0: 334, 1: 50}, listed={0: 1, 1: 40}, answering={1})
    _, end, uncertain = EndOffsetProbe(consumer, "readings", timeout_s=0.2).ends((0, 1))
    assert end == {0: 1, 1: 50}
    assert uncertain == frozenset({0})


class LogConsumer:
    """A consumer over an in-memory log: fetches a few records of every assigned, unpaused partition at a time."""

    def __init__(self, log: dict[int, int], per_fetch: int = 3, fail_at: int | None = None):
        self.log, self.per_fetch, self.fail_at = log, per_fetch, fail_at
        self.position: dict[int, int] = {}
        self.paused: set[int] = set()
        self.closed = False
        self.max_assigned = 0

    def assign(self, tps):
        self.position = {tp.partition: tp.offset for tp in tps}
        self.max_assigned = max(self.max_assigned, len(tps))

    def consume(self, num_messages=1, timeout=0.0):
        out = []
        for p, pos in sorted(self.position.items()):
            if p in self.paused:
                continue
            for o in range(pos, min(pos + self.per_fetch, self.log[p])):
                if o == self.fail_at:
                    raise RuntimeError("broker went away")
                out.append(FakeMessage(p, o, b"k", b"v", ts=(1, 1000)))
            self.position[p] = min(pos + self.per_fetch, self.log[p])
            if self.position[p] == self.log[p]:
                out.append(FakeMessage(p, self.log[p], error=KafkaError(KafkaError._PARTITION_EOF)))
        return out[:num_messages]

    def pause(self, tps):
        self.paused.update(tp.partition for tp in tps)

    def resume(self, tps):
        self.paused.difference_update(tp.partition for tp in tps)

    def unassign(self):
        self.position = {}

    def close(self):
        self.closed = True


def test_a_slice_reads_its_ranges_at_once_and_exactly(monkeypatch):
    consumer = LogConsumer({0: 20, 1: 12, 2: 30})
    batches = list(read_ranges(consumer, opts(), "readings", ((0, 5, 17), (1, 0, 12), (2, 30, 30))))
    got = {}
    for b in batches:
        assert b.schema.equals(ARROW_SCHEMA) and len(set(b.column("partition").to_pylist())) == 1
        got.setdefault(b.column("partition")[0].as_py(), []).extend(b.column("offset").to_pylist())
    assert got == {0: list(range(5, 17)), 1: list(range(0, 12))}
    assert consumer.max_assigned == 2  # both non-empty ranges at once
    assert consumer.position == {} and consumer.paused == set()  # nothing left assigned or paused


def test_a_worker_reuses_its_consumer_only_after_a_complete_read(monkeypatch):
    made: list[LogConsumer] = []

    def factory(config):
        assert config["auto.offset.reset"] == "error" and config["enable.auto.commit"] is False
        made.append(LogConsumer({0: 100}, fail_at=50 if not made else None))
        return made[-1]

    monkeypatch.setattr("confluent_kafka.Consumer", factory)
    monkeypatch.setattr(kafka_source, "_idle_consumers", {})
    piece = KafkaSlice("readings", ((0, 0, 10),))
    assert sum(b.num_rows for b in read_slice(opts(), piece)) == 10
    assert sum(b.num_rows for b in read_slice(opts(), KafkaSlice("readings", ((0, 10, 20),)))) == 10
    assert len(made) == 1 and not made[0].closed  # the second read reused the first consumer
    with pytest.raises(RuntimeError, match="broker went away"):
        list(read_slice(opts(), KafkaSlice("readings", ((0, 40, 60),))))
    assert made[0].closed  # a failed read never hands its consumer on
    assert sum(b.num_rows for b in read_slice(opts(), KafkaSlice("readings", ((0, 60, 70),)))) == 10
    assert len(made) == 2 and not made[1].closed


class SlowBrokerConsumer(LogConsumer):
    """A broker that gathers records slower than ``short_ms``: a shorter fetch wait brings nothing after the first few."""

    def __init__(self, config, log, short_ms=10, first=4):
        super().__init__(log, per_fetch=1)
        self.wait_ms, self.short_ms, self.first = config["fetch.wait.max.ms"], short_ms, first

    def consume(self, num_messages=1, timeout=0.0):
        if self.wait_ms <= self.short_ms:
            if self.first <= 0:
                time.sleep(min(timeout, 0.01))
                return []
            self.first -= 1
        return super().consume(num_messages, timeout)


def test_a_read_the_broker_starves_goes_on_with_a_longer_fetch_wait(monkeypatch, caplog):
    made: list[SlowBrokerConsumer] = []

    def factory(config):
        made.append(SlowBrokerConsumer(config, {0: 50, 1: 50}))
        return made[-1]

    monkeypatch.setattr("confluent_kafka.Consumer", factory)
    monkeypatch.setattr(kafka_source, "_idle_consumers", {})
    monkeypatch.setattr(kafka_source, "_read_wait", kafka_source.FetchWait())
    monkeypatch.setattr(kafka_source, "FETCH_WAIT_PATIENCE_S", 0.1)
    caplog.set_level(logging.WARNING, logger="pipeline")
    batches = list(read_slice(opts(), KafkaSlice("readings", ((0, 10, 40), (1, 0, 20)))))
    got: dict[int, list[int]] = {}
    for b in batches:
        got.setdefault(b.column("partition")[0].as_py(), []).extend(b.column("offset").to_pylist())
    assert {p: sorted(o) for p, o in got.items()} == {0: list(range(10, 40)), 1: list(range(0, 20))}
    assert sum(len(o) for o in got.values()) == 50  # each record once: the second consumer went on from the first
    assert [c.wait_ms for c in made] == [10, 100]
    assert made[0].closed and not made[1].closed  # the starved consumer is not kept for reuse
    assert kafka_source._read_wait.ms == 100  # later reads start with the wait that worked
    assert "no records for 0.1s with a 10 ms fetch wait; now waiting up to 100 ms" in caplog.text
    assert len(list(read_slice(opts(), KafkaSlice("readings", ((0, 40, 50),))))) == 1
    assert len(made) == 2  # the idle 100 ms consumer was reused


def test_a_probe_the_broker_leaves_unanswered_moves_to_a_longer_fetch_wait():
    made = []

    def make_consumer(wait_ms):
        made.append(wait_ms)
        c = TansuLikeConsumer(true_end={0: 334}, listed={0: 1}, answering={0} if wait_ms > 10 else set())
        c.close = lambda: None
        return c

    wait = kafka_source.FetchWait()
    probe = EndOffsetProbe(make_consumer(wait.ms), "readings", 0.1, make_consumer, wait)
    assert probe.ends((0,))[1:] == ({0: 1}, frozenset({0}))  # unanswered: the listed end, uncertain
    assert made == [10, 100] and wait.ms == 100
    assert probe.ends((0,))[1:] == ({0: 334}, frozenset())  # the longer wait brings the true end
    assert made == [10, 100]


def test_close_idle_consumers_closes_and_forgets_every_pooled_consumer(monkeypatch):
    class Pooled:
        closed = False

        def close(self):
            self.closed = True

    pool = {b"a": Pooled(), b"b": Pooled()}
    monkeypatch.setattr(kafka_source, "_idle_consumers", pool)
    consumers = list(pool.values())
    kafka_source.close_idle_consumers()
    assert [c.closed for c in consumers] == [True, True] and kafka_source._idle_consumers == {}

"""Changelog records: key and value encoding, partitioning by the shared module, acknowledged batches."""

from __future__ import annotations

import datetime as dt
import decimal

import orjson
import pytest

from freshroute.keys import partition_for, serialize_key
from pipeline.sink import (ChangelogProducer, ChangelogWriteFailed, ChangelogWriter, QuerySink, changelog_records,
                           encode_key, encode_value, producer_config)
from pipeline.tables import QUERY_TABLE_COLUMN

from .sink_support import FakeBatch, FakeProducer


def test_value_is_compact_json_of_the_non_key_columns_with_floats_kept_floats():
    row = {"sensor": "s-1", "count": 3, "sum": 3.0, "avg": 1.0, "min": 0.5, "max": 1.5, "last": 1.0}
    raw = encode_value(row, "sensor")
    assert raw == b'{"count":3,"sum":3.0,"avg":1.0,"min":0.5,"max":1.5,"last":1.0}'
    decoded = orjson.loads(raw)
    assert isinstance(decoded["sum"], float) and isinstance(decoded["count"], int)


def test_value_encodes_spark_types_without_loss_of_meaning():
    row = {"k": "a", "d": decimal.Decimal("1.25"), "ts": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
           "day": dt.date(2026, 1, 2), "nested": {"start": 1, "end": 2}, "tags": ["x", "y"], "none": None,
           "nan": float("nan")}
    assert orjson.loads(encode_value(row, "k")) == {
        "d": 1.25, "ts": "2026-01-02T03:04:05Z", "day": "2026-01-02", "nested": {"start": 1, "end": 2},
        "tags": ["x", "y"], "none": None, "nan": None}


def test_key_is_the_shared_serialization_of_its_string_form():
    assert encode_key("sensor-1") == serialize_key("sensor-1") == b"sensor-1"
    assert encode_key(42) == b"42"
    assert encode_key("čidlo") == "čidlo".encode("utf-8")


def test_records_are_partitioned_by_the_shared_module_and_keyless_rows_are_counted():
    rows = [{"sensor": f"sensor-{i}", "count": i} for i in range(200)] + [{"sensor": None, "count": 1}]
    records, keyless = changelog_records(rows, "sensor", 8)
    assert keyless == 1
    assert len(records) == 200
    for i, r in enumerate(records):
        assert r.key == f"sensor-{i}".encode()
        assert r.partition == partition_for(r.key, 8)
        assert orjson.loads(r.value) == {"count": i}
    assert len({r.partition for r in records}) == 8  # the hash spreads keys over every partition


def test_a_row_that_deletes_its_key_is_a_tombstone_in_its_keys_partition():
    from pipeline.tables import DELETE_COLUMN

    rows = [{"sensor": "a", "last": 1.5, DELETE_COLUMN: False},
            {"sensor": "b", "last": -1.0, DELETE_COLUMN: True},  # delete_when true
            {"sensor": "c", "last": None, DELETE_COLUMN: None},  # every value null
            {"sensor": "d", "last": None, "count": 0}]  # one value not null: an upsert
    records, keyless = changelog_records(rows, "sensor", 4)
    assert keyless == 0
    got = {r.key: r.value for r in records}
    assert orjson.loads(got[b"a"]) == {"last": 1.5}  # the delete column never reaches the value
    assert got[b"b"] is None and got[b"c"] is None
    assert orjson.loads(got[b"d"]) == {"last": None, "count": 0}
    assert all(r.partition == partition_for(r.key, 4) for r in records)


def test_a_versioned_tables_record_carries_its_version_time_and_a_delete_does_too():
    from pipeline.tables import DELETE_COLUMN, VERSION_TIME_COLUMN

    rows = [{"sensor": "a", "n": 2, VERSION_TIME_COLUMN: 1_700_000_000_123},
            {"sensor": "b", "n": 1, VERSION_TIME_COLUMN: 1_700_000_000_456, DELETE_COLUMN: True},
            {"sensor": "c", "n": 5}]  # a table that keeps no history
    records, _ = changelog_records(rows, "sensor", 4)
    got = {r.key: r for r in records}
    assert orjson.loads(got[b"a"].value) == {"n": 2}  # the time is no value column
    assert got[b"a"].headers == [("freshroute.version_time", b"1700000000123")]
    assert got[b"b"].value is None and got[b"b"].headers == [("freshroute.version_time", b"1700000000456")]
    assert got[b"c"].headers is None


def test_producer_is_idempotent_acks_all_and_murmur2():
    c = producer_config({"bootstrap.servers": "h:1"})
    assert c["enable.idempotence"] is True and c["acks"] == "all" and c["partitioner"] == "murmur2_random"
    assert c["bootstrap.servers"] == "h:1"
    assert c["allow.auto.create.topics"] is False


def writer_with(fake: FakeProducer) -> tuple[ChangelogWriter, ChangelogProducer]:
    shared = ChangelogProducer({"bootstrap.servers": "h:1"}, factory=lambda cfg: fake)
    return ChangelogWriter("sensor_stats", "p-sensor_stats-changelog", 8, "sensor", shared), shared


def test_batch_returns_only_after_every_record_is_acknowledged():
    fake = FakeProducer(full_times=3)
    writer, _ = writer_with(fake)
    rows = [{"sensor": f"s{i}", "count": i} for i in range(50)]
    assert writer.write_rows(rows, batch_id=7) == (50, 0)
    assert len(fake.sent) == 50 and not fake.pending
    assert all(t == "p-sensor_stats-changelog" and p == partition_for(k, 8) for t, k, _, p in fake.sent)


def test_delivery_error_fails_the_batch_so_spark_replays_it():
    fake = FakeProducer(fail_keys={b"s3"})
    writer, shared = writer_with(fake)
    with pytest.raises(ChangelogWriteFailed, match=r"batch 4: 1 record\(s\) failed .* of 5"):
        writer.write_rows([{"sensor": f"s{i}", "count": i} for i in range(5)], batch_id=4)
    assert shared.get() is fake  # a retriable error keeps the producer


def test_fatal_producer_error_replaces_the_producer():
    made: list[FakeProducer] = []

    def factory(cfg):
        made.append(FakeProducer(fail_keys={b"s0"} if not made else set(), fatal=True))
        return made[-1]

    writer = ChangelogWriter("t", "topic", 8, "sensor", ChangelogProducer({}, factory=factory))
    with pytest.raises(ChangelogWriteFailed):
        writer.write_rows([{"sensor": "s0", "count": 1}], batch_id=1)
    assert writer.write_rows([{"sensor": "s0", "count": 1}], batch_id=1) == (1, 0)
    assert len(made) == 2


def test_empty_batch_produces_nothing():
    fake = FakeProducer()
    writer, _ = writer_with(fake)
    assert writer.write_rows([], batch_id=0) == (0, 0)
    assert fake.sent == []


def test_a_batch_counts_the_tombstones_it_wrote():
    fake = FakeProducer()
    writer, _ = writer_with(fake)
    rows = [{"sensor": "s0", "count": 1}, {"sensor": "s1", "count": None}, {"sensor": "s2", "count": None}]
    assert writer.write_rows(rows, batch_id=3) == (3, 2)
    assert sorted((k, v) for _, k, v, _ in fake.sent) == [(b"s0", b'{"count":1}'), (b"s1", None), (b"s2", None)]


def windowed_writer(fake: FakeProducer, tmp_path) -> ChangelogWriter:
    from freshroute.windows import tumbling
    from pipeline.window_expiry import WindowExpiry

    shared = ChangelogProducer({"bootstrap.servers": "h:1"}, factory=lambda cfg: fake)
    return ChangelogWriter("w", "w-changelog", 4, "sensor", shared, tumbling("10s", grace="5s", retention="20s"),
                           WindowExpiry(tmp_path / "expiry"))


def test_a_window_is_keyed_by_key_and_start_and_partitioned_by_its_key_alone(tmp_path):
    from freshroute.windows import split_window_key
    from pipeline.tables import WINDOW_START_COLUMN

    fake = FakeProducer()
    writer = windowed_writer(fake, tmp_path)
    rows = [{"sensor": "s1", WINDOW_START_COLUMN: 10_000, "count": 2},
            {"sensor": "s1", WINDOW_START_COLUMN: 20_000, "count": 1},
            {"sensor": "s2", WINDOW_START_COLUMN: None, "count": 1}]  # no window: cannot be addressed
    assert writer.write_rows(rows, batch_id=1) == (2, 0)
    assert [(split_window_key(k), v, p) for _, k, v, p in fake.sent] == [
        ((b"s1", 10_000), b'{"count":2}', partition_for(b"s1", 4)),
        ((b"s1", 20_000), b'{"count":1}', partition_for(b"s1", 4))]


def test_a_new_watermark_goes_to_every_partition_after_the_tombstones_of_the_windows_it_expires(tmp_path):
    from freshroute.windows import WATERMARK_KEY, parse_watermark, split_window_key
    from pipeline.tables import WINDOW_START_COLUMN

    fake = FakeProducer()
    writer = windowed_writer(fake, tmp_path)
    writer.write_rows([{"sensor": "s1", WINDOW_START_COLUMN: 0, "count": 1},
                       {"sensor": "s2", WINDOW_START_COLUMN: 10_000, "count": 1}], batch_id=1)
    fake.sent.clear()
    # Window [0, 10 s) expires at 10 s + 20 s retention; [10 s, 20 s) at 40 s.
    assert writer.advance_watermark(30_000) == 1
    tombstones = [(split_window_key(k), p) for _, k, v, p in fake.sent if v is None]
    marks = [(p, parse_watermark(v)) for _, k, v, p in fake.sent if k == WATERMARK_KEY]
    assert tombstones == [((b"s1", 0), partition_for(b"s1", 4))]
    assert marks == [(p, 30_000) for p in range(4)]
    assert fake.sent.index(next(r for r in fake.sent if r[2] is None)) < 4  # tombstones first
    fake.sent.clear()
    assert writer.advance_watermark(30_000) == 0 and fake.sent == []  # not moved: nothing published
    assert writer.advance_watermark(40_000) == 1
    assert [split_window_key(k) for _, k, v, _ in fake.sent if v is None] == [(b"s2", 10_000)]


def test_a_failed_watermark_publication_forgets_no_window(tmp_path):
    from pipeline.tables import WINDOW_START_COLUMN

    fake = FakeProducer()
    writer = windowed_writer(fake, tmp_path)
    writer.write_rows([{"sensor": "s1", WINDOW_START_COLUMN: 0, "count": 1}], batch_id=1)
    fake.fail_keys = {b"s1\x00" + b"%016x" % 0}
    with pytest.raises(ChangelogWriteFailed, match="watermark"):
        writer.advance_watermark(60_000)
    fake.fail_keys = set()
    assert writer.advance_watermark(60_000) == 1  # tried again, the window still noted


def test_a_shared_querys_batch_goes_to_each_tables_changelog_in_one_wait():
    fake = FakeProducer()
    shared = ChangelogProducer({"bootstrap.servers": "h:1"}, factory=lambda cfg: fake)
    counts = ChangelogWriter("area_counts", "area_counts-changelog", 4, "area", shared)
    stats = ChangelogWriter("sensor_stats", "sensor_stats-changelog", 8, "sensor", shared)
    rows = [{QUERY_TABLE_COLUMN: 1, "area_counts": None, "sensor_stats": {"sensor": "s1", "count": 3}},
            {QUERY_TABLE_COLUMN: 0, "area_counts": {"area": "cabin", "count": 2}, "sensor_stats": None},
            {QUERY_TABLE_COLUMN: 0, "area_counts": {"area": "wheel", "count": None}, "sensor_stats": None},
            {QUERY_TABLE_COLUMN: 1, "area_counts": None, "sensor_stats": {"sensor": "s2", "count": 1}}]
    flushes = []
    fake.flush = lambda timeout=None, serve=fake.flush: flushes.append(len(fake.pending)) or serve(timeout)
    QuerySink([counts, stats], shared).write_batch(FakeBatch(rows), 9)
    assert flushes[0] == 4  # every table's records sent before the one wait for acknowledgements
    assert sorted((t, k, v) for t, k, v, _ in fake.sent) == [
        ("area_counts-changelog", b"cabin", b'{"count":2}'), ("area_counts-changelog", b"wheel", None),
        ("sensor_stats-changelog", b"s1", b'{"count":3}'), ("sensor_stats-changelog", b"s2", b'{"count":1}')]
    assert (counts.written[9].records, counts.written[9].deletes) == (2, 1)
    assert (stats.written[9].records, stats.written[9].deletes) == (2, 0)


def test_a_ghosts_rows_in_a_shared_query_are_written_nowhere():
    fake = FakeProducer()
    shared = ChangelogProducer({"bootstrap.servers": "h:1"}, factory=lambda cfg: fake)
    counts = ChangelogWriter("area_counts", "area_counts-changelog", 4, "area", shared)
    stats = ChangelogWriter("sensor_stats", "sensor_stats-changelog", 8, "sensor", shared)
    rows = [{QUERY_TABLE_COLUMN: 1, "area_counts": None, "sensor_stats": {"sensor": "s1", "count": 3}},
            {QUERY_TABLE_COLUMN: 0, "area_counts": {"area": "cabin", "count": 2}, "sensor_stats": None}]
    QuerySink([counts, stats], shared, ghosts=frozenset({"sensor_stats"})).write_batch(FakeBatch(rows), 9)
    assert [(t, k, v) for t, k, v, _ in fake.sent] == [("area_counts-changelog", b"cabin", b'{"count":2}')]
    assert counts.written[9].records == 1 and stats.written == {}


def test_a_tables_own_query_hands_its_rows_over_as_they_are():
    fake = FakeProducer()
    writer, shared = writer_with(fake)
    QuerySink([writer], shared).write_batch(FakeBatch([{"sensor": "s1", "count": 3}]), 2)
    assert [(k, v) for _, k, v, _ in fake.sent] == [(b"s1", b'{"count":3}')]
    assert writer.written[2].records == 1

"""A source's rejected records on the sink's side: dead letters with their reason and origin, counts, skip and fail;
a source's validation settings checked at declaration. (The checks themselves run in Spark:
tests/integration/test_bad_input.py.)"""

from __future__ import annotations

import datetime as dt

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pipeline.metrics import PipelineCollector
from pipeline.sink import ChangelogProducer, ChangelogWriter, QuerySink, RejectWriter
from pipeline.tables import QUERY_TABLE_COLUMN, source
from pipeline.validation import RAW_KEY, RAW_VALUE, REASON_COLUMN, REJECTED_BRANCH, InvalidInput

from .sink_support import FakeBatch, FakeProducer

WHEN = dt.datetime(2026, 11, 27, 6, 0, tzinfo=dt.timezone.utc)


def rejected(reason: str, value: bytes | None, offset: int, partition: int = 1) -> dict:
    return {QUERY_TABLE_COLUMN: 1, "sensor_stats": None,
            REJECTED_BRANCH: {REASON_COLUMN: reason, RAW_KEY: b"s1", RAW_VALUE: value, "topic": "readings",
                              "partition": partition, "offset": offset, "timestamp": WHEN}}


def sink(on_invalid: str) -> tuple[FakeProducer, ChangelogWriter, RejectWriter, QuerySink]:
    fake = FakeProducer()
    shared = ChangelogProducer({"bootstrap.servers": "h:1"}, factory=lambda cfg: fake)
    writer = ChangelogWriter("sensor_stats", "sensor_stats-changelog", 4, "sensor", shared)
    rejects = RejectWriter("readings", on_invalid, "readings.rejected", 2, shared)
    return fake, writer, rejects, QuerySink([writer], shared, rejects=rejects)


def test_rejected_records_go_to_the_dead_letter_topic_with_reason_and_origin_beside_the_tables_rows():
    fake, writer, rejects, query = sink("dead_letter")
    rows = [{QUERY_TABLE_COLUMN: 0, "sensor_stats": {"sensor": "s1", "count": 3}, REJECTED_BRANCH: None},
            rejected("not_json", b"not json", 41), rejected("non_finite", b'{"reading": NaN}', 42, partition=3)]
    query.write_batch(FakeBatch(rows), 5)
    assert [(t, k, v) for t, k, v, _ in fake.sent] == [
        ("sensor_stats-changelog", b"s1", b'{"count":3}'), ("readings.rejected", b"s1", b"not json"),
        ("readings.rejected", b"s1", b'{"reading": NaN}')]
    assert [p for t, _, _, p in fake.sent if t == "readings.rejected"] == [1, 1]  # input partition 3 of 2: 3 % 2
    assert writer.written[5].records == 1 and rejects.counts == {"not_json": 1, "non_finite": 1}
    headers = dict(rejects.dead_letters([rejected("not_json", b"x", 41)[REJECTED_BRANCH]])[0].headers)
    assert headers == {"freshroute.reason": b"not_json", "freshroute.source": b"readings",
                       "freshroute.topic": b"readings", "freshroute.partition": b"1", "freshroute.offset": b"41",
                       "freshroute.timestamp": str(int(WHEN.timestamp() * 1000)).encode()}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PipelineCollector(lambda: [], lambda: [rejects]))
    text = generate_latest(registry).decode()
    assert 'freshroute_pipeline_rejected_records_total{reason="not_json",source="readings"} 1.0' in text


def test_skip_counts_and_drops_and_fail_stops_naming_the_record():
    fake, _, rejects, query = sink("skip")
    query.write_batch(FakeBatch([rejected("wrong_type", b'{"reading":"abc"}', 7)]), 1)
    assert fake.sent == [] and rejects.counts == {"wrong_type": 1}
    fake, _, rejects, query = sink("fail")
    with pytest.raises(InvalidInput) as e:
        query.write_batch(FakeBatch([rejected("missing_field", b"{}", 9)]), 1)
    assert e.value.message.startswith("INVALID_INPUT: source readings: record readings/1@9 is rejected (missing_field)")
    assert fake.sent == []


@pytest.mark.parametrize("kw, says", [
    ({"on_invalid": "ignore"}, "on_invalid must be one of 'dead_letter', 'skip', 'fail', not 'ignore'"),
    ({"max_clock_skew": -5}, "max_clock_skew must be more than 0 and at most 7 days"),
    ({"max_clock_skew": "30d"}, "max_clock_skew must be more than 0 and at most 7 days"),
    ({"max_clock_skew": "soon"}, "max_clock_skew must be a duration"),
    ({"dead_letter_topic": "bad topic!"}, "dead_letter_topic must be a Kafka topic name"),
    ({"max_record_bytes": 0}, "max_record_bytes must be a whole number of bytes"),
])
def test_a_sources_validation_settings_are_checked_when_declared(kw, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        source("readings", schema="sensor STRING", **kw)
    ok = source("readings", schema="sensor STRING", max_clock_skew="90s")
    assert (ok.on_invalid, ok.max_clock_skew_ms, ok.rejected_topic) == ("dead_letter", 90_000, "readings.rejected")


def test_a_row_too_large_for_the_changelog_is_dead_lettered_and_the_batch_goes_on():
    fake = FakeProducer()
    shared = ChangelogProducer({"bootstrap.servers": "h:1"}, factory=lambda cfg: fake)
    rejects = RejectWriter("readings", "dead_letter", "readings.rejected", 2, shared)
    writer = ChangelogWriter("sensor_stats", "sensor_stats-changelog", 4, "sensor", shared, rejects=rejects)
    huge = "x" * 1_100_000
    QuerySink([writer], shared).write_batch(FakeBatch([{"sensor": "s1", "count": 3}, {"sensor": "s2", "note": huge}]), 4)
    assert [(t, k) for t, k, _, _ in fake.sent] == [("sensor_stats-changelog", b"s1"), ("readings.rejected", b"s2")]
    assert rejects.counts == {"output_too_large": 1} and writer.written[4].records == 1
    assert fake.sent[1][2] is None  # the dead letter names the key and table, without the row
    from pipeline.sink import ChangelogRecord

    headers = dict(rejects.too_large_rows("sensor_stats", [ChangelogRecord(b"s2", b"v" * 10, 3)])[0].headers)
    assert headers["freshroute.reason"] == b"output_too_large" and headers["freshroute.table"] == b"sensor_stats"

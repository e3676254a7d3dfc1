"""A recomputation's stale keys: where a fresh start marks its input and changelogs, when it has caught up, and what
the sink does with the keys no longer produced (the changelog scan is faked here; tests/integration/test_deletes.py
runs it on a real pipeline and broker)."""

from __future__ import annotations

import orjson
import pytest

import pipeline.sink
from pipeline.recompute import DONE_FILE, MARK_FILE, Recomputation, batch_end_offsets, describe
from pipeline.sink import ChangelogProducer, ChangelogWriter, QuerySink
from pipeline.tables import sql_table

from .sink_support import FakeBatch, FakeProducer


def offset_log(checkpoint, batch_id: int, **topics) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1", '{"batchWatermarkMs":0,"batchTimestampMs":1}',
             *(orjson.dumps({t: {str(p): o for p, o in parts.items()}}).decode() for t, parts in topics.items())]
    (checkpoint / "offsets" / str(batch_id)).write_text("\n".join(lines))


def test_a_batch_has_caught_up_once_its_offsets_reach_where_the_input_ended_at_the_start(tmp_path):
    mark = Recomputation(tmp_path, {"readings": {0: 100, 1: 40}}, {"sensor_stats": {0: 7}})
    mark.save()
    assert Recomputation.load(tmp_path) == mark
    offset_log(tmp_path, 0, readings={0: 60, 1: 40})
    offset_log(tmp_path, 1, readings={0: 100, 1: 45})
    assert batch_end_offsets(tmp_path / "offsets" / "1") == {"readings": {0: 100, 1: 45}}
    assert not mark.caught_up(0) and mark.caught_up(1)
    assert not mark.caught_up(2)  # no entry in the offset log: not known to have read anything
    mark.done({"sensor_stats": 3})
    assert Recomputation.load(tmp_path) is None and not (tmp_path / MARK_FILE).exists()
    assert orjson.loads((tmp_path / DONE_FILE).read_bytes()) == {"stale_keys": {"sensor_stats": 3}}


def sink_over(tmp_path, monkeypatch, action: str, stale: list[tuple[bytes, int]]):
    fake = FakeProducer()
    shared = ChangelogProducer({"bootstrap.servers": "h:1"}, factory=lambda cfg: fake)
    writer = ChangelogWriter("sensor_stats", "sensor_stats-changelog", 4, "sensor", shared, stale_keys=action)
    mark = Recomputation(tmp_path, {"readings": {0: 10}}, {"sensor_stats": {0: 5, 1: 3}})
    mark.save()
    scans = []

    def scan(kafka, topic, ends, written):
        scans.append((topic, ends, set(written)))
        return [s for s in stale if s[0] not in set(written)]

    monkeypatch.setattr(pipeline.sink, "stale_keys", scan)
    return fake, writer, QuerySink([writer], shared, {"bootstrap.servers": "h:1"}, Recomputation.load(tmp_path)), scans


def test_once_caught_up_the_keys_no_longer_produced_are_tombstoned_in_that_batch(tmp_path, monkeypatch, caplog):
    fake, writer, sink, scans = sink_over(tmp_path, monkeypatch, "tombstone", [(b"gone-1", 0), (b"gone-2", 1), (b"s1", 2)])
    offset_log(tmp_path, 0, readings={0: 4})
    sink.write_batch(FakeBatch([{"sensor": "s1", "count": 3}]), 0)
    assert not scans and [k for _, k, _, _ in fake.sent] == [b"s1"]  # not caught up: nothing looked at
    offset_log(tmp_path, 1, readings={0: 10})
    sink.write_batch(FakeBatch([{"sensor": "s1", "count": 4}]), 1)
    assert scans == [("sensor_stats-changelog", {0: 5, 1: 3}, {b"s1"})]
    assert sorted(((k, v, p) for _, k, v, p in fake.sent[1:]), key=repr) == [(b"gone-1", None, 0), (b"gone-2", None, 1),
                                                                 (b"s1", b'{"count":4}', pipeline.sink.partition_for(b"s1", 4))]
    assert writer.stale_found == 2 and writer.written[1].deletes == 2
    assert "2 key(s) it no longer produces are tombstoned: gone-1, gone-2" in caplog.text
    assert Recomputation.load(tmp_path) is None  # done: later batches do not look again
    offset_log(tmp_path, 2, readings={0: 12})
    sink.write_batch(FakeBatch([{"sensor": "s2", "count": 1}]), 2)
    assert len(scans) == 1


def test_by_default_they_are_reported_and_still_served(tmp_path, monkeypatch, caplog):
    fake, writer, sink, _ = sink_over(tmp_path, monkeypatch, "report", [(b"gone-1", 0)])
    offset_log(tmp_path, 0, readings={0: 10})
    sink.write_batch(FakeBatch([{"sensor": "s1", "count": 3}]), 0)
    assert [(k, v) for _, k, v, _ in fake.sent] == [(b"s1", b'{"count":3}')]
    assert writer.stale_found == 1
    assert "1 key(s) it no longer produces are still served as they were (stale_keys='tombstone' deletes them): gone-1" \
        in caplog.text


def test_a_batch_that_fails_leaves_the_mark_for_its_replay(tmp_path, monkeypatch):
    fake, writer, sink, scans = sink_over(tmp_path, monkeypatch, "tombstone", [(b"gone-1", 0)])
    fake.fail_keys = {b"gone-1"}
    offset_log(tmp_path, 0, readings={0: 10})
    with pytest.raises(pipeline.sink.ChangelogWriteFailed):
        sink.write_batch(FakeBatch([]), 0)
    assert Recomputation.load(tmp_path) is not None
    fake.fail_keys = set()
    sink.write_batch(FakeBatch([]), 0)
    assert len(scans) == 2 and Recomputation.load(tmp_path) is None


def test_the_log_line_names_twenty_keys_and_counts_the_rest():
    line = describe("t", "tombstone", [(f"k{i}".encode(), 0) for i in range(25)])
    assert "25 key(s)" in line and "k19" in line and "k20" not in line and "and 5 more" in line


def test_stale_keys_is_report_or_tombstone():
    with pytest.raises(ValueError, match="stale_keys must be one of 'report', 'tombstone', not 'delete'"):
        sql_table(name="t", key="k", source="s", sql="SELECT k FROM s", stale_keys="delete")

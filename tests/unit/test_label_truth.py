"""Check (e) of the consistency checker: lag labels held against the changelog's record timestamps."""

from __future__ import annotations

import orjson

from freshroute.keys import partition_for, serialize_key
from freshroute.position import single
from loadtest.consistency import Changelog, check
from loadtest.label_truth import LABEL_SLACK_MS, Timeline, check_labels

SENT_MS = 100_000


def timeline(*records: tuple[int, int]) -> Timeline:
    """A partition's timeline from (offset, timestamp ms) in offset order."""
    t = Timeline()
    for offset, ms in records:
        t.append(offset, ms)
    return t


def answer(offsets: int | None, ms: int | None, sent_ms: int | None = SENT_MS) -> dict:
    return {"ts_ms": sent_ms, "lag": {"offsets": offsets, "ms": ms}}


# Offsets 0..9, each appended a second apart, the last 10 s before the request.
HISTORY = timeline(*((o, SENT_MS - 20_000 + 1000 * o) for o in range(10)))


def test_an_answer_labelled_caught_up_while_records_past_its_position_were_there_long_before_is_refuted():
    # At position 3, records 3..9 were all in the changelog at least 10 s before the request.
    checked, refuted = check_labels(answer(0, None), 3, HISTORY)
    assert checked == 1
    assert refuted == [("lag_label", "labelled 0 offsets behind, but 7 records past its position were in the "
                                     "changelog 2000 ms before the request")]


def test_an_answer_labelled_zero_ms_stale_while_records_past_its_position_were_there_long_before_is_refuted():
    checked, refuted = check_labels(answer(None, 0), 3, HISTORY)
    assert checked == 1
    assert refuted == [("staleness_label", "labelled 0 ms stale, but 7 records past its position were in the "
                                           "changelog 2000 ms before the request (the first of them 17000 ms before)")]


def test_records_appended_within_the_slack_refute_nothing():
    recent = timeline((0, SENT_MS - 5000), (1, SENT_MS - LABEL_SLACK_MS + 1), (2, SENT_MS - 100))
    assert check_labels(answer(0, 0), 1, recent) == (2, [])
    # The record at 0 is before the position: it is not past it, however old.
    assert check_labels(answer(0, 0), 1, recent, slack_ms=LABEL_SLACK_MS - 1) == (2, [
        ("lag_label", "labelled 0 offsets behind, but 1 records past its position were in the changelog 1999 ms "
                      "before the request"),
        ("staleness_label", "labelled 0 ms stale, but 1 records past its position were in the changelog 1999 ms "
                            "before the request (the first of them 1999 ms before)")])


def test_null_labels_claim_nothing_and_are_not_counted():
    assert check_labels(answer(None, None), 0, HISTORY) == (0, [])
    assert check_labels({"ts_ms": SENT_MS, "lag": None}, 0, HISTORY) == (0, [])
    assert check_labels(answer(0, 0, sent_ms=None), 0, HISTORY) == (0, [])  # no send time
    assert check_labels(answer(0, 0), 0, None) == (0, [])  # a partition read without timestamps


def test_a_true_label_passes_and_one_short_of_it_is_refuted():
    # Records 3..9 are past position 3; 7 offsets behind is true, 6 is not.
    assert check_labels(answer(7, None), 3, HISTORY) == (1, [])
    assert [k for k, _ in check_labels(answer(6, None), 3, HISTORY)[1]] == ["lag_label"]
    # Record 3 was there 17 s before the request: more than 15 s stale (+ 2 s slack) is true, 15 s is not.
    assert check_labels(answer(None, 15_001), 3, HISTORY) == (1, [])
    checked, refuted = check_labels(answer(None, 15_000), 3, HISTORY)
    assert checked == 1 and [k for k, _ in refuted] == ["staleness_label"]
    assert refuted[0][1].startswith("labelled 15000 ms stale, but 1 records past its position")


def test_records_are_counted_not_offsets():
    # Compaction left offsets 0, 5 and 9: two records past position 1, though the offsets span 8.
    sparse = timeline((0, 0), (5, 1), (9, 2))
    assert check_labels(answer(2, None), 1, sparse) == (1, [])
    assert check_labels(answer(1, None), 1, sparse)[1][0][0] == "lag_label"


def test_a_record_stamped_earlier_than_one_before_it_counts_only_from_the_later_time():
    stepped_back = timeline((0, SENT_MS - 1000), (1, SENT_MS - 60_000))
    assert stepped_back.past(0, SENT_MS - LABEL_SLACK_MS) == (0, None)
    assert stepped_back.past(0, SENT_MS) == (2, SENT_MS - 1000)


# --- through the checker ------------------------------------------------------------------------
P = 4
TABLE = "t"


def part(key: str) -> int:
    return partition_for(serialize_key(key), P)


A = "sensor-1"
B = next(f"sensor-{i}" for i in range(2, 500) if part(f"sensor-{i}") != part(A))


def rec(key: str, offset: int, value: object, lag: tuple[int | None, int | None]) -> dict:
    return {"t": 0.0, "ts_ms": SENT_MS, "proto": "rest", "table": TABLE, "key": key, "outcome": "ok", "status": 200,
            "value": value, "partition": part(key), "served_by": {"node": "node-1", "role": "active"},
            "lag": {"offsets": lag[0], "ms": lag[1]}, "position": single(TABLE, part(key), offset),
            "bound": {}, "bound_kind": "none", "session": None, "seq": None, "latency_ms": 1.0}


def test_check_counts_labels_and_reports_refuted_ones_by_kind():
    # A's partition: A=1 at 0 and A=2 at 1, 30 s and 10 s before the requests, with timestamps; B's: no timestamps.
    rows = [(part(A), 0, A, orjson.dumps(1), None, SENT_MS - 30_000),
            (part(A), 1, A, orjson.dumps(2), None, SENT_MS - 10_000),
            (part(B), 0, B, orjson.dumps(7))]
    log = Changelog.from_records("t-changelog", P, rows)
    records = [rec(A, 2, 2, (0, 0)),  # caught up: true
               rec(A, 1, 1, (1, 12_000)),  # one behind, 12 s stale: true (A=2 came 10 s before)
               rec(A, 1, 1, (0, 0)),  # claims caught up at 1: both labels refuted
               rec(A, 1, 1, (1, 5_000)),  # the offsets label is true, the staleness label not
               rec(A, 0, None, (None, None)) | {"outcome": "not_found"},  # unknown labels: nothing to check
               rec(B, 1, 7, (0, 0))]  # B's partition has no timestamps: nothing to check
    report = check(records, log, TABLE)
    assert report.labels_checked == 8
    assert [(v.index, v.kind) for v in report.violations] == [(2, "lag_label"), (2, "staleness_label"),
                                                              (3, "staleness_label")]
    doc = report.to_dict()
    assert doc["labels_checked"] == 8
    assert doc["violations_by_kind"] == {"lag_label": 1, "staleness_label": 2}
    assert report.values_checked == 5 and report.absences_checked == 1
    # With a slack longer than the records' age no label is refuted.
    relaxed = check(records, log, TABLE, label_slack_ms=31_000)
    assert relaxed.ok and relaxed.labels_checked == 8


def test_records_appended_while_a_killed_broker_was_still_in_sync_count_from_its_fencing():
    """test_broker_quorum's kill -9 on a loaded machine: records a live leader appended just after the kill were
    readable only once the cluster fenced the dead follower, 6 s later, and the answers meanwhile said "0 behind"."""
    killed, fenced = SENT_MS - 7_000, SENT_MS - 100
    rows = [(part(A), 0, A, orjson.dumps(1), None, killed - 10_000),
            (part(A), 1, A, orjson.dumps(2), None, killed + 35),
            (part(A), 2, A, orjson.dumps(3), None, killed + 50),
            (part(A), 3, A, orjson.dumps(4), None, fenced + 10)]
    log = Changelog.from_records("t-changelog", P, rows)
    records = [rec(A, 1, 1, (0, 0))]
    assert [v.kind for v in check(records, log, TABLE).violations] == ["lag_label", "staleness_label"]
    assert check(records, log, TABLE, held=[(killed - 500, fenced)]).ok
    # Before the window, and after it, a record counts from its own time.
    held = log.timeline(part(A)).held([(killed - 500, fenced)])
    assert list(held.there_by_ms) == [killed - 10_000, fenced, fenced, fenced + 10]
    assert [v.kind for v in check([rec(A, 0, None, (0, 0)) | {"outcome": "not_found"}], log, TABLE,
                                  held=[(killed - 500, fenced)]).violations] == ["lag_label", "staleness_label"]


def test_an_answer_past_held_records_shows_them_readable_from_then():
    """A replica applies only records below the high watermark: one that answered past the held records 5 s before
    the request shows they could be read then, whatever the fencing, so "0 behind" at the request is refuted."""
    killed, fenced = SENT_MS - 7_000, SENT_MS - 100
    rows = [(part(A), 0, A, orjson.dumps(1), None, killed - 10_000),
            (part(A), 1, A, orjson.dumps(2), None, killed + 35),
            (part(A), 2, A, orjson.dumps(3), None, killed + 50)]
    log = Changelog.from_records("t-changelog", P, rows)
    ahead = rec(A, 3, 3, (0, 0)) | {"ts_ms": SENT_MS - 5_000, "latency_ms": 2.5}
    report = check([ahead, rec(A, 1, 1, (0, 0))], log, TABLE, held=[(killed - 500, fenced)])
    assert [(v.index, v.kind) for v in report.violations] == [(1, "lag_label"), (1, "staleness_label")]
    assert report.violations[1].message.endswith("(the first of them 4997 ms before)")

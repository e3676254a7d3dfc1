"""Check (f) of the consistency checker: input-lag labels held against the input and the changelog read back."""

from __future__ import annotations

import orjson

from freshroute import input_position
from freshroute.keys import partition_for, serialize_key
from freshroute.position import single
from loadtest.consistency import Changelog, check
from loadtest.input_truth import InputLog, InputTruth, check_input_label
from loadtest.label_truth import LABEL_SLACK_MS

SENT_MS = 100_000


def inputs(*records: tuple[int, int, int]) -> InputLog:
    """An input topic from (partition, offset, timestamp ms)."""
    return InputLog.from_records("readings", records)


def changelog(*rows: tuple[int, list[int | None], int | None], partitions: int = 1) -> Changelog:
    """Partition 0 of a changelog from (offset, input position, append ms) of its records, each of a key of its own."""
    return Changelog.from_records("t-changelog", partitions, [(0, offset, f"k{offset}", orjson.dumps(1),
                                                               input_position.encode(position), ms)
                                                              for offset, position, ms in rows])


def answer(ms: int | None, sent_ms: int | None = SENT_MS, latency_ms: float = 1.0) -> dict:
    return {"ts_ms": sent_ms, "latency_ms": latency_ms, "input_lag": {"records": 0, "ms": ms}}


def truth(log: Changelog, read: InputLog) -> InputTruth:
    built = InputTruth.of(log, read)
    assert built is not None
    return built


# Input partition 0: a record 30 s before the request, one 10 s before, one 9 s before. The changelog reflects the
# first 29 s before the request, the second only 5 s after it (a row of another key), the third 6 s after.
INPUT = inputs((0, 0, SENT_MS - 30_000), (0, 1, SENT_MS - 10_000), (0, 2, SENT_MS - 9_000))
LATE = changelog((0, [0], SENT_MS - 29_000), (1, [1], SENT_MS + 5_000), (2, [2], SENT_MS + 6_000))


def test_an_answer_labelled_caught_up_while_an_older_input_record_was_unreflected_is_refuted():
    assert check_input_label(answer(0), truth(LATE, INPUT)) == (1, 0, [(
        "input_lag_label", "labelled 0 ms behind its input, but input partition 0's record at offset 1 (10000 ms "
                           "before the request) was not yet reflected by the table's changelog, which reflects it only "
                           "from 5000 ms after the request")])


def test_a_true_label_passes_and_one_short_of_it_is_refuted():
    # Record 1 was in the input 10 s before the request: more than 8 s behind (+ 2 s slack) is true, 8 s is not.
    assert check_input_label(answer(8_001), truth(LATE, INPUT)) == (1, 0, [])
    checked, undecided, refuted = check_input_label(answer(8_000), truth(LATE, INPUT))
    assert (checked, undecided, [k for k, _ in refuted]) == (1, 0, ["input_lag_label"])
    assert refuted[0][1].startswith("labelled 8000 ms behind its input, but input partition 0's record at offset 1 ")


def test_records_within_the_slack_refute_nothing():
    recent = inputs((0, 0, SENT_MS - 30_000), (0, 1, SENT_MS - LABEL_SLACK_MS + 1))
    log = changelog((0, [0], SENT_MS - 29_000), (1, [1], SENT_MS + 5_000))
    assert check_input_label(answer(0), truth(log, recent)) == (1, 0, [])
    assert [k for k, _ in check_input_label(answer(0), truth(log, recent), slack_ms=LABEL_SLACK_MS - 2)[2]] == [
        "input_lag_label"]


def test_a_row_appended_before_the_answer_came_back_backs_its_label():
    log = changelog((0, [0], SENT_MS - 29_000), (1, [2], SENT_MS + 40))
    assert check_input_label(answer(0, latency_ms=40.0), truth(log, INPUT)) == (1, 0, [])
    assert check_input_label(answer(0, latency_ms=39.0), truth(log, INPUT))[2][0][0] == "input_lag_label"


def test_null_labels_claim_nothing_and_are_not_counted():
    t = truth(LATE, INPUT)
    assert check_input_label(answer(None), t) == (0, 0, [])
    assert check_input_label({"ts_ms": SENT_MS, "input_lag": None}, t) == (0, 0, [])
    assert check_input_label(answer(0, sent_ms=None), t) == (0, 0, [])  # no send time
    assert check_input_label(answer(0), None) == (0, 0, [])  # no input read


def test_a_record_that_produced_no_row_refutes_nothing():
    # Record 1 was filtered: no row ever reflects it itself. Never followed by a reflected record, it is not behind.
    filtered = changelog((0, [0], SENT_MS - 29_000))
    assert check_input_label(answer(0), truth(filtered, INPUT)) == (1, 0, [])
    # Followed by a record that came only 100 ms before the request: a checkpoint may rightly have taken the table past
    # record 1 long before record 2's row came, so the table being behind at record 1 refutes nothing either.
    fresh_next = inputs((0, 0, SENT_MS - 30_000), (0, 1, SENT_MS - 10_000), (0, 2, SENT_MS - 100))
    passed = changelog((0, [0], SENT_MS - 29_000), (1, [2], SENT_MS + 6_000))
    assert check_input_label(answer(0), truth(passed, fresh_next)) == (1, 0, [])
    # But record 2, which did produce a row, was itself in the input 9 s before the request: that refutes the label.
    _, _, refuted = check_input_label(answer(0), truth(passed, INPUT))
    assert [m for _, m in refuted] == ["labelled 0 ms behind its input, but input partition 0's record at offset 2 "
                                       "(9000 ms before the request) was not yet reflected by the table's changelog, "
                                       "which reflects it only from 6000 ms after the request"]


def test_a_gap_compaction_left_where_a_reflecting_row_may_have_been_is_unverifiable():
    compacted = Changelog.from_records("t-changelog", 1, [
        (0, 0, "a", orjson.dumps(1), input_position.encode([0]), SENT_MS - 29_000),
        (0, 2, "a", orjson.dumps(2), input_position.encode([2]), SENT_MS + 6_000)])  # offset 1 removed
    assert check_input_label(answer(0), truth(compacted, INPUT)) == (0, 1, [])
    # A gap from before the record was in the input hides nothing.
    early = Changelog.from_records("t-changelog", 1, [
        (0, 0, "a", orjson.dumps(1), None, SENT_MS - 60_000),
        (0, 2, "b", orjson.dumps(1), input_position.encode([0]), SENT_MS - 29_000),
        (0, 3, "c", orjson.dumps(1), input_position.encode([2]), SENT_MS + 6_000)])
    assert check_input_label(answer(0), truth(early, INPUT))[:2] == (1, 0)


def test_a_changelog_read_without_timestamps_leaves_nothing_to_check():
    undated = Changelog.from_records("t-changelog", 1, [(0, 0, "a", orjson.dumps(1), input_position.encode([0]))])
    assert InputTruth.of(undated, INPUT) is None


def test_each_input_partition_is_held_to_its_own_reflection():
    read = inputs((0, 0, SENT_MS - 30_000), (1, 0, SENT_MS - 30_000), (1, 5, SENT_MS - 12_000))
    log = changelog((0, [0, None], SENT_MS - 29_000), (1, [None, 0], SENT_MS - 29_000),
                    (2, [None, 5], SENT_MS + 1_000))
    _, _, refuted = check_input_label(answer(0), truth(log, read))
    assert [m.split(", but ")[1][:38] for _, m in refuted] == ["input partition 1's record at offset 5"]


# --- through the checker ------------------------------------------------------------------------
P = 4
TABLE = "t"
A = "sensor-1"


def part(key: str) -> int:
    return partition_for(serialize_key(key), P)


def rec(offset: int, value: object, input_lag_ms: int | None) -> dict:
    return {"t": 0.0, "ts_ms": SENT_MS, "proto": "rest", "table": TABLE, "key": A, "outcome": "ok", "status": 200,
            "value": value, "partition": part(A), "served_by": {"node": "node-1", "role": "active"},
            "lag": {"offsets": None, "ms": None}, "position": single(TABLE, part(A), offset), "bound": {},
            "bound_kind": "none", "session": None, "seq": None, "latency_ms": 1.0,
            "input_lag": {"records": None, "ms": input_lag_ms}}


def test_check_counts_input_labels_and_reports_refuted_ones():
    rows = [(part(A), 0, A, orjson.dumps(1), input_position.encode([0]), SENT_MS - 29_000),
            (part(A), 1, A, orjson.dumps(2), input_position.encode([1]), SENT_MS + 5_000)]
    log = Changelog.from_records("t-changelog", P, rows)
    records = [rec(1, 1, 0),  # record 1 (10 s old) unreflected: refuted
               rec(1, 1, 20_000),  # 20 s behind: true
               rec(1, 1, None)]  # unknown: nothing to check
    report = check(records, log, TABLE, inputs=INPUT)
    assert report.input_labels_checked == 2
    assert [(v.index, v.kind) for v in report.violations] == [(0, "input_lag_label")]
    doc = report.to_dict()
    assert doc["input_labels_checked"] == 2 and doc["violations_by_kind"] == {"input_lag_label": 1}
    assert report.values_checked == 3 and report.unverifiable == 0
    # Without the input read back, (f) checks nothing and the rest passes.
    without = check(records, log, TABLE)
    assert without.ok and without.input_labels_checked == 0

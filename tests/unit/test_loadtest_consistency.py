"""The consistency checker on synthetic changelogs and recordings, including ones that must fail."""

from __future__ import annotations

import orjson
import pytest

from freshroute.position import Position, single
from freshroute.keys import partition_for, serialize_key
from loadtest.consistency import Changelog, check, same_value

P = 4
TABLE = "t"


def part(key: str) -> int:
    return partition_for(serialize_key(key), P)


def log_of(*writes: tuple[str, object]) -> Changelog:
    """A changelog from writes in order; each key's records get consecutive offsets in its partition."""
    next_offset = {p: 0 for p in range(P)}
    rows = []
    for key, value in writes:
        p = part(key)
        rows.append((p, next_offset[p], key, None if value is None else orjson.dumps(value)))
        next_offset[p] += 1
    return Changelog.from_records("t-changelog", P, rows)


def rec(key: str, offset: int | None, value=None, outcome: str = "ok", bound=None, lag=(0, 0), session=None,
        seq=None, t: float = 0.0) -> dict:
    p = part(key)
    return {"t": t, "proto": "rest", "table": TABLE, "key": key, "outcome": outcome, "status": 200,
            "value": value, "partition": p, "served_by": {"node": "node-1", "role": "active"},
            "lag": {"offsets": lag[0], "ms": lag[1]}, "position": single(TABLE, p, offset) if offset is not None else None,
            "bound": bound or {}, "bound_kind": "none", "session": session, "seq": seq, "latency_ms": 1.0}


# Two keys in one partition so that offsets of one key interleave with the other's.
A, B = "sensor-1", next(f"sensor-{i}" for i in range(2, 500) if part(f"sensor-{i}") == part("sensor-1"))


@pytest.fixture
def log() -> Changelog:
    # partition of A: offset 0 A=1, 1 B=10, 2 A=2, 3 A=None (deleted), 4 A=3
    return log_of((A, {"v": 1}), (B, {"v": 10}), (A, {"v": 2}), (A, None), (A, {"v": 3}))


def test_state_at_is_the_latest_record_before_the_position(log):
    p = part(A)
    assert log.state_at(A, p, 0) == (False, None, None)
    assert log.state_at(A, p, 1) == (True, {"v": 1}, 0)
    assert log.state_at(A, p, 2) == (True, {"v": 1}, 0)
    assert log.state_at(A, p, 3) == (True, {"v": 2}, 2)
    assert log.state_at(A, p, 4)[0] is False  # tombstone
    assert log.state_at(A, p, 5) == (True, {"v": 3}, 4)
    assert log.end_offsets[p] == 5


def test_consistent_recording_passes(log):
    records = [rec(A, 1, {"v": 1}), rec(A, 3, {"v": 2}), rec(A, 4, outcome="not_found"), rec(A, 5, {"v": 3}),
               rec(B, 2, {"v": 10}), rec(A, 0, outcome="not_found")]
    report = check(records, log, TABLE)
    assert report.ok, report.to_dict()
    assert report.values_checked == 4 and report.absences_checked == 2


def test_value_that_does_not_match_the_position_fails(log):
    # {"v": 2} was written at offset 2, so a response at position 2 cannot have seen it.
    report = check([rec(A, 2, {"v": 2})], log, TABLE)
    assert not report.ok
    assert [v.kind for v in report.violations] == ["value"]


def test_value_of_a_deleted_key_fails(log):
    report = check([rec(A, 4, {"v": 2})], log, TABLE)
    assert [v.kind for v in report.violations] == ["value"]


def test_not_found_while_the_key_was_live_fails(log):
    report = check([rec(A, 3, outcome="not_found")], log, TABLE)
    assert [v.kind for v in report.violations] == ["value"]


def test_position_beyond_the_changelog_end_fails(log):
    report = check([rec(A, 99, {"v": 3})], log, TABLE)
    assert [v.kind for v in report.violations] == ["position"]


def test_answer_without_position_fails_but_a_404_without_one_is_only_unverifiable(log):
    no_pos = rec(A, None, {"v": 3})
    report = check([no_pos], log, TABLE)
    assert [v.kind for v in report.violations] == ["position"]
    report = check([rec(A, None, outcome="not_found"), rec(A, 5, {"v": 3})], log, TABLE)
    assert report.ok and report.unverifiable == 1


def test_position_of_another_partition_fails(log):
    other = (part(A) + 1) % P
    r = rec(A, 5, {"v": 3})
    r["position"] = single(TABLE, other, 5)
    report = check([r], log, TABLE)
    assert [v.kind for v in report.violations] == ["position"]


def test_float_re_encoding_is_tolerated():
    assert same_value({"sum": 0.1 + 0.2, "count": 3}, {"sum": 0.3, "count": 3.0})
    assert not same_value({"sum": 0.31}, {"sum": 0.3})
    assert not same_value({"a": 1}, {"a": 1, "b": 2})
    assert not same_value(True, 1)


def test_answers_out_of_their_bound_fail(log):
    records = [rec(A, 5, {"v": 3}, bound={"max_lag": 2}, lag=(3, 0)),
               rec(A, 5, {"v": 3}, bound={"max_staleness_ms": 100}, lag=(0, 101)),
               rec(A, 3, {"v": 2}, bound={"min_position": single(TABLE, part(A), 4)}),
               rec(A, 5, {"v": 3}, bound={"max_lag": 3, "max_staleness_ms": 101}, lag=(3, 101))]
    report = check(records, log, TABLE)
    assert [(v.index, v.kind) for v in report.violations] == [(0, "bound"), (1, "bound"), (2, "bound")]


def test_min_position_of_other_partitions_does_not_constrain(log):
    other = (part(A) + 1) % P
    token = Position(TABLE, {other: 1000, part(A): 1}).encode()
    report = check([rec(A, 1, {"v": 1}, bound={"min_position": token})], log, TABLE)
    assert report.ok, report.to_dict()


def test_session_that_reads_backwards_fails(log):
    p = part(A)
    first = rec(A, 5, {"v": 3}, session="w1", seq=1)
    # The client passed a stale token, so the bound check alone would not notice the step back.
    backwards = rec(A, 3, {"v": 2}, session="w1", seq=2, bound={"min_position": single(TABLE, p, 1)})
    report = check([first, backwards], log, TABLE)
    assert [v.kind for v in report.violations] == ["session"]
    assert report.violations[0].index == 1


def test_sessions_are_independent_and_ordered_by_seq(log):
    p = part(A)
    token = single(TABLE, p, 3)
    records = [rec(A, 5, {"v": 3}, session="w1", seq=1),
               rec(A, 3, {"v": 2}, session="w2", seq=1, bound={"min_position": token}),
               # sent later by w1 but recorded first: ordering follows seq, not file order
               rec(A, 5, {"v": 3}, session="w1", seq=3, bound={"min_position": single(TABLE, p, 5)}),
               rec(A, 5, {"v": 3}, session="w1", seq=2, bound={"min_position": single(TABLE, p, 5)})]
    report = check(records, log, TABLE)
    assert report.ok, report.to_dict()
    assert report.session_reads_checked == 3


def test_a_session_read_without_min_position_may_be_older(log):
    records = [rec(A, 5, {"v": 3}, session="w1", seq=1), rec(A, 1, {"v": 1}, session="w1", seq=2)]
    assert check(records, log, TABLE).ok


def test_failed_lookups_are_counted_not_checked(log):
    failed = rec(A, None, outcome="unavailable")
    report = check([failed, rec(A, 5, {"v": 3})], log, TABLE)
    assert report.ok and report.failed == 1 and report.answered == 1


def test_empty_or_all_failed_recording_does_not_pass(log):
    assert not check([], log, TABLE).ok
    assert not check([rec(A, None, outcome="unavailable")], log, TABLE).ok


def test_report_lists_offending_requests(log):
    report = check([rec(A, 2, {"v": 2}, t=1.5)], log, TABLE)
    doc = report.to_dict()
    assert doc["ok"] is False and doc["violations"] == 1
    assert doc["offending"][0]["t"] == 1.5 and doc["offending"][0]["key"] == A


def windowed_log():
    """Key A's windows in A's partition: 0 w0=1, 1 w10=2, 2 watermark 10 s, 3 w0 tombstoned (expired), 4 watermark 25 s."""
    from freshroute.windows import WATERMARK_KEY, window_key

    p = part(A)
    w = lambda s: window_key(A.encode(), s).decode()  # noqa: E731
    rows = [(p, 0, w(0), orjson.dumps({"n": 1})), (p, 1, w(10_000), orjson.dumps({"n": 2})),
            (p, 2, WATERMARK_KEY.decode(), orjson.dumps({"watermark_ms": 10_000})), (p, 3, w(0), None),
            (p, 4, WATERMARK_KEY.decode(), orjson.dumps({"watermark_ms": 25_000}))]
    return Changelog.from_records("t-changelog", P, rows)


def window_rec(offset: int, windows: list[tuple[int, dict, bool]], frm: int = 0, to: int = 60_000) -> dict:
    r = rec(A, offset)
    r.update(from_ms=frm, to_ms=to, value=None,
             windows=[{"start": s, "end": s + 10_000, "value": v, "final": f} for s, v, f in windows])
    return r


def test_window_answers_are_checked_against_the_changelog_and_watermark_at_their_position():
    from freshroute.windows import tumbling

    log = windowed_log()
    spec = tumbling("10s", retention="5s")  # [0, 10 s) expires at 15 s; [10 s, 20 s) at 25 s
    good = [window_rec(2, [(0, {"n": 1}, False), (10_000, {"n": 2}, False)]),
            window_rec(3, [(0, {"n": 1}, True), (10_000, {"n": 2}, False)]),  # tombstone at 3 is not before offset 3
            window_rec(4, [(10_000, {"n": 2}, False)]),
            window_rec(5, []),  # watermark 25 s: [10 s, 20 s) expired too
            window_rec(2, [(10_000, {"n": 2}, False)], frm=5_000)]
    report = check(good, log, TABLE, spec)
    assert report.ok and report.values_checked == 5, report.to_dict()
    bad = [window_rec(3, [(0, {"n": 1}, False), (10_000, {"n": 2}, False)]),  # claims not final
           window_rec(4, [(0, {"n": 1}, True), (10_000, {"n": 2}, False)]),  # serves a deleted window
           window_rec(2, [(0, {"n": 9}, False), (10_000, {"n": 2}, False)]),  # wrong value
           window_rec(2, [(0, {"n": 1}, False)])]  # misses one
    report = check(bad, log, TABLE, spec)
    assert [v.index for v in report.violations] == [0, 1, 2, 3] and {v.kind for v in report.violations} == {"value"}
    assert not check([window_rec(2, [])], log, TABLE, None).ok  # a window answer needs the window definition


def compacted(log: Changelog, removed: set[int]) -> Changelog:
    """``log`` as Kafka's cleaner could leave it: the records at ``removed`` offsets (each superseded later) gone."""
    rows = [(p, o, k, None if v is None else orjson.dumps(v)) for (p, k), (offsets, values) in log._history.items()
            for o, v in zip(offsets, values) if o not in removed]
    return Changelog.from_records(log.topic, log.partitions, rows, log.end_offsets)


def test_answers_that_compaction_left_undecided_are_unverifiable_not_violations(log):
    # Offsets 0 (A=1) and 2 (A=2) cleaned away: A's state before offsets 1..3 is no longer known, B's still is.
    log = compacted(log, {0, 2})
    p = part(A)
    assert not log.settled_at(A, p, 3) and not log.settled_at(A, p, 1)
    assert log.settled_at(A, p, 5) and log.settled_at(B, p, 3) and log.settled_at(A, p, 0)
    report = check([rec(A, 3, {"v": 2}), rec(A, 1, {"v": 1}), rec(B, 3, {"v": 10}), rec(A, 5, {"v": 3}),
                    rec(A, 5, {"v": 2})], log, TABLE)
    assert report.unverifiable == 2 and report.values_checked == 3
    assert [v.kind for v in report.violations] == ["value"] and report.violations[0].index == 4


def test_a_key_whose_last_record_precedes_the_gap_is_still_decided(log):
    # B's only record is at 1; offset 2 (A's) was cleaned: B's state after it is still B=10.
    log = compacted(log, {2})
    assert log.settled_at(B, part(B), 5)
    report = check([rec(B, 5, {"v": 10}), rec(B, 5, {"v": 11})], log, TABLE)
    assert report.values_checked == 2 and report.unverifiable == 0 and len(report.violations) == 1


def test_an_answer_after_a_write_must_be_past_the_first_row_that_reflects_it():
    from freshroute import input_position

    p = part(A)
    rows = [(p, 0, A, orjson.dumps({"v": 1}), input_position.encode([3])),
            (p, 1, A, orjson.dumps({"v": 2}), input_position.encode([7])),
            (p, 2, B, orjson.dumps({"v": 9}), input_position.encode([8]))]
    log = Changelog.from_records("t-changelog", P, rows)
    assert log.reflected_at(A, p, {0: 5}) == 1 and log.reflected_at(A, p, {0: 8}) is None
    good = rec(A, 2, {"v": 2}) | {"after_offsets": {"0": 7}}
    stale = rec(A, 1, {"v": 1}) | {"after_offsets": {"0": 7}}
    other_key = rec(A, 2, {"v": 2}) | {"after_offsets": {"0": 8}}  # the write was B's: not A's to include
    report = check([good, stale, other_key], log, TABLE)
    assert report.writes_checked == 2
    assert [(v.index, v.kind) for v in report.violations] == [(1, "read_your_writes")]
    assert report.unverifiable == 1

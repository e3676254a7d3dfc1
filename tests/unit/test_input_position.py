"""The input position rule (freshroute.input_position), and the corpus the bulk restore reader's copy of it is held to:
``tests/data/position_corpus.json`` holds histories of a key's rows and what the rule makes of them; the Rust crate's
``cargo test`` holds native/bulkload/records to it (run by tests/unit/test_bulkload_formats.py)."""

from __future__ import annotations

from pathlib import Path

import orjson

from freshroute import input_position

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "data" / "position_corpus.json"


def test_a_position_covers_another_when_it_is_as_far_in_every_partition_the_other_names():
    assert input_position.covers([3, 9], [3, 8])
    assert input_position.covers([3, 9], [None, 9])
    assert input_position.covers([3, 9], [3, 9])
    assert not input_position.covers([3, 8], [3, 9])
    assert not input_position.covers([None, 9], [0, 9])  # nothing of partition 0 where the held row had some
    assert not input_position.covers([3], [3, 1])  # a partition the new row does not name


def test_a_header_decodes_as_spark_writes_it_and_anything_else_is_no_position():
    assert input_position.decode(b"[null,24,3]") == [None, 24, 3]
    assert input_position.decode(input_position.encode([1, None])) == [1, None]
    for raw in (None, b"", b"not json", b'{"0": 1}', b'[1, "2"]', b"[1.5]"):
        assert input_position.decode(raw) is None
    assert input_position.of_record([("x", b"1"), (input_position.HEADER, b"[1]")]) == b"[1]"
    assert input_position.of_record(None) is None


# Histories of one replica's rows, (key, value — None: a delete —, position header bytes — None: none), in
# changelog order: the corpus the bulk restore reader's rule (native/bulkload/records) is held to.
HISTORIES: dict[str, list[tuple[bytes, bytes | None, bytes | None]]] = {
    "in order": [(b"a", b"1", b"[1]"), (b"a", b"2", b"[2]"), (b"a", b"3", b"[3]")],
    "a replay writes older rows again, then catches up": [
        (b"a", b"9", b"[5]"), (b"a", b"4", b"[3]"), (b"a", b"9", b"[5]"), (b"a", b"10", b"[6]")],
    "partition by partition": [
        (b"a", b"1", b"[3,9]"), (b"a", b"2", b"[3,8]"), (b"a", b"3", b"[null,9]"), (b"a", b"4", b"[4,9]"),
        (b"a", b"5", b"[4]"), (b"a", b"6", b"[4,9,0]"), (b"a", b"7", b"[4,9]")],
    "a row without a position leaves the held one": [(b"a", b"1", b"[5]"), (b"a", b"2", None), (b"a", b"3", b"[3]")],
    "a delete without a position forgets it": [(b"a", b"1", b"[5]"), (b"a", None, None), (b"a", b"3", b"[3]")],
    "a delete with a position keeps it": [(b"a", None, b"[5]"), (b"a", b"2", b"[3]"), (b"a", b"3", b"[6]")],
    "an unreadable position is none": [
        (b"a", b"1", b"garbage"), (b"a", b"2", b"[1]"), (b"a", b"3", b"[1.5]"), (b"a", b"4", b"[0]"),
        (b"a", b"5", b"[true]"), (b"a", b"6", b'["2"]'), (b"a", b"7", b"null"), (b"a", b"8", b"{}"), (b"a", b"9", b""),
        (b"a", b"10", b"[[1]]"), (b"a", b"11", b"[1,]"), (b"a", b"12", b"[0]")],
    "as JSON allows": [(b"a", b"1", b"[ 5 , null ]\n"), (b"a", b"2", b"[5,null]"), (b"a", b"3", b"[4]"),
                       (b"a", b"4", b"[-0,1]"), (b"a", b"5", b"[-1]"), (b"a", b"6", b"[9223372036854775807]"),
                       (b"a", b"7", b"[18446744073709551615]"), (b"a", b"8", b"[9223372036854775808]"),
                       (b"a", b"9", b"[1e3]"), (b"a", b"10", b"[-9223372036854775808]"),
                       (b"a", b"11", b"[-9223372036854775809]"), (b"a", b"12", b"[18446744073709551616]"),
                       (b"a", b"13", b"[01]"), (b"a", b"14", b"[1E2]"), (b"a", b"15", b"[\x0c1]"),
                       (b"a", b"16", b"\xef\xbb\xbf[1]"), (b"a", b"17", b" [1] "), (b"a", b"18", b"[1]x"),
                       (b"a", b"19", b"[nul]"), (b"a", b"20", b"[-]"), (b"a", b"21", b"[1,null,]"),
                       (b"a", b"22", b"[]"), (b"a", b"23", b"[null]"), (b"a", b"24", b"[-0.0]"),
                       (b"a", b"25", b"[0]")],
    "an empty position covers nothing held, and is covered by any": [
        (b"a", b"1", b"[]"), (b"a", b"2", b"[0]"), (b"a", b"3", b"[]")],
    "keys apart": [(b"a", b"1", b"[5]"), (b"b", b"1", b"[2]"), (b"b", b"2", b"[1]"), (b"a", b"2", b"[4]"),
                   (b"c", None, None), (b"c", b"1", b"[0]"), (b"b", b"3", b"[2]")],
    "the same bytes again": [(b"a", b"1", b"[7]"), (b"a", b"1", b"[7]"), (b"a", b"1", b"[6]")],
}


def replay(rows: list[tuple[bytes, bytes | None, bytes | None]]) -> tuple[list[bool], dict[bytes, bytes | None]]:
    """The rows a replica applies of ``rows`` and the position it holds for each key at the end, by the rule."""
    held: dict[bytes, bytes | None] = {}
    taken = []
    for key, value, raw in rows:
        applied, after = input_position.applies(held.get(key), raw, value is None)
        taken.append(applied)
        if applied:
            held[key] = after
    return taken, held


def corpus() -> dict:
    hexed = lambda b: None if b is None else b.hex()  # noqa: E731
    histories = []
    for name, rows in HISTORIES.items():
        taken, held = replay(rows)
        histories.append({"name": name, "rows": [{"key": k.hex(), "value": hexed(v), "position": hexed(p)}
                                                 for k, v, p in rows],
                          "taken": taken, "held": {k.hex(): hexed(p) for k, p in held.items()}})
    return {"histories": histories}


def write_corpus() -> None:
    """Write the corpus file afresh (after a change to the histories above or to the rule)."""
    CORPUS.write_bytes(orjson.dumps(corpus(), option=orjson.OPT_INDENT_2) + b"\n")


def test_the_corpus_file_holds_what_the_python_rule_says():
    assert orjson.loads(CORPUS.read_bytes()) == corpus(), (
        "tests/data/position_corpus.json is stale: .venv/bin/python -c "
        "'from tests.unit.test_input_position import write_corpus; write_corpus()'")


def test_a_replayed_older_row_is_not_applied_and_the_replay_catches_up():
    taken, held = replay(HISTORIES["a replay writes older rows again, then catches up"])
    assert taken == [True, False, True, True] and held == {b"a": b"[6]"}
    taken, held = replay(HISTORIES["a row without a position leaves the held one"])
    assert taken == [True, True, False] and held == {b"a": b"[5]"}
    taken, held = replay(HISTORIES["a delete without a position forgets it"])
    assert taken == [True, True, True] and held == {b"a": b"[3]"}

"""The bulk restore reader's record checks (native/bulkload) are freshroute.formats', on one corpus:
``tests/data/record_corpus.json`` holds keys, values and, per pair of formats, the problem the Python checks find in
each record; the Rust crate's ``cargo test`` and the built extension are held to it here."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import freshroute_bulkload
import orjson
import pytest

from freshroute.formats import MAX_JSON_DEPTH, is_json, key_problem, value_problem

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "record_corpus.json"
FORMATS = ("string", "json", "bytes")

VALUES = [
    b"", b" ", b"1", b"-0", b"1e999", b"1E+2", b"01", b"1.", b".5", b"NaN", b"Infinity", b"true", b"nul", b"null",
    b'"a"', b'"\\u00e9"', b'"\\ud800"', b'"\\udc00"', b'"\\ud800\\udc00"', b'"\\ud800x"', b'"\\ud800\\u0041"',
    b'"\\u00zz"', b'"\\/"', b'"\\x"', b'"\xc3\xa9"', b'"\xff"', b"\xff", b'"\xed\xa0\x80"', b'"\x01"', b'"\x7f"',
    b'"tab\there"', b'{"a":1}', b'{"a":1,}', b"[1,2]", b"[1 2]", b" [ ] ", b"{}{}", b"1 2", b'\t{"a":"b"}\n',
    b'{"a"}', b"{1:2}", b"\xef\xbb\xbf1", b"1\x00", b'"a\x00b"', b"12345678901234567890123456789", b"-", b"--1",
    b"0x10", b"[1e5,2.5e-3]", b'["[[[", "\\"]"]', b'{"k": "\\\\u12"}',
]
DEEP = [open_ * depth + b"1" + close * depth
        for depth in (MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 2_000)
        for open_, close in ((b"[", b"]"), (b'{"a":', b"}"))]
STRINGS_OF_BRACKETS = [b'["' + b"[" * 2 * MAX_JSON_DEPTH + b'"]']
KEYS = [None, b"", b"k", b"\xff", b'"k"', b"1", b"{"]
RECORD_VALUES = [None, *VALUES, *DEEP, *STRINGS_OF_BRACKETS]


def expected(key_format: str, value_format: str, key: bytes | None, value: bytes | None) -> str | None:
    if key is None:
        return "null key"
    return key_problem(key_format, key) or (None if value is None else value_problem(value_format, value))


def corpus() -> dict:
    """The corpus as the file holds it: bytes in hex (None: a null key, or a tombstone), and the Python checks'
    problem of every record, key by key and value by value, for each pair of formats."""
    hexed = [None if b is None else b.hex() for b in RECORD_VALUES]
    return {"keys": [None if k is None else k.hex() for k in KEYS], "values": hexed,
            "expected": [{"key_format": kf, "value_format": vf,
                          "problems": [expected(kf, vf, key, value) for key in KEYS for value in RECORD_VALUES]}
                         for kf in FORMATS for vf in FORMATS]}


def write_corpus() -> None:
    """Write the corpus file afresh (after a change to the lists above or to freshroute.formats)."""
    CORPUS.write_bytes(orjson.dumps(corpus()) + b"\n")


def test_the_corpus_file_holds_what_the_python_checks_say():
    assert orjson.loads(CORPUS.read_bytes()) == corpus(), (
        "tests/data/record_corpus.json is stale: .venv/bin/python -c "
        "'from tests.unit.test_bulkload_formats import write_corpus; write_corpus()'")


@pytest.mark.parametrize("key_format", FORMATS)
@pytest.mark.parametrize("value_format", FORMATS)
def test_the_reader_skips_exactly_the_records_the_tailer_skips(key_format, value_format):
    differ = [(key, value, got, want)
              for key in KEYS for value in RECORD_VALUES
              if (got := freshroute_bulkload.problem(key_format, value_format, key, value))
              != (want := expected(key_format, value_format, key, value))]
    assert differ == []


def test_the_record_checks_crate_passes_its_tests_on_the_corpus():
    """``cargo test`` of native/bulkload/records (no Python, no Kafka: seconds once its two crates are built)."""
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    assert Path(cargo).exists(), "cargo is missing: ./dev installs it"
    target = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "freshroute" / "cargo"
    done = subprocess.run([cargo, "test", "--locked", "-q", "-p", "freshroute-records"], cwd=ROOT / "native" / "bulkload",
                          env={**os.environ, "CARGO_TARGET_DIR": str(target)}, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "3 passed" in done.stdout, done.stdout[-2000:]


def test_json_nested_deeper_than_the_limit_is_not_json_and_raises_nothing():
    assert is_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)
    assert not is_json(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1))
    assert not is_json(b"[" * 100_000 + b"]" * 100_000)  # msgspec alone would raise RecursionError
    assert value_problem("json", b'{"a":' * 2_000 + b"1" + b"}" * 2_000) == "value is not JSON"
    assert is_json(b'"' + b"[" * 2_000 + b'"')  # brackets in a string nest nothing


def test_unknown_formats_are_refused():
    with pytest.raises(ValueError, match="unknown format"):
        freshroute_bulkload.problem("avro", "json", b"k", b"1")

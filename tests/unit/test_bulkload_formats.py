"""The bulk restore reader's record checks (native/bulkload) are freshroute.formats', on one corpus."""

from __future__ import annotations

import freshroute_bulkload
import pytest

from freshroute.formats import MAX_JSON_DEPTH, is_json, key_problem, value_problem

VALUES = [
    b"", b" ", b"1", b"-0", b"1e999", b"1E+2", b"01", b"1.", b".5", b"NaN", b"Infinity", b"true", b"nul", b"null",
    b'"a"', b'"\\u00e9"', b'"\\ud800"', b'"\\udc00"', b'"\\ud800\\udc00"', b'"\\ud800x"', b'"\\ud800\\u0041"',
    b'"\\u00zz"', b'"\\/"', b'"\\x"', b'"\xc3\xa9"', b'"\xff"', b"\xff", b'"\xed\xa0\x80"', b'"\x01"', b'"\x7f"',
    b'"tab\there"', b'{"a":1}', b'{"a":1,}', b"[1,2]", b"[1 2]", b" [ ] ", b"{}{}", b"1 2", b'\t{"a":"b"}\n',
    b'{"a"}', b"{1:2}", b"\xef\xbb\xbf1", b"1\x00", b'"a\x00b"', b"12345678901234567890123456789", b"-", b"--1",
    b"0x10", b"[1e5,2.5e-3]", b'["[[[", "\\"]"]', b'{"k": "\\\\u12"}',
]
DEEP = [open_ * depth + b"1" + close * depth
        for depth in (MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 5_000)
        for open_, close in ((b"[", b"]"), (b'{"a":', b"}"))]
STRINGS_OF_BRACKETS = [b'["' + b"[" * 2 * MAX_JSON_DEPTH + b'"]']
KEYS = [None, b"", b"k", b"\xff", b'"k"', b"1", b"{"]


def expected(key_format: str, value_format: str, key: bytes | None, value: bytes | None) -> str | None:
    if key is None:
        return "null key"
    return key_problem(key_format, key) or (None if value is None else value_problem(value_format, value))


@pytest.mark.parametrize("key_format", ["string", "json", "bytes"])
@pytest.mark.parametrize("value_format", ["json", "string", "bytes"])
def test_the_reader_skips_exactly_the_records_the_tailer_skips(key_format, value_format):
    differ = [(key, value, got, want)
              for key in KEYS for value in [None, *VALUES, *DEEP, *STRINGS_OF_BRACKETS]
              if (got := freshroute_bulkload.problem(key_format, value_format, key, value))
              != (want := expected(key_format, value_format, key, value))]
    assert differ == []


def test_json_nested_deeper_than_the_limit_is_not_json_and_raises_nothing():
    assert is_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)
    assert not is_json(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1))
    assert not is_json(b"[" * 100_000 + b"]" * 100_000)  # msgspec alone would raise RecursionError
    assert value_problem("json", b'{"a":' * 2_000 + b"1" + b"}" * 2_000) == "value is not JSON"
    assert is_json(b'"' + b"[" * 2_000 + b'"')  # brackets in a string nest nothing


def test_unknown_formats_are_refused():
    with pytest.raises(ValueError, match="unknown format"):
        freshroute_bulkload.problem("avro", "json", b"k", b"1")

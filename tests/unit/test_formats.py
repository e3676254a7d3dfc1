"""Key and value formats of tables served from a topic as it is: how callers name keys, and which records a store
node refuses (how values are served: test_router_rest, test_router_grpc)."""

import orjson
import pytest

from freshroute.errors import InvalidArgument
from freshroute.formats import bound_to_bytes, key_from_bytes, key_problem, key_to_bytes, value_problem
from freshroute.keys import partition_for
from freshroute.formats import locate


def test_keys_are_named_in_their_format_and_hash_as_kafka_places_them():
    assert key_to_bytes("string", "sensor-1") == b"sensor-1"
    assert key_to_bytes("json", ' { "id" : 7 , "n": "x" } ') == b'{"id":7,"n":"x"}'  # compact, order kept
    assert key_to_bytes("json", "42") == b"42"
    assert key_to_bytes("bytes", "AAH_") == bytes([0, 1, 255]) == key_to_bytes("bytes", "AAH_")
    assert key_to_bytes("bytes", "AA") == b"\x00"  # padding optional
    raw, partition = locate('{"id":7}', 12, "json")
    assert raw == b'{"id":7}' and partition == partition_for(raw, 12)
    for fmt, raw in (("string", b"k"), ("json", b'{"a":[1,2]}'), ("bytes", bytes(range(256)))):
        assert key_to_bytes(fmt, key_from_bytes(fmt, raw)) == raw


@pytest.mark.parametrize("fmt, key, says", [("json", "not json", "is not JSON text"),
                                            ("bytes", "!!!", "is not base64url"),
                                            ("json", 5, "must be a string")])
def test_a_key_not_of_its_tables_format_is_an_invalid_argument(fmt, key, says):
    with pytest.raises(InvalidArgument) as e:
        key_to_bytes(fmt, key)
    assert says in e.value.message and e.value.details["field"] == "key"


def test_scan_bounds_are_text_but_for_bytes_keys():
    assert bound_to_bytes("json", '{"id"', "prefix") == b'{"id"'
    assert bound_to_bytes("bytes", "AA", "prefix") == b"\x00"


def test_a_store_node_refuses_records_not_of_the_tables_formats():
    assert key_problem("string", b"\xff") == "key is not UTF-8" and key_problem("bytes", b"\xff") is None
    assert key_problem("json", b"{") == "key is not JSON" and key_problem("json", b'"k"') is None
    assert value_problem("json", b"nope") == "value is not JSON"
    assert value_problem("string", b"\xff\xfe") == "value is not UTF-8 text"
    assert value_problem("bytes", b"\xff") is None


@pytest.mark.parametrize("raw", [b'{"a":1}', b' [1, "x", null] ', b'"\xc3\xa9"', b"1", b"null", b'{"a":"\\q"}',
                                 b'{"a":"x\ny"}', b'{"a":01}', b'{"a":1,}', b"NaN", b"", b'{"a":1} x', b'{"a":1',
                                 b'"\xed\xa0\x80"', b'{"\xff":1}', b'{"a":"\\ud800"}'])
def test_json_is_checked_as_orjson_parses_it(raw):
    from freshroute.formats import is_json

    try:
        orjson.loads(raw)
        parses = True
    except orjson.JSONDecodeError:
        parses = False
    assert is_json(raw) is parses

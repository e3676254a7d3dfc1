import pytest

from freshroute.errors import InvalidArgument
from freshroute.position import Position, single

from router.bounds import NO_BOUND, Bound, parse_bound, parse_limit, parse_query_bound


@pytest.mark.parametrize("raw", ["-1", "abc", "1.5", "", " ", "+5", "1_000", "٣", "1e3", str(1 << 64), -3, True, 2.5])
def test_malformed_limits_are_invalid_arguments_naming_the_field(raw):
    with pytest.raises(InvalidArgument) as e:
        parse_limit("max_lag", raw)
    assert e.value.code == "INVALID_ARGUMENT" and e.value.http_status == 400
    assert e.value.details["field"] == "max_lag"


@pytest.mark.parametrize("raw,expected", [("0", 0), ("17", 17), (" 5 ", 5), (42, 42), (None, None)])
def test_well_formed_limits(raw, expected):
    assert parse_limit("max_staleness_ms", raw) == expected


@pytest.mark.parametrize("token", ["garbage", "p1.!!!", "p1." + "A" * 10, "p2.abc"])
def test_garbage_position_token_is_invalid(token):
    with pytest.raises(InvalidArgument) as e:
        parse_bound("t", min_position=token)
    assert e.value.details["field"] == "min_position"


def test_position_of_another_table_is_invalid():
    with pytest.raises(InvalidArgument, match="position of table 'other'"):
        parse_bound("t", min_position=single("other", 0, 5))


def test_query_bound_parses_all_three():
    token = Position("t", {0: 10, 3: 7}).encode()
    b = parse_query_bound("t", {"max_lag": "5", "max_staleness_ms": "2000", "min_position": token, "x": "ignored"})
    assert (b.max_lag, b.max_staleness_ms) == (5, 2000)
    assert (b.min_offset(0), b.min_offset(3), b.min_offset(1)) == (10, 7, 0)
    assert parse_query_bound("t", {}) is NO_BOUND


def test_defaults_fill_only_unset_limits():
    assert Bound(max_lag=3).with_defaults(10, 5000) == Bound(3, 5000)
    assert Bound().with_defaults(None, 5000) == Bound(None, 5000)
    assert Bound(1, 2).with_defaults(10, 20) == Bound(1, 2)

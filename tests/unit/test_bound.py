"""Position tokens and a caller's bound: its definition, parsing, judgement and every encoding of it."""

import pytest

from freshroute.errors import InvalidArgument
import typing

from freshroute.bound import NO_BOUND, PARAMETERS, REPLICA_LIMITS, Bound, BoundArgs, parse_limit
from freshroute.position import Position, single
from freshroute.wire import bound_of_read, read_bound
from freshroute.write_tokens.token import ReadAfter, WriteToken
from proto import router_pb2, store_pb2
from router.bound_message import bound_message, bound_of_message


def test_round_trip_and_offset_for():
    token = single("sensor_stats", 3, 1234)
    pos = Position.decode(token)
    assert pos.table == "sensor_stats"
    assert pos.offset_for(3) == 1234
    assert pos.offset_for(4) == 0


def test_merge_keeps_the_later_offset_per_partition():
    a = Position("t", {0: 5, 1: 9})
    b = Position("t", {1: 7, 2: 3})
    assert a.merge(b).offsets == {0: 5, 1: 9, 2: 3}
    with pytest.raises(InvalidArgument):
        a.merge(Position("other", {}))


@pytest.mark.parametrize("garbage", ["", "abc", "p1.", "p1.!!!", "p1.e30", "p2.eyJ0IjoidCIsIm8iOnt9fQ", "p1." + "A" * 9000])
def test_garbage_tokens_are_invalid_argument(garbage):
    with pytest.raises(InvalidArgument) as e:
        Position.decode(garbage)
    assert e.value.code == "INVALID_ARGUMENT"


def test_negative_offsets_rejected():
    bad = Position("t", {0: -1}).encode()
    with pytest.raises(InvalidArgument):
        Position.decode(bad)



@pytest.mark.parametrize("raw", ["-1", "abc", "1.5", "", " ", "+5", "1_000", "٣", "1e3", str(1 << 64), -3, True, 2.5, 1e300, -1.0,
                                 float("nan"), float("inf")])
def test_malformed_limits_are_invalid_arguments_naming_the_field(raw):
    with pytest.raises(InvalidArgument) as e:
        parse_limit("max_lag", raw)
    assert e.value.code == "INVALID_ARGUMENT" and e.value.http_status == 400
    assert e.value.details["field"] == "max_lag"


@pytest.mark.parametrize("raw,expected", [("0", 0), ("17", 17), (" 5 ", 5), (42, 42), (None, None),
                                          (42.0, 42)])
def test_well_formed_limits(raw, expected):
    assert parse_limit("max_staleness_ms", raw) == expected


@pytest.mark.parametrize("token", ["garbage", "p1.!!!", "p1." + "A" * 10, "p2.abc"])
def test_garbage_position_token_is_invalid(token):
    with pytest.raises(InvalidArgument) as e:
        Bound.parse({"min_position": token})
    assert e.value.details["field"] == "min_position"


def test_query_bound_parses_all_three():
    token = Position("t", {0: 10, 3: 7}).encode()
    b = Bound.parse({"max_lag": "5", "max_staleness_ms": "2000", "min_position": token, "x": "ignored"})
    assert (b.max_lag, b.max_staleness_ms) == (5, 2000)
    assert (b.min_offset(0), b.min_offset(3), b.min_offset(1)) == (10, 7, 0)
    assert Bound.parse({}) is NO_BOUND


def test_defaults_fill_only_unset_limits():
    assert Bound(max_lag=3).with_defaults(10, 5000) == Bound(3, 5000)
    assert Bound().with_defaults(None, 5000) == Bound(None, 5000)
    assert Bound(1, 2).with_defaults(10, 20) == Bound(1, 2)


def test_refusal_rules():
    bound = Bound(max_lag=10, max_staleness_ms=300, min_position=Position("t", {3: 100}))
    assert NO_BOUND.refusal(3, applied=100, end=110, staleness_ms=300) is None
    assert bound.refusal(3, applied=100, end=110, staleness_ms=300) is None
    assert "offsets behind" in Bound(max_lag=9).refusal(3, 100, 110, 300)
    assert "ms stale" in Bound(max_staleness_ms=299).refusal(3, 100, 110, 300)
    assert "below the requested position" in Bound(min_position=Position("t", {3: 101})).refusal(3, 100, 110, 0)
    # The position names partition 3 only: another partition's replica may answer at any offset.
    assert Bound(min_position=Position("t", {3: 101})).refusal(4, 0, 0, 0) is None
    assert "not known" in Bound(max_lag=100).refusal(3, 5, None, 0)


def test_store_wire_narrows_the_position_to_the_partition_and_back():
    bound = Bound(max_lag=0, min_position=Position("t", {1: 7, 2: 9}))
    msg = read_bound(bound, 2)
    assert msg.max_lag == 0 and not msg.HasField("max_staleness_ms") and msg.min_offset == 9
    back = bound_of_read("t", 2, store_pb2.ReadBound.FromString(msg.SerializeToString()))
    assert back == Bound(max_lag=0, max_staleness_ms=None, min_position=Position("t", {2: 9}))
    assert bound_of_read("t", 2, store_pb2.ReadBound()) == NO_BOUND


def test_public_wire_and_query_round_trip():
    bound = Bound(max_lag=3, max_staleness_ms=50, min_position=Position("t", {0: 4}))
    assert bound_of_message(bound_message(bound)) == bound
    assert Bound.parse(bound.to_query()) == bound
    with pytest.raises(InvalidArgument) as e:
        bound_of_message(router_pb2.Bound(min_position="garbage"))
    assert e.value.details["field"] == "min_position"


# ---- the definition: every parameter declared once ---------------------------------------------------------

EVERY = Bound(max_lag=3, max_staleness_ms=50, min_position=Position("t", {0: 4}), max_input_lag_ms=900,
              after=WriteToken({"readings": {0: 7}}, {}, 1), wait_ms=250, version=2)


def test_the_parameters_are_the_leading_fields_and_the_keywords_a_type_checker_sees():
    assert tuple(PARAMETERS) == Bound._fields[:len(PARAMETERS)] == tuple(typing.get_type_hints(BoundArgs))
    assert Bound._fields[len(PARAMETERS):] == ("read_after",)  # filled in by the router, never a caller's
    assert all(v is not None for v in EVERY[:len(PARAMETERS)])  # the bound below sets every parameter


def test_every_parameter_survives_every_encoding():
    assert bound_of_message(bound_message(EVERY)) == EVERY
    assert Bound.parse(EVERY.to_query()) == EVERY
    assert Bound.parse(EVERY.shown()) == EVERY  # a JSON body's values
    assert Bound.of(None, dict(EVERY.shown())) == EVERY  # the clients' keywords
    assert Bound.of(Bound(max_lag=1, wait_ms=5), {"max_lag": 3}) == Bound(max_lag=3, wait_ms=5)


def test_every_parameter_is_in_the_public_proto_under_its_own_name():
    assert set(PARAMETERS) <= set(router_pb2.Bound.DESCRIPTOR.fields_by_name)


def test_every_replica_limit_travels_to_the_replica_under_its_own_name():
    fields = store_pb2.ReadBound.DESCRIPTOR.fields_by_name
    assert REPLICA_LIMITS and set(REPLICA_LIMITS) <= set(fields)
    for name in REPLICA_LIMITS:
        bound = Bound(**{name: 0})
        assert bound_of_read("t", 0, read_bound(bound, 0)) == bound


def test_error_details_show_what_limits_the_answer():
    assert NO_BOUND.to_dict() == {"max_lag": None, "max_staleness_ms": None}
    details = EVERY.to_dict()
    assert details["after"] == EVERY.after.encode() and details["max_input_lag_ms"] == 900
    assert "wait_ms" not in details  # how long to look is not a limit of the answer
    assert "version" not in details  # which table is read, not how fresh


@pytest.mark.parametrize("raw", [{"max_lag": "x"}, {"wait_ms": "0"}, {"wait_ms": 60_001}, {"after": "w1.garbage"},
                                 {"min_position": 5}, {"after": 7}, {"version": "0"}, {"version": 1 << 31}])
def test_a_malformed_parameter_is_refused_naming_it(raw):
    with pytest.raises(InvalidArgument) as e:
        Bound.parse(raw)
    assert e.value.details["field"] == next(iter(raw))


def test_bounds_a_replica_judges_alike_share_a_key_and_others_do_not():
    from freshroute.wire import judged_alike

    position = Position("t", {1: 7, 2: 9})
    assert judged_alike(NO_BOUND, 1) is None
    bound = Bound(max_lag=3, min_position=position)
    assert judged_alike(bound, 1) == judged_alike(Bound(max_lag=3, min_position=Position("t", {1: 7})), 1)
    assert judged_alike(bound, 1) != judged_alike(bound, 2)  # the position narrowed to each partition differs
    assert judged_alike(Bound(max_lag=3), 1) != judged_alike(Bound(max_lag=4), 1)
    assert judged_alike(Bound(max_staleness_ms=3), 1) != judged_alike(Bound(max_lag=3), 1)


@pytest.mark.parametrize("bound", [NO_BOUND, Bound(max_lag=0), Bound(max_staleness_ms=500),
                                   Bound(min_position=Position("t", {0: 3})),
                                   Bound(max_lag=5, max_staleness_ms=500, min_position=Position("t", {1: 3}))],
                         ids=["none", "max_lag", "max_staleness_ms", "min_position", "all three"])
def test_a_bound_of_lag_staleness_and_position_alone_is_judged_by_the_compiled_paths(bound):
    assert bound.compiled is True


@pytest.mark.parametrize("bound", [Bound(wait_ms=100), Bound(after=WriteToken({"readings": {0: 7}}, {}, 1)),
                                   Bound(version=1), Bound(max_input_lag_ms=1000),
                                   Bound(max_lag=5, version=2),
                                   Bound(read_after=ReadAfter("in", {0: 1}))],
                         ids=["wait_ms", "after", "version", "max_input_lag_ms", "max_lag and version", "read_after"])
def test_a_bound_with_any_other_parameter_is_left_to_the_python_path(bound):
    assert bound.compiled is False


def test_every_parameter_the_compiled_paths_judge_is_named():
    """A new parameter is the Python path's until a compiled path judges it and says so."""
    assert [name for name, p in PARAMETERS.items() if p.compiled] == ["max_lag", "max_staleness_ms", "min_position"]

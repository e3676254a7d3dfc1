import pytest

from freshroute.errors import InvalidArgument
from freshroute.position import Position, single


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

"""The burst step's judgement: caught up when every table is within the floor of its input's end."""

from loadtest.burst import caught_up


def test_caught_up_when_every_table_is_within_the_floor():
    assert caught_up({"a": 0, "b": 100}, floor=100)
    assert not caught_up({"a": 0, "b": 101}, floor=100)


def test_a_table_whose_lag_is_unknown_or_no_table_at_all_is_not_caught_up():
    assert not caught_up({"a": 0, "b": None}, floor=100)
    assert not caught_up({}, floor=100)

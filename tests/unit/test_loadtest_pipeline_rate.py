import sys

from loadtest.pipeline_rate import held, settle


class Lags:
    def __init__(self, *samples: dict) -> None:
        self.samples = list(samples)

    def sample_all(self) -> dict:
        return self.samples.pop(0) if len(self.samples) > 1 else self.samples[0]


def test_a_rate_is_held_while_every_table_is_within_two_seconds_of_input_and_ten_at_a_pause():
    assert held({"a": 1_999, "b": 10}, {"a": 9_999, "b": 10}, 1_000.0)
    assert not held({"a": 1_999, "b": 2_001}, {"a": 1_999, "b": 2_001}, 1_000.0)
    assert not held({"a": 1_999}, {"a": 10_001}, 1_000.0)


def test_no_table_seen_an_unknown_lag_or_no_input_is_not_held():
    assert not held({}, {}, 1_000.0)
    assert not held({"a": 0}, {"a": sys.maxsize}, 1_000.0)
    assert not held({"a": 0}, {"a": 0}, 0.0)


def test_settle_waits_for_every_table_and_gives_up_in_time():
    assert settle(Lags({"a": 5_000, "b": 0}, {"a": None, "b": 0}, {"a": 100, "b": 3}), timeout_s=5)
    assert not settle(Lags({"a": 101}), timeout_s=0.6)
    assert not settle(Lags({}), timeout_s=0.6)

"""Key choice (uniform, zipf), bound mixes and sessions of the load clients."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from freshroute.position import Position, single
from loadtest.workload import BoundChoice, BoundMixer, KeyChooser, Session, bound_params, parse_bound_mix


def test_zipf_probabilities_follow_one_over_rank_to_the_s():
    chooser = KeyChooser.for_keyspace("k", 100, "zipf", zipf_s=1.0)
    harmonic = sum(1 / r for r in range(1, 101))
    assert chooser.probability(0) == pytest.approx(1 / harmonic)
    assert chooser.probability(9) == pytest.approx(1 / 10 / harmonic)
    assert sum(chooser.probability(i) for i in range(100)) == pytest.approx(1.0)


def test_zipf_draws_make_the_first_keys_hot():
    chooser = KeyChooser.for_keyspace("sensor-", 100, "zipf", zipf_s=1.1, seed=3)
    counts = Counter(chooser.choose() for _ in range(20000))
    assert counts.most_common(1)[0][0] == "sensor-0"
    share = counts["sensor-0"] / 20000
    assert share == pytest.approx(chooser.probability(0), abs=0.02)
    assert counts["sensor-0"] > counts["sensor-1"] > counts["sensor-9"]
    assert set(counts) <= {f"sensor-{i}" for i in range(100)}


def test_uniform_draws_cover_the_keyspace_evenly():
    chooser = KeyChooser.for_keyspace("sensor-", 10, "uniform", seed=5)
    counts = Counter(chooser.choose() for _ in range(10000))
    assert set(counts) == {f"sensor-{i}" for i in range(10)}
    assert max(counts.values()) / min(counts.values()) < 1.3
    assert chooser.probability(3) == pytest.approx(0.1)


def test_key_chooser_rejects_bad_input():
    with pytest.raises(ValueError):
        KeyChooser([], "uniform")
    with pytest.raises(ValueError):
        KeyChooser(["a"], "pareto")
    with pytest.raises(ValueError):
        KeyChooser(["a"], "zipf", zipf_s=0)


def test_bound_mix_parses_kinds_values_and_weights():
    mix = parse_bound_mix("none:4, max_lag=100:2,max_staleness_ms=5000,session:0.5,max_input_lag_ms=3000")
    assert mix == [BoundChoice("none", None, 4.0), BoundChoice("max_lag", 100, 2.0),
                   BoundChoice("max_staleness_ms", 5000, 1.0), BoundChoice("session", None, 0.5),
                   BoundChoice("max_input_lag_ms", 3000, 1.0)]
    assert bound_params(mix[-1], None, "t") == {"max_input_lag_ms": 3000}
    for bad in ("", "max_lag", "none=3", "fresh:1", "max_lag=-1", "none:0", "max_input_lag_ms"):
        with pytest.raises(ValueError):
            parse_bound_mix(bad)


def test_bound_mixer_follows_weights():
    mixer = BoundMixer(parse_bound_mix("none:3,session:1"), random.Random(1))
    counts = Counter(mixer.choose().kind for _ in range(8000))
    assert counts["none"] / 8000 == pytest.approx(0.75, abs=0.03)


def test_session_merges_positions_and_passes_them_as_min_position():
    s = Session("w1")
    assert bound_params(BoundChoice("session"), s, "t") == {}
    s.observe("t", single("t", 1, 5))
    s.observe("t", single("t", 2, 7))
    s.observe("t", single("t", 1, 3))  # an older answer never moves the session back
    s.observe("t", "garbage")
    s.observe("t", single("other", 1, 99))
    params = bound_params(BoundChoice("session"), s, "t")
    assert Position.decode(params["min_position"]).offsets == {1: 5, 2: 7}
    assert bound_params(BoundChoice("max_lag", 10), s, "t") == {"max_lag": 10}
    assert bound_params(BoundChoice("none"), s, "t") == {}
    assert [s.next_seq(), s.next_seq()] == [1, 2]

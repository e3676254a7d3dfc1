"""How ``loadtest.peers`` judges each step: a peer's lag from its group's committed offsets, and the side-by-side
table's winners."""

from loadtest.consumer_lag import NO_OFFSET, records_behind
from loadtest.peers.report import table, winners
from loadtest.peers.steps import SMOKE, Plan, held_every_rate, sample_keys


def test_a_group_is_behind_by_the_records_between_its_commits_and_the_ends():
    assert records_behind({0: 90, 1: 200}, {0: 100, 1: 250}) == 60
    assert records_behind({0: 100, 1: 250}, {0: 100, 1: 250}) == 0


def test_a_partition_without_a_commit_makes_the_lag_unknown_not_zero():
    assert records_behind({0: 100}, {0: 100, 1: 5}) is None
    assert records_behind({0: 100, 1: NO_OFFSET}, {0: 100, 1: 5}) is None
    assert records_behind({}, {}) is None


def test_a_commit_past_the_end_read_a_moment_earlier_counts_as_caught_up_not_negative():
    assert records_behind({0: 105}, {0: 100}) == 0


def test_the_winner_is_the_best_figure_in_the_rows_direction_and_ties_share_it():
    assert winners({"a": 10.0, "b": 20.0}, higher_wins=True) == {"b"}
    assert winners({"a": 10.0, "b": 20.0}, higher_wins=False) == {"a"}
    assert winners({"a": 0, "b": 0, "c": 3}, higher_wins=False) == {"a", "b"}


def test_a_figure_not_measured_wins_nothing():
    assert winners({"a": None, "b": 5.0}, higher_wins=False) == {"b"}
    assert winners({"a": None}, higher_wins=True) == set()


def test_the_table_bolds_only_each_rows_winner():
    figures = {
        "freshroute": {"lookups_rps_1": 8000, "lookups_rps_2": 8100, "lookups_p99_ms_2": 13.4, "freshness_p50_ms": 15.0,
                       "freshness_p99_ms": 40.0, "burst_s": 34.0, "max_events_per_s": 990.0, "failover_failed": 0,
                       "rest_cores": 0.6},
        "kafka-streams": {"lookups_rps_1": 7000, "lookups_rps_2": 15600, "lookups_p99_ms_2": 7.5,
                          "freshness_p50_ms": 4.8, "freshness_p99_ms": 12.0, "burst_s": None,
                          "max_events_per_s": 10_000.0, "max_events_capped": True, "failover_failed": 2,
                          "rest_cores": 0.18},
    }
    lines = table(figures, Plan()).splitlines()
    assert lines[0] == "| | freshroute | kafka-streams |"
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in lines[2:]}
    assert rows["lookups/s through one door (wrk, 32 connections), its JIT cold"] == ["**8,000**", "7,000 |"]
    assert rows["the same once warm"] == ["8,100", "**15,600** |"]
    assert rows["100,000 readings written at once → caught up (s)"] == ["**34.0**", "— |"]
    assert rows["lookups failed while an instance is killed"] == ["**0**", "2 |"]
    assert rows["CPU at rest at the demo's 50 readings/s (cores)"] == ["0.60", "**0.18** |"]
    assert rows["readings/s held for 60 s with bounded lag"] == ["990", "**≥ 10,000** |"]
    assert rows["of 240 probes, never visible within 10 s"] == ["—", "— |"]
    assert sum(line.count("**") for line in lines) == 2 * 9
    assert "3,000 readings written at once" in table(figures, SMOKE)


def test_the_smoke_plan_is_every_step_shorter():
    full = Plan()
    assert SMOKE.keys < full.keys and SMOKE.wrk_s < full.wrk_s and SMOKE.hold_s < full.hold_s
    assert SMOKE.burst_readings < full.burst_readings and len(SMOKE.rates) == 1 and SMOKE.warm_s == 0


def test_serving_is_judged_by_keys_spread_over_the_whole_table():
    keys = sample_keys(10_000)
    assert len(keys) == 100 and keys[0] == "sensor-0" and keys[-1] == "sensor-9900"
    assert sample_keys(50) == [f"sensor-{i}" for i in range(50)]


def test_a_system_that_held_the_ladders_every_rate_has_a_floor_not_a_limit():
    rates = (1000, 2000)
    assert held_every_rate([{"held": True}, {"held": True}], rates)
    assert not held_every_rate([{"held": True}, {"held": False}], rates)
    assert not held_every_rate([{"held": True}], rates)  # stopped early (its lag did not settle)


def test_a_percentile_of_no_samples_is_shown_as_not_measured_and_wins_nothing():
    figures = {"a": {"freshness_p99_ms": float("nan"), "never_visible": 8}, "b": {"freshness_p99_ms": 40.0}}
    row = next(line for line in table(figures, SMOKE).splitlines() if line.startswith("| the same, p99"))
    assert row == "| the same, p99 (ms) | — | **40.0** |"

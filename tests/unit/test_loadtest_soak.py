"""The soak's verdict: a line through each component's CPU from the warm-up on, and its growth over the run."""

from __future__ import annotations

import pytest

from loadtest.soak import slope, summarize


def sample(minute: int, broker: float, pipeline: float) -> dict:
    return {"minute": minute, "cores": {"broker": broker, "pipeline": pipeline},
            "rss_mib": {"broker": 300.0 + minute, "pipeline": 900.0}}


def test_slope_is_least_squares_and_zero_without_a_line():
    assert slope([(1, 1.0), (2, 3.0), (3, 5.0)]) == pytest.approx(2.0)
    assert slope([(1, 1.0)]) == 0.0 and slope([(2, 1.0), (2, 3.0)]) == 0.0


def test_a_component_growing_past_the_target_fails_the_soak_and_warm_up_minutes_do_not_count():
    # A warm-up spike in minutes 1-4, then the broker grows 0.015 cores a minute and the pipeline stays flat.
    samples = [sample(m, 0.5 if m < 5 else 0.05 + 0.015 * (m - 5), 0.9) for m in range(1, 21)]
    out = summarize(samples, from_minute=5)
    assert out["worst_component"] == "broker" and out["worst_growth_cores"] == pytest.approx(0.225)
    assert out["components"]["pipeline"]["cores_growth"] == 0.0 and not out["met"]
    assert out["components"]["broker"]["rss_mib_first"] == 305.0 and out["components"]["broker"]["rss_mib_last"] == 320.0


def test_flat_components_meet_the_target():
    out = summarize([sample(m, 0.05, 0.9) for m in range(1, 11)], from_minute=5)
    assert out["met"] and out["worst_growth_cores"] == 0.0 and out["minutes"] == 10

"""Percentiles, the summary of a recording and its time series."""

from __future__ import annotations

import pytest

from loadtest.stats import percentile, summarize, timeseries


def test_nearest_rank_percentile():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    assert percentile([5.0], 99) == 5.0
    assert percentile([3, 1, 2], 50) == 2  # unsorted input
    assert percentile([1, 2, 3, 4], 50) == 2
    assert percentile([1, 2, 3, 4], 75) == 3
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1], 101)


def _r(t, latency, outcome="ok", lag_ms=0, lag_off=0, node="node-1", role="active", status=200, code=None,
       bound_kind="none"):
    answered = outcome in ("ok", "not_found")
    return {"t": t, "latency_ms": latency, "outcome": outcome, "status": status, "code": code, "proto": "rest",
            "bound_kind": bound_kind, "served_by": {"node": node, "role": role} if answered else None,
            "lag": {"offsets": lag_off, "ms": lag_ms} if answered else None}


def test_summary_counts_throughput_latency_errors_and_staleness():
    records = [_r(0.1 * i, float(i + 1), lag_ms=i, lag_off=i % 3) for i in range(90)]
    records += [_r(9.0 + 0.1 * i, 100.0, outcome="unavailable", status=503, code="NO_REPLICA_WITHIN_BOUND")
                for i in range(8)]
    records += [_r(9.5, 50.0, outcome="transport", status="transport", code="ConnectError"),
                _r(9.6, 2.0, node="node-2", role="standby", lag_ms=500, lag_off=7)]
    s = summarize(records, duration_s=10.0, faults=[{"t": 5.0, "event": "kill -9 store-node-1"}])
    assert s["requests"] == 100 and s["answered"] == 91 and s["failed"] == 9
    assert s["throughput_rps"] == 10.0 and s["answered_rps"] == 9.1
    assert s["errors_by_code"] == {"503 NO_REPLICA_WITHIN_BOUND": 8, "transport ConnectError": 1}
    assert len(s["first_failures"]) == 5 and s["first_failures"][0]["t"] == 9.0
    assert s["first_failures"][0]["code"] == "NO_REPLICA_WITHIN_BOUND"
    assert s["outcomes"] == {"ok": 91, "unavailable": 8, "transport": 1}
    assert s["latency"]["p50_ms"] == 49.0  # 1..90, an extra 2, 50, 8 × 100 and s["latency"]["p99_ms"] == 100.0 and s["latency"]["max_ms"] == 100.0
    assert s["latency_answered"]["max_ms"] == 90.0
    assert s["staleness_served"]["lag_ms_max"] == 500 and s["staleness_served"]["lag_offsets_max"] == 7
    assert s["served_by"] == {"node-1/active": 90, "node-2/standby": 1}
    assert s["standby_share"] == pytest.approx(1 / 91, abs=1e-4)
    assert s["faults"][0]["event"] == "kill -9 store-node-1"
    assert s["by_bound"]["none"] == {"requests": 100, "failed": 9}


def test_summary_of_nothing():
    s = summarize([], duration_s=0)
    assert s["requests"] == 0 and s["throughput_rps"] is None and s["latency"]["p50_ms"] is None


def test_timeseries_buckets_by_send_time():
    records = [_r(0.2, 1.0), _r(0.7, 3.0), _r(1.1, 5.0, outcome="timeout", status=504), _r(2.5, 2.0, lag_ms=40)]
    ts = timeseries(records, bucket_s=1.0, duration_s=3.0)
    assert [b["t"] for b in ts] == [0.0, 1.0, 2.0]
    assert [b["answered_rps"] for b in ts] == [2.0, 0.0, 1.0]
    assert [b["failed_rps"] for b in ts] == [0.0, 1.0, 0.0]
    assert ts[0]["p50_ms"] == 1.0 and ts[0]["p99_ms"] == 3.0
    assert ts[1]["lag_ms_max"] is None and ts[2]["lag_ms_max"] == 40


def test_a_last_bucket_cut_short_is_rated_over_its_real_width():
    records = [_r(0.5, 1.0), _r(1.1, 1.0), _r(1.2, 1.0)]
    ts = timeseries(records, bucket_s=1.0, duration_s=1.5)
    assert [b["answered_rps"] for b in ts] == [1.0, 4.0]

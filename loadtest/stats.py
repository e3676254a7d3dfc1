"""Percentiles and the summary of a recording: throughput, latency, errors, staleness served, over time.

A recording is a list of request records (one dict per lookup, as ``loadtest.lookups``
writes them). ``outcome`` is ``ok`` or ``not_found`` for an answered lookup, anything
else (``unavailable``, ``timeout``, ``transport`` …) for a failed one.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable

ANSWERED = frozenset({"ok", "not_found"})


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least ``q`` % of values at or below it."""
    s = sorted(values)
    if not s:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be within [0, 100]")
    rank = max(1, math.ceil(q / 100 * len(s)))
    return s[rank - 1]


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def latency_summary(latencies_ms: list[float]) -> dict[str, float | None]:
    return {"p50_ms": _r(percentile(latencies_ms, 50)), "p95_ms": _r(percentile(latencies_ms, 95)),
            "p99_ms": _r(percentile(latencies_ms, 99)), "max_ms": _r(max(latencies_ms) if latencies_ms else None),
            "mean_ms": _r(sum(latencies_ms) / len(latencies_ms) if latencies_ms else None)}


def failed(record: dict[str, Any]) -> bool:
    return record.get("outcome") not in ANSWERED


def error_label(record: dict[str, Any]) -> str:
    """How an error is counted: status plus the error code when there is one (``503 NO_REPLICA_WITHIN_BOUND``)."""
    status = record.get("status")
    code = record.get("code")
    return f"{status} {code}" if code else str(status if status is not None else record.get("outcome"))


_FIRST_FAILURES = 5


def summarize(records: list[dict[str, Any]], duration_s: float | None = None,
              faults: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Throughput, latency percentiles, error counts by code, staleness served and fault events."""
    if duration_s is None:
        duration_s = max((r["t"] + r["latency_ms"] / 1000 for r in records), default=0.0)
    answered = [r for r in records if not failed(r)]
    errors = [r for r in records if failed(r)]
    lag_ms = [r["lag"]["ms"] for r in answered if r.get("lag") and r["lag"]["ms"] is not None]
    lag_offsets = [r["lag"]["offsets"] for r in answered if r.get("lag") and r["lag"]["offsets"] is not None]
    served = Counter(f"{r['served_by']['node']}/{r['served_by']['role']}" for r in answered if r.get("served_by"))
    by_bound: dict[str, dict[str, int]] = {}
    for r in records:
        b = by_bound.setdefault(r.get("bound_kind", "none"), {"requests": 0, "failed": 0})
        b["requests"] += 1
        b["failed"] += failed(r)
    return {
        "duration_s": round(duration_s, 3),
        "requests": len(records),
        "answered": len(answered),
        "failed": len(errors),
        "throughput_rps": round(len(records) / duration_s, 1) if duration_s > 0 else None,
        "answered_rps": round(len(answered) / duration_s, 1) if duration_s > 0 else None,
        "latency": latency_summary([r["latency_ms"] for r in records]),
        "latency_answered": latency_summary([r["latency_ms"] for r in answered]),
        "outcomes": dict(Counter(r["outcome"] for r in records)),
        "errors_by_code": dict(Counter(error_label(r) for r in errors)),
        # The first few failures whole: what each attempt met says why a lookup failed.
        "first_failures": [{k: r.get(k) for k in ("t", "proto", "key", "bound_kind", "status", "code", "error")}
                           for r in errors[:_FIRST_FAILURES]],
        "by_protocol": dict(Counter(r.get("proto", "?") for r in records)),
        "by_bound": by_bound,
        "served_by": dict(sorted(served.items())),
        "standby_share": round(sum(v for k, v in served.items() if k.endswith("/standby")) / len(answered), 4)
        if answered else None,
        "staleness_served": {
            "lag_ms_p50": percentile(lag_ms, 50), "lag_ms_p99": percentile(lag_ms, 99),
            "lag_ms_max": max(lag_ms, default=None),
            "lag_offsets_p50": percentile(lag_offsets, 50), "lag_offsets_p99": percentile(lag_offsets, 99),
            "lag_offsets_max": max(lag_offsets, default=None),
        },
        "faults": faults or [],
    }


def timeseries(records: list[dict[str, Any]], bucket_s: float = 1.0,
               duration_s: float | None = None) -> list[dict[str, Any]]:
    """Per time bucket (by send time): answered/s, failed/s, p50/p99 latency and the staleness served."""
    if bucket_s <= 0:
        raise ValueError("bucket_s must be > 0")
    if duration_s is None:
        duration_s = max((r["t"] for r in records), default=0.0)
    n = max(1, math.ceil(duration_s / bucket_s))
    buckets: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for r in records:
        buckets[min(n - 1, max(0, int(r["t"] // bucket_s)))].append(r)
    out = []
    for i, rs in enumerate(buckets):
        ok = [r for r in rs if not failed(r)]
        lat = [r["latency_ms"] for r in rs]
        lag_ms = [r["lag"]["ms"] for r in ok if r.get("lag") and r["lag"]["ms"] is not None]
        lag_off = [r["lag"]["offsets"] for r in ok if r.get("lag") and r["lag"]["offsets"] is not None]
        # The last bucket may be cut short by the end of the run: rate it over its real width.
        width = min(bucket_s, duration_s - i * bucket_s) if duration_s > i * bucket_s else bucket_s
        width = max(width, bucket_s / 10)
        out.append({"t": round(i * bucket_s, 3), "answered_rps": len(ok) / width,
                    "failed_rps": (len(rs) - len(ok)) / width,
                    "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
                    "lag_ms_max": max(lag_ms, default=None), "lag_ms_p50": percentile(lag_ms, 50),
                    "lag_offsets_max": max(lag_off, default=None)})
    return out

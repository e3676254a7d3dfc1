"""The side-by-side table ``loadtest.peers`` ends with, as the README shows it: a figure a row, each system's in its
column, bold on the row's winner only (ties all bold; a figure not measured is a dash and wins nothing)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    label: str
    key: str  # the figure's key in a system's figures
    higher_wins: bool
    shown: Callable[[float], str] = lambda v: f"{v:,.0f}"
    at_least: str = ""  # a figure key: when true, the figure is only a floor (e.g. the ladder's top rate was held)


def figure(figures: Mapping[str, Any], key: str) -> float | None:
    """A system's figure, None when not measured (a percentile of no samples, e.g. no probe became visible, is NaN)."""
    v = figures.get(key)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


ROWS = (
    Row("lookups/s through one door (wrk, 32 connections), its JIT cold", "lookups_rps_1", True),
    Row("the same once warm", "lookups_rps_2", True),
    Row("lookup p99 once warm (ms)", "lookups_p99_ms_2", False, lambda v: f"{v:,.1f}"),
    Row("gRPC Get calls/s once warm (h2load, 32 connections)", "grpc_rps", True),
    Row("its p99 (ms)", "grpc_p99_ms", False, lambda v: f"{v:,.1f}"),
    Row("a new event → visible in a lookup, p50 (ms)", "freshness_p50_ms", False, lambda v: f"{v:,.1f}"),
    Row("the same, p99 (ms)", "freshness_p99_ms", False, lambda v: f"{v:,.1f}"),
    Row("of {probes} probes, never visible within 10 s", "never_visible", False),
    Row("{burst_readings:,} readings written at once → caught up (s)", "burst_s", False, lambda v: f"{v:,.1f}"),
    Row("readings/s held for {hold_s:.0f} s with bounded lag", "max_events_per_s", True,
        at_least="max_events_capped"),
    Row("lookups failed while an instance is killed", "failover_failed", False),
    Row("CPU at rest at the demo's 50 readings/s (cores)", "rest_cores", False, lambda v: f"{v:.2f}"),
)


def winners(values: Mapping[str, float | None], higher_wins: bool) -> set[str]:
    """The systems with the row's best figure (none when no system has one)."""
    known = {name: v for name, v in values.items() if v is not None}
    if not known:
        return set()
    best = max(known.values()) if higher_wins else min(known.values())
    return {name for name, v in known.items() if v == best}


def _cell(row: Row, figures: Mapping[str, Any], value: float | None, best: bool) -> str:
    if value is None:
        return "—"
    shown = ("≥ " if row.at_least and figures.get(row.at_least) else "") + row.shown(value)
    return f"**{shown}**" if best else shown


def table(figures: Mapping[str, Mapping[str, Any]], plan: Any) -> str:
    """The markdown table of every row for the systems in ``figures`` (in its order), labelled with ``plan``'s
    sizes."""
    names = list(figures)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for row in ROWS:
        values = {n: figure(figures[n], row.key) for n in names}
        best = winners(values, row.higher_wins)
        cells = [_cell(row, figures[n], values[n], n in best) for n in names]
        lines.append(f"| {row.label.format(**vars(plan))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

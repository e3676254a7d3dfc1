"""A scenario's row of the partitions table, from its summary and its recording: lookups failed, answers the checker
refuted (a window labelled final that changed afterwards among them), how soon the cut showed in the answers' labels
and in the router's view, how soon after healing each was whole again, and the keys and windows lost
(:mod:`loadtest.partitions.settled`).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from loadtest.partitions.settled import Settled
from loadtest.partitions.watch import lag_behind, past
from loadtest.stats import ANSWERED


def fault_times(summary: dict[str, Any]) -> tuple[float, float]:
    """When the scenario's fault was made and healed, in s from the run's start; an error if it never was."""
    cut = heal = None
    failed = [e["event"] for e in summary.get("faults", []) if e["event"].startswith("FAILED")]
    if failed:
        raise RuntimeError(f"the scenario's fault was not applied: {failed[0]}")
    for e in summary.get("faults", []):
        if re.match(r"(cut|slow) ", e["event"]) and cut is None:
            cut = e["t"]
        elif re.match(r"heal ", e["event"]):
            heal = e["t"]
    if cut is None or heal is None:
        raise RuntimeError(f"the scenario's fault was not made and healed: {summary.get('faults')}")
    return cut, heal


def _labelled_stale(rec: dict[str, Any], slack_ms: int) -> bool:
    """An answer that says it is behind: its offset lag unknown, or it or its input stale by more than a label may
    trail."""
    return lag_behind(rec.get("lag") or {}, slack_ms) or past((rec.get("input_lag") or {}).get("ms"), slack_ms)


def shows_and_recovers(records: list[dict[str, Any]], cut: float, heal: float,
                       slack_ms: int) -> tuple[float | None, float | None]:
    """(s from the cut to the first answer labelled behind or lookup failed, s from healing to the last one); None
    where there was none."""
    shows = recovered = None
    for r in records:
        t = r["t"]
        troubled = r["outcome"] not in ANSWERED or _labelled_stale(r, slack_ms)
        if not troubled or t < cut:
            continue
        if shows is None:
            shows = round(t - cut, 2)
        if t >= heal:
            recovered = round(t - heal, 2)
    if shows is not None and recovered is None:
        recovered = 0.0  # no answer after healing was behind
    return shows, recovered


def fresh_claims_end(records: list[dict[str, Any]], node: str, cut: float, heal: float, slack_ms: int) -> float | None:
    """s from the cut to the arrival of the last answer the cut-off store node ``node`` labelled fresh before healing:
    how long its labels went on vouching for what it could no longer confirm (None: none after the cut)."""
    last = None
    for r in records:
        arrived = r["t"] + (r.get("latency_ms") or 0) / 1000
        served = r.get("served_by") or {}
        if (cut <= arrived < heal and served.get("node") == node and r["outcome"] in ANSWERED
                and not lag_behind(r.get("lag") or {}, slack_ms)):
            last = max(last or 0.0, round(arrived - cut, 2))
    return last


def labelled_behind_first(records: list[dict[str, Any]], node: str, cut: float, slack_ms: int) -> float | None:
    """s from the cut to the arrival of the first answer the cut-off store node ``node`` labelled behind (None: none
    did, as when the router sent every read elsewhere first)."""
    first = None
    for r in records:
        arrived = r["t"] + (r.get("latency_ms") or 0) / 1000
        served = r.get("served_by") or {}
        if (arrived >= cut and served.get("node") == node and r["outcome"] in ANSWERED
                and lag_behind(r.get("lag") or {}, slack_ms)):
            behind = round(arrived - cut, 2)
            first = behind if first is None else min(first, behind)
    return first


def _earliest(*times: float | None) -> float | None:
    return min((t for t in times if t is not None), default=None)


def scenario_row(scenario: Any, summary: dict[str, Any], recording: Path, slack_ms: int, settled: Settled,
                 view: tuple[float | None, float | None] = (None, None),
                 metrics: tuple[float | None, float | None] = (None, None)) -> dict[str, Any]:
    """The row; ``view`` and ``metrics`` are (s from the cut to the first showing the scenario's sign, s from healing
    to the first without) in the router's cluster view and its metrics. An answer that labelled a window final before
    it changed counts as refuted, of kind ``final``. For a cut-off store node the row says when it was first shown
    behind: in its answers' labels, or in the view where the scenario's sign is its replicas behind, whichever came
    first."""
    records = [orjson.loads(line) for line in recording.read_bytes().splitlines() if line]
    cut, heal = fault_times(summary)
    shows, recovered = shows_and_recovers(records, cut, heal, slack_ms)
    node = scenario.component.removeprefix("store-") if scenario.component.startswith("store-node") else None
    claims = fresh_claims_end(records, node, cut, heal, slack_ms) if node else None
    labelled = labelled_behind_first(records, node, cut, slack_ms) if node else None
    shown = _earliest(labelled, view[0] if scenario.watch == "behind" else None) if node else None
    consistency = summary.get("consistency", {})
    failed = Counter(f"{r['bound_kind']} {r['code'] or r['outcome']}" for r in records if r["outcome"] not in ANSWERED)
    refuted = consistency.get("violations", 0) + len(settled.finals_refuted) if "error" not in consistency else None
    by_kind = {**consistency.get("violations_by_kind", {}),
               **({"final": len(settled.finals_refuted)} if settled.finals_refuted else {})}
    return {"scenario": scenario.name, "lookups": len(records), "failed": sum(failed.values()),
            "failed_by_bound_and_code": dict(failed), "writes_checked": consistency.get("writes_checked", 0),
            "refuted": refuted, "refuted_by_kind": by_kind, "labels_checked": consistency.get("labels_checked", 0),
            "finals_checked": settled.finals_checked, "finals_refuted": settled.finals_refuted[:10],
            "shows_s": shows, "fresh_claims_s": claims, "labelled_behind_s": labelled, "shown_behind_s": shown,
            "recovered_s": recovered, "operator_s": view[0], "operator_cleared_s": view[1], "metrics_s": metrics[0],
            "metrics_cleared_s": metrics[1], "data_lost": len(settled.lost), "keys_lost": settled.lost[:10],
            "windows_checked": settled.windows_checked, "late_readings": settled.late}


def _pair(view: float | None, metrics: float | None) -> str:
    if view is None and metrics is None:
        return "–"
    return f"{'–' if view is None else view} / {'–' if metrics is None else metrics}"


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    head = ("| scenario | lookups | failed | refuted | in answers after (s) | in the cluster view / metrics after (s) "
            "| answers whole again after healing (s) | the view / metrics after healing (s) | keys or windows lost |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = [r["scenario"], r["lookups"], r["failed"], r["refuted"], r["shows_s"],
                 _pair(r.get("operator_s"), r.get("metrics_s")), r["recovered_s"],
                 _pair(r.get("operator_cleared_s"), r.get("metrics_cleared_s")), r["data_lost"]]
        lines.append("| " + " | ".join("–" if c is None else str(c) for c in cells) + " |")
    return lines

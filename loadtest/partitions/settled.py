"""After healing: does every key and window, read caught up (``max_lag=0``), hold what a recomputation of its table
from the input gives, and what its changelog ends with? And did every window an answer labelled final keep its value?

The input is paused meanwhile (the demo producer stopped with SIGSTOP), so that the pipeline and the changelog come
to an end the answers can reach; a key or window whose caught-up answer still differs from either (or that is not
served caught up) when the time is up counts as lost. A window the pipeline closed before a late reading came holds
one reading fewer than the recomputation; those shortfalls are no loss when they add up to the readings the pipeline
counted as dropped late.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import orjson

from freshroute.windows import WindowSpec
from loadtest.consistency import changelog_topic, read_changelog, same_fields, same_value, table_window
from tools.local.stack import Stack

PRODUCER = "demo-producer"
KEY_TABLES = ("sensor_stats", "area_counts")
WINDOW_TABLE = "sensor_windows"
_WINDOWS_PER_READ = 500  # within the router's most windows a lookup may span


def _answers(client: httpx.Client, table: str, keys: list[str]) -> dict[str, object]:
    """Each key's caught-up value (None: no such key); a key not served caught up is left out."""
    answers: dict[str, object] = {}
    for key in keys:
        try:
            r = client.get(f"/v1/tables/{table}/keys/{key}", params={"max_lag": 0})
        except httpx.HTTPError:
            continue
        if r.status_code == 200:
            answers[key] = r.json()["value"]
        elif r.status_code == 404 and r.json().get("code") == "KEY_NOT_FOUND":
            answers[key] = None
    return answers


def _windows_of(window: WindowSpec, ts: int) -> Iterator[int]:
    """The starts of every window holding event time ``ts`` (one when tumbling)."""
    start = ts - ts % window.slide_ms
    while start + window.size_ms > ts:
        yield start
        start -= window.slide_ms


def recomputed(bootstrap: str, topic: str, window: WindowSpec | None) -> dict[str, dict[str, Any]]:
    """The demo tables of every reading in the input topic, as ``pipeline/demo_tables.py`` defines them:
    ``sensor_stats`` (count, sum, avg, min, max, the last reading by record time, partition and offset),
    ``area_counts`` (readings per area) and ``sensor_windows`` (sensor → window start → count, avg, min, max, by the
    record time, as if no reading came late; with ``window`` only)."""
    from freshroute.changelog_reader import consume_to_end

    readings: dict[str, list[tuple[tuple[int, int, int], float]]] = {}
    areas: dict[str, int] = {}
    windows: dict[str, dict[int, list[float]]] = {}

    def keep(m: Any) -> None:
        reading = orjson.loads(m.value())
        value, ts = float(reading["reading"]), m.timestamp()[1]
        readings.setdefault(reading["sensor"], []).append(((ts, m.partition(), m.offset()), value))
        areas[reading["area"]] = areas.get(reading["area"], 0) + 1
        for start in _windows_of(window, ts) if window is not None else ():
            windows.setdefault(reading["sensor"], {}).setdefault(start, []).append(value)

    consume_to_end(bootstrap, topic, keep)
    stats = {}
    for sensor, rows in readings.items():
        values = [v for _, v in rows]
        stats[sensor] = {"count": len(values), "sum": sum(values), "avg": sum(values) / len(values),
                         "min": min(values), "max": max(values), "last": max(rows)[1]}
    tables = {"sensor_stats": stats, "area_counts": {area: {"count": n} for area, n in areas.items()}}
    if window is not None:
        tables[WINDOW_TABLE] = {sensor: {start: {"count": len(v), "avg": sum(v) / len(v), "min": min(v),
                                                 "max": max(v)} for start, v in by_start.items()}
                                for sensor, by_start in windows.items()}
    return tables


def _differing(stack: Stack, table: str, keys: list[str], answers: dict[str, object],
               expected: dict[str, dict[str, float]]) -> list[str]:
    c = stack.config
    changelog = read_changelog(c.bootstrap, changelog_topic(table, c.redis_url, c.namespace, c.topic_prefix))
    differing = []
    for key in keys:
        partition = changelog.partition_of(key)
        live, value, _ = changelog.state_at(key, partition, changelog.end_offsets.get(partition, 0))
        answer = answers.get(key, "unanswered")
        if answer == "unanswered" or (key in expected) != live:
            differing.append(f"{table}/{key}")
        elif live and (answer is None or not same_value(answer, value) or not same_fields(answer, expected[key])):
            differing.append(f"{table}/{key}")
        elif not live and answer is not None:
            differing.append(f"{table}/{key}")
    return differing


@dataclass
class SettledWindows:
    """A windowed table's windows read caught up after healing, against their recomputation: ``differing`` names
    ``table/key@start`` of each window neither equal to it nor explained by readings the pipeline dropped as late;
    ``served`` is every window read, (key, start) → value, for holding answers labelled final to it."""

    differing: list[str] = field(default_factory=list)
    served: dict[tuple[str, int], Any] = field(default_factory=dict)
    late: int = 0  # readings short of the recomputation in final windows
    checked: int = 0  # windows held to their recomputation


def settled_windows(client: httpx.Client, window: WindowSpec, expected: dict[str, dict[int, dict[str, float]]],
                    dropped: int | None, keys: list[str]) -> SettledWindows:
    """Each key's windows read with ``max_lag=0`` against ``expected``. A final window may hold fewer readings than the
    recomputation (the pipeline drops a reading that comes after its window's grace, so it is final): that is no loss
    when every such shortfall together is what the pipeline counted as ``dropped``."""
    out = SettledWindows()
    short: list[str] = []
    for key in keys:
        want = expected.get(key, {})
        lo = min(want, default=int(time.time() * 1000) - window.retention_ms)
        hi = max(want, default=lo) + window.slide_ms
        got: dict[int, tuple[Any, bool]] = {}
        watermark = None
        try:
            for chunk in range(lo, hi, _WINDOWS_PER_READ * window.slide_ms):
                r = client.get(f"/v1/tables/{WINDOW_TABLE}/keys/{key}/windows", params={
                    "from": chunk, "to": min(hi, chunk + _WINDOWS_PER_READ * window.slide_ms), "max_lag": 0})
                if r.status_code != 200:
                    raise httpx.HTTPError(f"{r.status_code} {r.text[:200]}")
                answer = r.json()
                watermark = answer.get("watermark_ms")
                got.update({w["start"]: (w["value"], w["final"]) for w in answer["windows"]})
        except httpx.HTTPError:
            out.differing.append(f"{WINDOW_TABLE}/{key}")
            continue
        mark = -1 if watermark is None else watermark
        for start in sorted(set(got) | {s for s in want if not window.expired(s, mark)}):
            value, final = got.get(start, (None, window.final(start, mark)))
            out.checked += 1
            if value is not None:
                out.served[(key, start)] = value
            if start in want and value is not None and same_fields(value, want[start]):
                continue
            if start in want and final and (value is None or value.get("count", 0) < want[start]["count"]):
                out.late += want[start]["count"] - (0 if value is None else value["count"])
                short.append(f"{WINDOW_TABLE}/{key}@{start}")
            else:
                out.differing.append(f"{WINDOW_TABLE}/{key}@{start}")
    if short and out.late != dropped:
        out.differing += short
    return out


def late_rows_dropped(metrics_url: str, table: str) -> int | None:
    """The pipeline's count of input rows ``table`` dropped as late (None: not read)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(metrics_url, timeout=5).text
    except httpx.HTTPError:
        return None
    return next((int(s.value) for family in text_string_to_metric_families(text) for s in family.samples
                 if s.name == "freshroute_pipeline_late_rows_dropped_total" and s.labels.get("table") == table), None)


def finals_refuted(recording: Path, served: dict[tuple[str, int], Any]) -> tuple[int, list[str]]:
    """(windows checked, ``key@start`` of each) an answer of the recording labelled final with a value other than the
    one served after healing: a final window must never change again."""
    checked, refuted = 0, []
    for line in recording.read_bytes().splitlines():
        rec = orjson.loads(line) if line else {}
        for w in rec.get("windows") or ():
            if w["final"]:
                checked += 1
                settled = served.get((rec["key"], w["start"]))
                if settled is None or not same_value(w["value"], settled):
                    refuted.append(f"{rec['key']}@{w['start']}: {w['value']} labelled final at {rec['t']} s, "
                                   f"then {settled}")
    return checked, refuted


@dataclass
class Settled:
    """What healing left: ``lost`` names ``table/key`` (``table/key@start`` of a window) of each key or window whose
    caught-up answer differs from its recomputation or its changelog's last value; ``finals_refuted`` each window an
    answer labelled final that changed afterwards, of ``finals_checked``; ``late`` the readings final windows hold
    fewer of than their recomputation, as many as the pipeline counted dropped; ``windows_checked`` how many windows
    were held to their recomputation."""

    lost: list[str]
    finals_checked: int = 0
    finals_refuted: list[str] = field(default_factory=list)
    late: int = 0
    windows_checked: int = 0


def settle(stack: Stack, keys: dict[str, list[str]], recording: Path, within_s: float = 60.0) -> Settled:
    """Pause the input and read every key (of each table's ``keys``, and every key its recomputation has) caught up
    until all equal their recomputation, or ``within_s`` is up; then hold every answer of ``recording`` labelled final
    to the window served now."""
    c = stack.config
    window = table_window(WINDOW_TABLE, c.redis_url, c.namespace)
    paused = PRODUCER in stack.components and stack.components[PRODUCER].alive()
    if paused:
        stack.signal(PRODUCER, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + within_s
        with httpx.Client(base_url=c.rest_url, timeout=5) as client:
            while True:
                expected = recomputed(c.bootstrap, f"{c.topic_prefix}readings", window)
                windows = SettledWindows()
                if window is not None:
                    dropped = late_rows_dropped(stack.components["pipeline"].addresses["metrics"], WINDOW_TABLE)
                    windows = settled_windows(client, window, expected[WINDOW_TABLE], dropped,
                                              sorted({*keys.get(WINDOW_TABLE, ()), *expected[WINDOW_TABLE]}))
                differing = list(windows.differing)
                for table in KEY_TABLES:
                    rows = expected[table]
                    asked = sorted({*keys.get(table, ()), *rows})
                    differing += _differing(stack, table, asked, _answers(client, table, asked), rows)
                if not differing or time.monotonic() >= deadline:
                    checked, refuted = finals_refuted(recording, windows.served) if window else (0, [])
                    return Settled(differing, checked, refuted, windows.late, windows.checked)
                time.sleep(1.0)
    finally:
        if paused:
            stack.signal(PRODUCER, signal.SIGCONT)

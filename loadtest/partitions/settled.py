"""After healing: does every key, read caught up (``max_lag=0``), hold what a recomputation of its table from the
input gives, and what its changelog ends with?

The input is paused meanwhile (the demo producer stopped with SIGSTOP), so that the pipeline and the changelog come
to an end the answers can reach; a key whose caught-up answer still differs from either (or that is not served
caught up) when the time is up counts as lost.
"""

from __future__ import annotations

import signal
import time

import httpx

import orjson

from loadtest.consistency import changelog_topic, read_changelog, same_value
from tools.local.stack import Stack

PRODUCER = "demo-producer"


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


def recomputed(bootstrap: str, topic: str) -> dict[str, dict[str, dict[str, float]]]:
    """The demo's key tables of every reading in the input topic, as ``pipeline/demo_tables.py`` defines them:
    ``sensor_stats`` (count, sum, avg, min, max, the last reading by record time, partition and offset) and
    ``area_counts`` (readings per area). ``sensor_windows`` is left out: a Real-time query's watermark, which decides
    which late readings a window drops, is not yet reliable."""
    from freshroute.changelog_reader import consume_to_end

    readings: dict[str, list[tuple[tuple[int, int, int], float]]] = {}
    areas: dict[str, int] = {}

    def keep(m: object) -> None:
        reading = orjson.loads(m.value())  # type: ignore[attr-defined]
        order = (m.timestamp()[1], m.partition(), m.offset())  # type: ignore[attr-defined]
        readings.setdefault(reading["sensor"], []).append((order, float(reading["reading"])))
        areas[reading["area"]] = areas.get(reading["area"], 0) + 1

    consume_to_end(bootstrap, topic, keep)
    stats = {}
    for sensor, rows in readings.items():
        values = [v for _, v in rows]
        stats[sensor] = {"count": len(values), "sum": sum(values), "avg": sum(values) / len(values),
                         "min": min(values), "max": max(values), "last": max(rows)[1]}
    return {"sensor_stats": stats, "area_counts": {area: {"count": n} for area, n in areas.items()}}


def _same_stats(got: object, want: dict[str, float]) -> bool:
    return isinstance(got, dict) and all(
        k in got and abs(float(got[k]) - v) <= 1e-6 * max(1.0, abs(v)) for k, v in want.items())


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
        elif live and (answer is None or not same_value(answer, value) or not _same_stats(answer, expected[key])):
            differing.append(f"{table}/{key}")
        elif not live and answer is not None:
            differing.append(f"{table}/{key}")
    return differing


def keys_lost(stack: Stack, keys: dict[str, list[str]], within_s: float = 60.0) -> list[str]:
    """``table/key`` of every key (of each table's ``keys``, and every key its recomputation has) whose caught-up answer
    still differs from the recomputation or the changelog's last value after ``within_s``."""
    c = stack.config
    paused = PRODUCER in stack.components and stack.components[PRODUCER].alive()
    if paused:
        stack.signal(PRODUCER, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + within_s
        with httpx.Client(base_url=c.rest_url, timeout=5) as client:
            while True:
                expected = recomputed(c.bootstrap, f"{c.topic_prefix}readings")
                differing = []
                for table, rows in expected.items():
                    asked = sorted({*keys.get(table, ()), *rows})
                    differing += _differing(stack, table, asked, _answers(client, table, asked), rows)
                if not differing or time.monotonic() >= deadline:
                    return differing
                time.sleep(1.0)
    finally:
        if paused:
            stack.signal(PRODUCER, signal.SIGCONT)

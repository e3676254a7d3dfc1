"""After healing: does every key, read caught up (``max_lag=0``), hold the value its changelog ends with?

The input is paused meanwhile (the demo producer stopped with SIGSTOP), so that the changelog comes to an end the
answers can reach; a key whose caught-up answer still differs from it (or that is not served caught up) when the
time is up counts as lost.
"""

from __future__ import annotations

import signal
import time

import httpx

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


def _differing(stack: Stack, table: str, keys: list[str], answers: dict[str, object]) -> list[str]:
    c = stack.config
    changelog = read_changelog(c.bootstrap, changelog_topic(table, c.redis_url, c.namespace, c.topic_prefix))
    differing = []
    for key in keys:
        partition = changelog.partition_of(key)
        live, value, _ = changelog.state_at(key, partition, changelog.end_offsets.get(partition, 0))
        if key not in answers:
            differing.append(key)
        elif not live:
            if answers[key] is not None:
                differing.append(key)
        elif answers[key] is None or not same_value(answers[key], value):
            differing.append(key)
    return differing


def keys_lost(stack: Stack, table: str, keys: list[str], within_s: float = 60.0) -> list[str]:
    """The keys whose caught-up answer still differs from the changelog's last value after ``within_s``."""
    paused = PRODUCER in stack.components and stack.components[PRODUCER].alive()
    if paused:
        stack.signal(PRODUCER, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + within_s
        with httpx.Client(base_url=stack.config.rest_url, timeout=5) as client:
            while True:
                differing = _differing(stack, table, keys, _answers(client, table, keys))
                if not differing or time.monotonic() >= deadline:
                    return differing
                time.sleep(1.0)
    finally:
        if paused:
            stack.signal(PRODUCER, signal.SIGCONT)

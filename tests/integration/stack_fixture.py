"""A whole freshroute stack (real broker, Redis, Spark, store nodes, router) for a test module."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Callable

import orjson

from freshroute.local.stack import Stack, StackConfig
from freshroute.settings import kafka_client_config


def start_stack(home: Path, nodes: int = 3, **overrides) -> Stack:
    """Start a stack on free loopback ports with no demo producer; the test produces its own data.

    Spread, as ``local up --spread``: every store node and the routers on loopback addresses of
    their own, so that a test passes only if no component assumes it shares a host with another.
    Changelogs keep every record for the test's life (hour-long segments): the consistency checker then
    decides every answer, where compaction would leave some undecided.
    """
    tag = f"t{uuid.uuid4().hex[:8]}"
    config = StackConfig(home=home, broker_port=0, redis_port=0, rest_port=0, grpc_port=0,
                         store_ports=(0,) * nodes, namespace=tag, topic_prefix=f"{tag}-", demo=False,
                         **{"spread": True, "changelog_segment_ms": 3_600_000, **overrides}).resolved()
    stack = Stack(config, progress=print)
    try:
        stack.up()
    except BaseException:
        stack.down()
        raise
    return stack


def produce_readings(stack: Stack, events: list[dict]) -> None:
    from confluent_kafka import Producer

    from freshroute.local.demo import ensure_topic

    topic = f"{stack.config.topic_prefix}readings"
    ensure_topic(stack.config.bootstrap, topic)
    producer = Producer(kafka_client_config(stack.config.bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))
    for e in events:
        producer.produce(topic, key=e["sensor"].encode(), value=orjson.dumps(e))
        producer.poll(0)
    assert producer.flush(30) == 0


def expected_sensor_stats(events: list[dict]) -> dict[str, dict]:
    """Python recomputation of the demo table: count, sum, avg, min, max, last per sensor."""
    readings: dict[str, list[float]] = defaultdict(list)
    for e in events:
        readings[e["sensor"]].append(float(e["reading"]))
    return {s: {"count": len(r), "sum": sum(r), "avg": sum(r) / len(r), "min": min(r), "max": max(r), "last": r[-1]}
            for s, r in readings.items()}


def same_stats(got: dict, want: dict) -> bool:
    return all(abs(float(got[k]) - float(want[k])) <= 1e-6 * max(1.0, abs(float(want[k]))) for k in want)


def all_sensors_served(client, expected: dict[str, dict], **params) -> bool:
    """Whether the router (an ``httpx.Client``) answers every sensor's expected stats, with these query params."""
    for sensor, want in expected.items():
        r = client.get(f"/v1/tables/sensor_stats/keys/{sensor}", params=params)
        if r.status_code != 200 or not same_stats(r.json()["value"], want):
            return False
    return True


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.25) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


# Spark's start plus the first micro-batch (state store creation, code generation): about
# 30 s on a quiet 2-core machine, several minutes on a loaded one.
FIRST_DATA_TIMEOUT_S = 480

"""A whole freshroute stack (real broker, Redis, Spark, store nodes, router) for a test module."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import httpx
import orjson

from tools.local.stack import Stack, StackConfig
from freshroute.settings import kafka_client_config
from loadtest.consistency import same_fields as same_stats


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
        stack.discard()
        raise
    return stack


_PRODUCED: dict[str, list[dict]] = {}


def produced(stack: Stack) -> list[dict]:
    """Every reading the tests produced to ``stack``'s input, in order: what its tables must add up to when
    several modules share one stack."""
    return _PRODUCED.setdefault(stack.config.namespace, [])


def restart_router(stack: Stack, *flags: str) -> None:
    """Start the stack's router again with ``flags`` (none: as the stack starts it) and wait until it serves."""
    stack.stop("router")
    log = stack.components["router"].log
    since = len(open(log, "rb").read())
    stack.start("router", *flags)
    wait_until(lambda: b"router serving" in open(log, "rb").read()[since:], 60, "the router to serve again",
               stack=stack)


def produce_readings(stack: Stack, events: list[dict]) -> None:
    from confluent_kafka import Producer

    from tools.local.demo import ensure_topic

    topic = f"{stack.config.topic_prefix}readings"
    ensure_topic(stack.config.bootstrap, topic)
    producer = Producer(kafka_client_config(stack.config.bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))
    for e in events:
        producer.produce(topic, key=e["sensor"].encode(), value=orjson.dumps(e))
        producer.poll(0)
    assert producer.flush(30) == 0
    produced(stack).extend(events)


def write_reading(stack: Stack, event: dict, producer: Any = None) -> str:
    """One reading produced and delivered (through ``producer``, else one of its own); its write token. Counted in
    what was produced to the stack."""
    from confluent_kafka import Producer

    from freshroute.write_tokens.make import write_token
    from loadtest.read_your_writes import deliver

    producer = producer or Producer(kafka_client_config(stack.config.bootstrap))
    msg = deliver(producer, f"{stack.config.topic_prefix}readings", event["sensor"].encode(), orjson.dumps(event))
    produced(stack).append(event)
    return write_token(msg)


def produce_and_serve(stack: Stack, events: list[dict], headers: dict[str, str] | None = None) -> dict[str, dict]:
    """Produce ``events``, then wait until the router serves every sensor produced to ``stack`` so far as a
    recomputation says, caught up (``max_lag=0``); returns that recomputation. ``headers`` go with the lookups."""
    produce_readings(stack, events)
    expected = expected_sensor_stats(produced(stack))
    with httpx.Client(base_url=stack.config.rest_url, timeout=10, headers=headers) as client:
        wait_until(lambda: all_sensors_served(client, expected, max_lag=0), FIRST_DATA_TIMEOUT_S,
                   "every sensor produced to be served", stack=stack)
    return expected


def expected_sensor_stats(events: list[dict]) -> dict[str, dict]:
    """Python recomputation of the demo table: count, sum, avg, min, max, last per sensor."""
    readings: dict[str, list[float]] = defaultdict(list)
    for e in events:
        readings[e["sensor"]].append(float(e["reading"]))
    return {s: {"count": len(r), "sum": sum(r), "avg": sum(r) / len(r), "min": min(r), "max": max(r), "last": r[-1]}
            for s, r in readings.items()}


def all_sensors_served(client, expected: dict[str, dict], **params) -> bool:
    """Whether the router (an ``httpx.Client``) answers every sensor's expected stats, with these query params."""
    for sensor, want in expected.items():
        r = client.get(f"/v1/tables/sensor_stats/keys/{sensor}", params=params)
        if r.status_code != 200 or not same_stats(r.json()["value"], want):
            return False
    return True


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.25,
               stack: Stack | None = None, check: Callable[[], None] | None = None) -> None:
    """Wait for ``predicate``; with ``stack``, fail at once when one of its components dies unasked, and with
    ``check`` (which raises when a process the wait depends on is gone), when that says so."""
    started = time.monotonic()
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            if time.monotonic() - started >= 5:
                # Shown with a failure's captured output (and with -s): where a slow test spent its time.
                print(f"waited {time.monotonic() - started:.1f}s for {what}")
            return
        if stack is not None:
            fail_if_died(stack, what)
        if check is not None:
            check()
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def fail_if_died(stack: Stack, what: str = "") -> None:
    """Fail naming every component of ``stack`` that died unasked, with the last lines of its log."""
    dead = stack.died()
    if dead:
        waiting = f" while waiting for {what}" if what else ""
        raise AssertionError(f"{', '.join(c.name for c in dead)} died{waiting}:\n" +
                             "\n".join(f"--- {c.name} ({c.log}):\n{log_tail(c.log)}" for c in dead))


def log_tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError as e:
        return f"(no log: {e})"


# Spark's start plus the first micro-batch: about 30 s on a quiet 2-core machine, minutes on a loaded one. A wait
# this long is only reached by a pipeline that is alive but stuck: waits given the stack fail when it dies.
FIRST_DATA_TIMEOUT_S = 480

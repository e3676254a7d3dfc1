"""An input burst far above the pipeline's pace (50,000 readings in a second) breaks nothing.

Real broker, Redis, Spark, store nodes and router (the shared stack; the burst's sensors are its own). While the burst runs, lookups go on: loose
reads are always answered, strict reads (``max_lag=0``) are answered caught up or refused with
the typed error that carries the freshest lag. The pipeline's input lag grows, and afterwards
it drains: every sensor's row equals a recomputation of everything produced.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import httpx
import orjson
import pytest

from loadtest.freshness import InputLag
from tests.integration.stack_fixture import FIRST_DATA_TIMEOUT_S, wait_until

pytestmark = pytest.mark.integration

SENSORS = 200
BURST_RATE = 50_000
BURST_S = 1  # leaves the pipeline (~4,000 readings/s a table here) tens of thousands of records and seconds behind
SLICE_S = 0.01


class Expected:
    """Per sensor: count, sum, min, max of every reading produced (the burst is too big to keep)."""

    def __init__(self) -> None:
        self.stats: dict[str, list[float]] = {}

    def add(self, sensor: str, reading: float) -> None:
        s = self.stats.get(sensor)
        if s is None:
            self.stats[sensor] = [1, reading, reading, reading]
        else:
            s[0] += 1
            s[1] += reading
            s[2] = min(s[2], reading)
            s[3] = max(s[3], reading)

    def matches(self, sensor: str, value: dict) -> bool:
        count, total, low, high = self.stats[sensor]
        return (value["count"] == count and abs(value["sum"] - total) <= 1e-6 * max(1.0, abs(total))
                and value["min"] == low and value["max"] == high)


def produce(bootstrap: str, topic: str, expected: Expected, n: int, rate: float, rng: random.Random) -> float:
    """``n`` readings at up to ``rate``/s in 10 ms slices; returns the seconds it took."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True,
                  "queue.buffering.max.messages": 1_000_000})
    errors: list = []
    per_slice = max(1, int(rate * SLICE_S))
    start = time.monotonic()
    sent = 0
    while sent < n:
        for _ in range(min(per_slice, n - sent)):
            i = rng.randrange(SENSORS)
            reading = round(rng.uniform(-20, 120), 2)
            sensor = f"burst-{i}"
            expected.add(sensor, reading)
            while True:
                try:
                    p.produce(topic, key=sensor.encode(), value=orjson.dumps(
                        {"sensor": sensor, "area": "wheel", "reading": reading}),
                        on_delivery=lambda err, _m: errors.append(err) if err else None)
                    break
                except BufferError:
                    p.poll(0.01)
            sent += 1
        p.poll(0)
        delay = start + (sent / rate) - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    assert p.flush(120) == 0 and not errors, errors[:3]
    return time.monotonic() - start


@pytest.mark.timeout(1500)
def test_a_burst_far_above_the_pipelines_pace_fails_no_lookup_and_drains(stack):
    rng = random.Random(20261124)
    expected = Expected()
    topic = f"{stack.config.topic_prefix}readings"
    bootstrap = stack.config.bootstrap
    produce(bootstrap, topic, expected, SENSORS * 5, 1000.0, rng)
    client = httpx.Client(base_url=stack.config.rest_url, timeout=10)
    wait_until(lambda: all(client.get(f"/v1/tables/sensor_stats/keys/{s}").status_code == 200
                           for s in expected.stats), FIRST_DATA_TIMEOUT_S, "every sensor to be served", stack=stack)

    served = sorted(expected.stats)  # the sensors the warm-up wrote: every lookup has a row to find
    answers: Counter = Counter()
    answer_lags: list[tuple[int, int]] = []  # each answer's input_lag: the pipeline behind its input
    problems: list[str] = []
    stop = threading.Event()

    def lookups() -> None:
        """Loose and strict reads of random sensors until stopped (at most 20 minutes)."""
        r = random.Random(7)
        with httpx.Client(base_url=stack.config.rest_url, timeout=10) as c:
            deadline = time.monotonic() + 1200
            i = 0
            while not stop.is_set() and time.monotonic() < deadline:
                i += 1
                strict = i % 4 == 0
                resp = c.get(f"/v1/tables/sensor_stats/keys/{r.choice(served)}",
                             params={"max_lag": 0} if strict else None)
                body = resp.json()
                if resp.status_code == 200:
                    lag = body["lag"]
                    # A serving replica knows its end offset: its offset lag is never unknown here.
                    if lag["offsets"] is None or lag["offsets"] < 0 or lag["ms"] < 0 or \
                            (strict and lag["offsets"] != 0):
                        problems.append(f"{'strict' if strict else 'loose'} answer with lag {lag}")
                    answers["strict ok" if strict else "loose ok"] += 1
                    behind = body["input_lag"]
                    answer_lags.append((behind["records"], behind["ms"]))
                elif strict and resp.status_code == 503 and body["error"]["code"] == "NO_REPLICA_WITHIN_BOUND":
                    answers["strict refused"] += 1
                else:
                    problems.append(f"{'strict' if strict else 'loose'} read: {resp.status_code} {body}")
                time.sleep(0.01)

    lags: list[int] = []
    input_lag = InputLag(stack.config.rest_url, "sensor_stats")

    def sample_lag() -> None:
        while not stop.wait(1.0):
            n = input_lag.sample()
            if n is not None:
                lags.append(n)

    workers = [threading.Thread(target=lookups, daemon=True), threading.Thread(target=sample_lag, daemon=True)]
    for w in workers:
        w.start()
    took = produce(bootstrap, topic, expected, BURST_RATE * BURST_S, BURST_RATE, rng)
    burst_lookups = sum(answers.values())
    print(f"burst: {BURST_RATE * BURST_S:,} readings in {took:.1f}s; lookups during it {dict(answers)}; "
          f"input lag max {max(lags, default=0):,}")

    # It drains: every sensor's row equals the recomputation of everything produced.
    drain_start = time.monotonic()
    # One answer's input lag first: 200 lookups a second would take CPU from the drain they wait for.
    wait_until(lambda: client.get(f"/v1/tables/sensor_stats/keys/{served[0]}").json()["input_lag"]["records"] == 0
               and all(expected.matches(s, client.get(f"/v1/tables/sensor_stats/keys/{s}").json()["value"])
                       for s in expected.stats), 900, "every sensor to match the recomputation", 1.0, stack=stack)
    print(f"drained {time.monotonic() - drain_start:.0f}s after the burst; lookups {dict(answers)}")
    stop.set()
    for w in workers:
        w.join(timeout=30)
    client.close()

    assert not problems, problems[:5]
    # Lookups went on while the pipeline was behind (the burst itself may take 3 s or 10, as the machine goes).
    behind_answers = sum(1 for records, _ in answer_lags if records > 0)
    assert behind_answers >= 100 and answers["loose ok"] >= 100, (behind_answers, burst_lookups, answers)
    # The burst outran the pipeline, and the lag said so; it is back to nothing now.
    assert max(lags, default=0) >= BURST_RATE * BURST_S // 2, lags[-20:]
    # The pipeline reads back every row it wrote to learn how far it is: that lags the tables by a little.
    wait_until(lambda: input_lag.sample() == 0, 60, "the pipeline's input lag to be back to nothing", stack=stack)
    # ... and so did the answers themselves, seconds behind at the worst; caught up, they say nothing is.
    assert max(records for records, _ in answer_lags) >= BURST_RATE * BURST_S // 2, answer_lags[-20:]
    assert max(ms for _, ms in answer_lags) >= 5000, answer_lags[-20:]
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as c:
        wait_until(lambda: c.get(f"/v1/tables/sensor_stats/keys/{served[0]}").json()["input_lag"]
                   == {"records": 0, "ms": 0}, 30, "answers to say the pipeline caught up")
    input_lag.close()

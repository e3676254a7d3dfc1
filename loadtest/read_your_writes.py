"""What a lookup after a write token costs, and whether it ever misses the write (``ryw_*`` figures).

``writers`` threads each produce readings of a sensor of their own to the input, make a token of each delivery
report, and look the sensor up in ``sensor_stats`` through the router's REST API with ``after=`` that token, then
once more without it. The token's cost is the first lookup's time less the second's (``ryw_wait_*``). Each
writer's sensor gets readings from that writer only, so the answer must count every one it produced: one that
counts fewer is a stale read (``ryw_stale_reads``, the bar is 0); a lookup that found no replica with the reading
in ``wait_ms`` is counted in ``ryw_not_yet_visible``.

    python -m loadtest.read_your_writes [--router http://127.0.0.1:8080] [--cycles 1000] [--writers 4]
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from typing import Any, Callable

import httpx
import orjson

from freshroute.write_tokens.make import write_token
from loadtest.stats import percentile

TABLE = "sensor_stats"
WAIT_MS = 5000


class NotDelivered(RuntimeError):
    """A record the broker did not acknowledge in time: there is no write to read back."""


def deliver(producer: Any, topic: str, key: bytes, value: bytes, timeout_s: float = 10.0) -> Any:
    """Produce one record and wait for its own delivery report (not for other threads' records on a shared
    producer, as ``flush`` would); the delivered ``Message``, whose token ``write_token`` makes."""
    reports: list[tuple[Any, Any]] = []
    producer.produce(topic, key=key, value=value, on_delivery=lambda err, msg: reports.append((err, msg)))
    deadline = time.monotonic() + timeout_s
    while not reports and time.monotonic() < deadline:
        producer.poll(0.001)
    if not reports or reports[0][0] is not None:
        raise NotDelivered(f"a record to {topic} was not delivered: {reports[0][0] if reports else 'no report'}")
    return reports[0][1]


class Writer(threading.Thread):
    """One writer: produce a reading, look it up after its token, then without one; ``cycles`` times."""

    def __init__(self, producer: Any, http: httpx.Client, topic: str, sensor: str, cycles: int) -> None:
        super().__init__(name=f"ryw-{sensor}", daemon=True)
        self.producer, self.http, self.topic, self.sensor, self.cycles = producer, http, topic, sensor, cycles
        self.waits_ms: list[float] = []
        self.stale = 0
        self.not_yet_visible = 0
        self.errors: dict[str, int] = {}

    def produce(self, reading: float) -> Any:
        event = {"sensor": self.sensor, "area": "ryw", "reading": reading, "ts": int(time.time() * 1000)}
        return deliver(self.producer, self.topic, self.sensor.encode(), orjson.dumps(event))

    def run(self) -> None:
        path = f"/v1/tables/{TABLE}/keys/{self.sensor}"
        rng = random.Random(self.sensor)
        for n in range(1, self.cycles + 1):
            token = write_token(self.produce(round(rng.uniform(0, 100), 2)))
            t0 = time.perf_counter()
            after = self.http.get(path, params={"after": token, "wait_ms": WAIT_MS})
            t1 = time.perf_counter()
            plain = self.http.get(path)
            t2 = time.perf_counter()
            if after.status_code == 200:
                if after.json()["value"]["count"] < n:
                    self.stale += 1
                if plain.status_code == 200:
                    self.waits_ms.append(max(0.0, (t1 - t0) - (t2 - t1)) * 1000)
            elif after.status_code == 503 and after.json()["error"]["code"] == "NOT_YET_VISIBLE":
                self.not_yet_visible += 1
            else:
                code = f"{after.status_code} {after.json().get('error', {}).get('code', '')}"
                self.errors[code] = self.errors.get(code, 0) + 1


def measure(bootstrap: str, rest_url: str, topic: str, cycles: int = 1000, writers: int = 4,
            say: Callable[[str], None] = print) -> dict[str, Any]:
    """``cycles`` produce-then-read cycles spread over ``writers`` writers in parallel."""
    from confluent_kafka import Producer

    from freshroute.settings import kafka_client_config

    run = f"{int(time.time()) % 100000:05d}"
    producer = Producer(kafka_client_config(bootstrap, **{"linger.ms": 0, "enable.idempotence": True}))
    with httpx.Client(base_url=rest_url, timeout=WAIT_MS / 1000 + 10) as http:
        team = [Writer(producer, http, topic, f"ryw-{run}-{i}", cycles // writers) for i in range(writers)]
        started = time.monotonic()
        for w in team:
            w.start()
        for w in team:
            w.join(cycles * 10.0)
        took = time.monotonic() - started
    producer.flush(10)
    waits = sorted(x for w in team for x in w.waits_ms)
    errors: dict[str, int] = {}
    for w in team:
        for k, v in w.errors.items():
            errors[k] = errors.get(k, 0) + v
    out = {"ryw_wait_p50_ms": round(percentile(waits, 50), 2) if waits else None,
           "ryw_wait_p99_ms": round(percentile(waits, 99), 2) if waits else None,
           "ryw_stale_reads": sum(w.stale for w in team),
           "ryw_not_yet_visible": sum(w.not_yet_visible for w in team),
           "cycles": sum(len(w.waits_ms) + w.not_yet_visible + sum(w.errors.values()) for w in team),
           "errors": errors, "seconds": round(took, 1)}
    say(f"  {out['cycles']} cycles by {writers} writers in {took:.1f}s: the token's wait p50 "
        f"{out['ryw_wait_p50_ms']} ms, p99 {out['ryw_wait_p99_ms']} ms; stale reads {out['ryw_stale_reads']}, "
        f"not yet visible {out['ryw_not_yet_visible']}" + (f", errors {errors}" if errors else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.read_your_writes", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:19092")
    p.add_argument("--router", default="http://127.0.0.1:8080")
    p.add_argument("--topic", default="readings")
    p.add_argument("--cycles", type=int, default=1000)
    p.add_argument("--writers", type=int, default=4)
    a = p.parse_args(argv)
    print(orjson.dumps(measure(a.bootstrap, a.router, a.topic, a.cycles, a.writers)).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

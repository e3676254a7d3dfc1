"""How fast the pipeline digests a burst (``pipeline_burst_s``): demo readings written at once, then every table
caught up.

Once every table's input lag (``/v1/tables``, as any caller sees it) is back at its level without the load, one
producer (confluent-kafka, as fast as it goes) writes ``readings`` demo readings over ``sensors`` sensors to the
input; the figure is the seconds from its first reading until every table's input lag, once it has shown the burst,
is back within ``floor`` records of the input's end. How long the producer itself took is printed beside it: a
system that keeps pace finishes soon after its producer. ``loadtest.peers`` judges a peer by its consumer group's lag.

    python -m loadtest.burst [--readings 100000] [--router http://127.0.0.1:8080]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from contextlib import closing
from typing import Callable

import orjson

from freshroute.settings import kafka_client_config
from loadtest.freshness import InputLag
from loadtest.pipeline_rate import Lag, settle
from tools.local.demo import reading_for

SAMPLE_S = 0.1  # how often the input lag is read while the burst drains


def produce(bootstrap: str, topic: str, readings: int, sensors: int, seed: int = 81) -> float:
    """Write ``readings`` demo readings as fast as one producer can; the seconds until the broker took the last."""
    from confluent_kafka import Producer

    producer = Producer(kafka_client_config(bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))
    rng = random.Random(seed)
    started = time.monotonic()
    for _ in range(readings):
        event = reading_for(rng.randrange(sensors), rng)
        while True:
            try:
                producer.produce(topic, key=event["sensor"].encode(), value=orjson.dumps(event))
                break
            except BufferError:  # its queue is full: let the broker take some first
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("the broker did not take every reading of the burst within 60 s")
    return time.monotonic() - started


def caught_up(lags: dict[str, int | None], floor: int) -> bool:
    """Whether every table is within ``floor`` records of its input's end (a table with no known lag is not)."""
    return bool(lags) and all(n is not None and n <= floor for n in lags.values())


def measure(bootstrap: str, lag: Lag, topic: str, readings: int = 100_000, sensors: int = 1000,
            floor: int = 100, timeout_s: float = 300.0, say: Callable[[str], None] = lambda _m: None) -> dict:
    """One burst: ``pipeline_burst_s`` and the producer's own seconds (None: not caught up within ``timeout_s``)."""
    if not settle(lag, 180.0, floor):
        say("  the pipeline was not at its input's end before the burst; no figure")
        return {"pipeline_burst_s": None, "readings": readings, "producer_s": None}
    started = time.monotonic()
    producer_s = produce(bootstrap, topic, readings, sensors)
    say(f"  {readings:,} readings written in {producer_s:.1f} s by one producer")
    worst = 0
    while time.monotonic() - started < timeout_s:
        lags = lag.sample_all()
        # The input's ends reach /v1/tables a few times a second: caught up counts once the burst has shown.
        if worst > floor and caught_up(lags, floor):
            took = round(time.monotonic() - started, 1)
            say(f"  every table caught up {took} s after the burst's first reading (most behind: {worst:,} records)")
            return {"pipeline_burst_s": took, "readings": readings, "producer_s": round(producer_s, 1),
                    "lag_max": worst}
        worst = max([worst, *(n for n in lags.values() if n is not None)])
        time.sleep(SAMPLE_S)
    say(f"  NOT caught up within {timeout_s:.0f} s of the burst")
    return {"pipeline_burst_s": None, "readings": readings, "producer_s": round(producer_s, 1), "lag_max": worst}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.burst", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:19092")
    p.add_argument("--router", default="http://127.0.0.1:8080")
    p.add_argument("--topic", default="readings")
    p.add_argument("--readings", type=int, default=100_000)
    a = p.parse_args(argv)
    with closing(InputLag(a.router)) as lag:
        out = measure(a.bootstrap, lag, a.topic, a.readings, say=print)
    print(orjson.dumps(out).decode())
    return 0 if out["pipeline_burst_s"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())

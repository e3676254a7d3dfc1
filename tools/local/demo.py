"""Demo producer: sensor readings like ksqlDB's ``readings`` example, at a steady rate.

Events are JSON ``{"sensor","area","reading"}`` keyed by sensor. The producer stops by
itself after ``duration_s`` (and after ``max_events``, when set).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time

import orjson

from freshroute.settings import kafka_client_config

AREAS = ("wheel", "engine", "cabin", "brake")


def sensor_name(i: int) -> str:
    return f"sensor-{i}"


def ensure_topic(bootstrap: str, topic: str, partitions: int = 2, replication_factor: int = 1) -> None:
    """Create the input topic if it does not exist yet (idempotent). Two partitions: on two cores the Real-time
    queries' tasks, one per input partition each, cost more than they spread (docs/benchmarks.md)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(kafka_client_config(bootstrap))
    if topic in admin.list_topics(timeout=10).topics:
        return
    try:
        admin.create_topics([NewTopic(topic, partitions, replication_factor)])[topic].result(10)
    except KafkaException as e:
        if "TOPIC_ALREADY_EXISTS" not in str(e):
            raise


def reading_for(i: int, rng: random.Random) -> dict:
    return {"sensor": sensor_name(i), "area": AREAS[i % len(AREAS)], "reading": round(rng.gauss(50 + i % 40, 5), 2)}


def run(bootstrap: str, topic: str, rate: float, sensors: int, duration_s: float, max_events: int | None, seed: int) -> int:
    from confluent_kafka import Producer

    ensure_topic(bootstrap, topic)
    producer = Producer(kafka_client_config(bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))
    rng = random.Random(seed)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sent = 0
    start = time.monotonic()
    interval = 1.0 / rate if rate > 0 else 0.0
    while not stopping and time.monotonic() - start < duration_s and (max_events is None or sent < max_events):
        i = rng.randrange(sensors)
        event = reading_for(i, rng)
        producer.produce(topic, key=event["sensor"].encode(), value=orjson.dumps(event))
        sent += 1
        producer.poll(0)
        if interval:
            # Pace against the wall clock so that a slow moment is caught up, not lost.
            delay = start + sent * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    producer.flush(10)
    print(f"demo producer: sent {sent} readings to {topic}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", default="readings")
    p.add_argument("--rate", type=float, default=50.0, help="events per second")
    p.add_argument("--sensors", type=int, default=100)
    p.add_argument("--duration-s", type=float, default=3600.0)
    p.add_argument("--max-events", type=int, default=None)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--kafka-config", metavar="FILE",
                   help="librdkafka properties file (name=value lines), as the components' --kafka-config")
    a = p.parse_args(argv)
    if a.kafka_config:
        os.environ["FRESHROUTE_KAFKA_CONFIG"] = a.kafka_config  # read, and checked, where the producer is made
    return run(a.bootstrap, a.topic, a.rate, a.sensors, a.duration_s, a.max_events, a.seed)


if __name__ == "__main__":
    sys.exit(main())

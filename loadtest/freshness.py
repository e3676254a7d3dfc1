"""Event → visible-in-lookup latency: produce readings for fresh keys, poll the router until each shows.

Each probe writes one reading for a key nobody wrote before, then polls
``GET /v1/tables/sensor_stats/keys/{key}`` every ``poll_s`` until it answers 200; the latency is
the time from the produce call to that first 200, so it overstates the truth by at most one
poll interval. Probes are spread over time so that they sample different points of the
pipeline's micro-batch cycle.

Polling is itself load, and on a small machine its CPU is taken from the pipeline whose
latency is being measured: every 25 ms keeps it small against a one-interval overstatement.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid

import httpx
import orjson


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


async def _probe(client: httpx.AsyncClient, producer, topic: str, table: str, key: str, timeout_s: float,
                 poll_s: float) -> float | None:
    event = {"sensor": key, "area": "probe", "reading": 1.0}
    t0 = time.monotonic()
    producer.produce(topic, key=key.encode(), value=orjson.dumps(event))
    producer.poll(0)
    producer.flush(5)
    while time.monotonic() - t0 < timeout_s:
        r = await client.get(f"/v1/tables/{table}/keys/{key}")
        if r.status_code == 200:
            return (time.monotonic() - t0) * 1000.0
        await asyncio.sleep(poll_s)
    return None


async def measure(bootstrap: str, rest_url: str, topic: str = "readings", table: str = "sensor_stats",
                  probes: int = 40, spacing_s: float = 0.25, timeout_s: float = 30.0, poll_s: float = 0.025,
                  progress=None) -> dict:
    """Run ``probes`` probes, ``spacing_s`` apart, concurrently; return latency percentiles in ms."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    run = uuid.uuid4().hex[:6]
    async with httpx.AsyncClient(base_url=rest_url, timeout=5) as client:
        tasks = []
        for i in range(probes):
            tasks.append(asyncio.create_task(_probe(client, producer, topic, table, f"probe-{run}-{i}", timeout_s, poll_s)))
            if progress:
                progress(i + 1, probes)
            await asyncio.sleep(spacing_s)
        results = await asyncio.gather(*tasks)
    seen = [r for r in results if r is not None]
    return {"probes": probes, "visible": len(seen), "freshness_p50_ms": round(percentile(seen, 50), 1),
            "freshness_p99_ms": round(percentile(seen, 99), 1),
            "freshness_mean_ms": round(statistics.fmean(seen), 1) if seen else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default="127.0.0.1:19092")
    p.add_argument("--router", default="http://127.0.0.1:8080")
    p.add_argument("--topic", default="readings")
    p.add_argument("--probes", type=int, default=40)
    p.add_argument("--poll-ms", type=float, default=25.0, help="how often each probe asks the router")
    a = p.parse_args(argv)
    out = asyncio.run(measure(a.bootstrap, a.router, a.topic, probes=a.probes, poll_s=a.poll_ms / 1000,
                              progress=lambda i, n: print(f"\rprobe {i}/{n}", end="", file=sys.stderr)))
    print(file=sys.stderr)
    print(orjson.dumps(out).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

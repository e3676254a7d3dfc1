"""Event → visible-in-lookup latency: produce readings for fresh keys, poll the router until each shows.

Each probe writes one reading for a key nobody wrote before, then polls
``GET /v1/tables/sensor_stats/keys/{key}`` every ``poll_s`` until it answers 200; the latency is
the time from the produce call to that first 200, so it overstates the truth by at most one
poll interval. Probes are spread over time so that they sample different points of the
pipeline's micro-batch cycle.

Polling is itself load, and on a small machine its CPU is taken from the pipeline whose
latency is being measured: every 25 ms keeps it small against a one-interval overstatement.

:func:`measure_loaded` probes the same way while a producer of its own drives the input at a
fixed rate, and samples the pipeline's input lag (:class:`InputLag`) to show it keeps up.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import httpx
import orjson

from freshroute.settings import kafka_client_config
from pipeline.offsets import InputDataLost, SourceOffset


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

    producer = Producer(kafka_client_config(bootstrap, **{"enable.idempotence": True, "linger.ms": 0}))
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


def committed_offsets(checkpoint: Path) -> dict[int, int] | None:
    """Input partition → end offset of a table's last committed micro-batch, from its checkpoint."""
    try:
        done = max((int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()), default=None)
        if done is None:
            return None
        # "v1", the batch's metadata, then one line per source: our source's offsets.
        lines = (checkpoint / "offsets" / str(done)).read_text().splitlines()
        return dict(SourceOffset.from_dict(orjson.loads(lines[2])).positions)
    except (OSError, ValueError, IndexError, InputDataLost):
        return None  # between a commit and its offsets file, or a checkpoint not written yet


class InputLag:
    """Records of the input topic a table has not processed yet: the topic's end minus its last committed batch."""

    def __init__(self, bootstrap: str, topic: str, checkpoint: Path) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self.checkpoint = checkpoint
        self._consumer = Consumer(kafka_client_config(bootstrap, **{"group.id": "freshroute-bench-lag",
                                                                    "enable.auto.commit": False}))

    def sample(self) -> int | None:
        from confluent_kafka import TopicPartition

        done = committed_offsets(self.checkpoint)
        if done is None:
            return None
        ends = {p: self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5, cached=False)[1]
                for p in done}
        return sum(max(0, ends[p] - done[p]) for p in done)

    def close(self) -> None:
        self._consumer.close()


def start_input_load(bootstrap: str, topic: str, rate: float, sensors: int, max_s: float) -> subprocess.Popen:
    """The demo producer as a process of its own at ``rate`` readings/s, stopping by itself after ``max_s``."""
    return subprocess.Popen([sys.executable, "-m", "freshroute.local.demo", "--bootstrap", bootstrap, "--topic", topic,
                             "--rate", f"{rate:g}", "--sensors", str(sensors), "--duration-s", f"{max_s:g}",
                             "--seed", "20"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def stop_input_load(proc: subprocess.Popen) -> int:
    """Stop the producer; the readings it sent (it prints the count as it exits)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    words = (out or "").split()
    return int(words[words.index("sent") + 1]) if "sent" in words else 0


def measure_loaded(bootstrap: str, rest_url: str, topic: str, table: str, checkpoint: Path, rate: float,
                   probes: int = 100, spacing_s: float = 0.25, timeout_s: float = 30.0, settle_s: float = 10.0,
                   drain_timeout_s: float = 120.0, say: Callable[[str], None] = lambda _m: None) -> dict:
    """Freshness while the input runs at ``rate`` readings/s, with the input lag sampled every second."""
    lag = InputLag(bootstrap, topic, checkpoint)
    lags: list[int] = []
    stop = threading.Event()
    # What the lag is without the load (the input never stops): "drained" is back to that.
    idle = max((n for n in (lag.sample() for _ in range(3)) if n is not None), default=0)
    drained_at = max(100, 2 * idle)

    def sample() -> None:
        while not stop.wait(1.0):
            n = lag.sample()
            if n is not None:
                lags.append(n)

    sampler = threading.Thread(target=sample, name="input-lag", daemon=True)
    load = start_input_load(bootstrap, topic, rate, sensors=1000, max_s=settle_s + probes * spacing_s + timeout_s + 60)
    started = time.monotonic()
    try:
        sampler.start()
        time.sleep(settle_s)  # probes start once the pipeline runs at the load's pace
        out = asyncio.run(measure(bootstrap, rest_url, topic, table, probes, spacing_s, timeout_s))
    finally:
        sent = stop_input_load(load)
        loaded_s = time.monotonic() - started
        stop.set()
        sampler.join(timeout=10)
    say(f"  input: {sent:,} readings in {loaded_s:.0f}s ({sent / loaded_s:,.0f}/s); pipeline input lag p50 "
        f"{percentile(lags, 50):,.0f}, max {max(lags, default=0):,} records over {len(lags)} samples")
    drained = None
    try:
        deadline = time.monotonic() + drain_timeout_s
        t0 = time.monotonic()
        while time.monotonic() < deadline:
            n = lag.sample()
            if n is not None and n <= drained_at:
                drained = round(time.monotonic() - t0, 1)
                break
            time.sleep(0.5)
    finally:
        lag.close()
    say(f"  input lag back to its idle level (≤ {drained_at} records) "
        f"{'after %.1fs' % drained if drained is not None else 'NOT within %.0fs' % drain_timeout_s}")
    return {**out, "input_rate_per_s": round(sent / loaded_s, 1), "input_lag_p50": percentile(lags, 50),
            "input_lag_max": max(lags, default=None), "input_lag_samples": len(lags), "input_lag_idle": idle, "drained_s": drained}


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

"""Event → visible-in-lookup latency: produce readings for fresh keys, poll the router until each shows.

Each probe writes one reading for a key nobody wrote before; every ``poll_s`` one
``POST /v1/tables/sensor_stats/keys:batchGet`` asks for the keys of all probes not yet seen,
and a probe's latency is the time from its produce call to the answer that first finds its
key, so it overstates the truth by at most one poll interval (and one request). Probes are
spread over time so that they sample different points of the pipeline's micro-batch cycle.

With ``hops`` each probe's time is also split where it goes, from record timestamps on this machine's one clock:
*pipeline* — the produce call until the broker appended the table's changelog row of it (its record timestamp, a
changelog's being the broker's append time: the input's broker, Spark's source, shuffle and state, the sink and its
linger); *serving* — that row until a lookup found it (a store node's fetch and apply, and up to one poll interval).
Timestamps are in milliseconds: each hop is ±1 ms. (The broker acknowledges a reading in under a millisecond at the
median here; a delivery report's latency would count the wait for the probe loop's next poll.)

Polling is itself load, and on a small machine its CPU is taken from the pipeline whose
latency is being measured. One request per tick, however many probes are outstanding, keeps
that load fixed: with a request per probe, a slow pipeline meant more outstanding probes,
more polling, less CPU for the pipeline and a slower pipeline still.

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
from typing import Callable

import httpx
import orjson

from freshroute.settings import kafka_client_config

# How often the outstanding probes are asked for, for every system alike: a probe overstates its latency by up to one
# interval and one request (at 10 ms freshroute read 19.5 ms at the median where a lookup every millisecond read 10.8,
# at 2 ms 16–17; docs/benchmarks.md).
POLL_S = 0.002


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


class _Probes:
    """The probes of one run: when each was produced, which are still awaited, and each one's latency."""

    def __init__(self, producer, topic: str, run: str) -> None:
        self.producer = producer
        self.topic = topic
        self.run = run
        self.sent_at: dict[str, float] = {}  # key → its produce call, for the probes not seen yet
        self.latencies: dict[str, float] = {}
        self.wall: dict[str, tuple[float, float | None]] = {}  # key → its produce call and when it was seen (epoch s)
        self.failed = 0  # probes the broker did not take: never visible, and not polled for

    def produce(self, i: int) -> None:
        key = f"probe-{self.run}-{i}"
        event = {"sensor": key, "area": "probe", "reading": 1.0}
        self.sent_at[key] = time.monotonic()
        self.wall[key] = (time.time(), None)
        self.producer.produce(self.topic, key=key.encode(), value=orjson.dumps(event), on_delivery=self._delivered)

    def _delivered(self, err, msg) -> None:
        if err is not None and self.sent_at.pop(msg.key().decode(), None) is not None:
            self.failed += 1

    def seen(self, keys: list[str], at: float) -> None:
        wall = time.time()
        for key in keys:
            t0 = self.sent_at.pop(key, None)
            if t0 is not None:
                self.latencies[key] = (at - t0) * 1000.0
                self.wall[key] = (self.wall[key][0], wall)

    def expire(self, now: float, timeout_s: float) -> None:
        """Give up on probes older than ``timeout_s``: they count as never visible."""
        for key in [k for k, t0 in self.sent_at.items() if now - t0 >= timeout_s]:
            del self.sent_at[key]


async def _poll(client: httpx.AsyncClient, table: str, keys: list[str]) -> list[str]:
    """The keys among ``keys`` that the router finds; none when it does not answer (the next tick asks again)."""
    try:
        r = await client.post(f"/v1/tables/{table}/keys:batchGet", content=orjson.dumps({"keys": keys}))
    except httpx.HTTPError:
        return []
    if r.status_code != 200:
        return []
    return [item["key"] for item in orjson.loads(r.content)["results"] if item.get("found")]


async def _poll_windows(client: httpx.AsyncClient, table: str, keys: list[str]) -> list[str]:
    """The keys among ``keys`` whose window (of the last minute) the router finds: a windowed table's probe."""
    now = int(time.time() * 1000)
    found = []
    for key in keys:
        try:
            r = await client.get(f"/v1/tables/{table}/keys/{key}/windows",
                                 params={"from": now - 60_000, "to": now + 60_000})
        except httpx.HTTPError:
            continue
        if r.status_code == 200 and orjson.loads(r.content)["windows"]:
            found.append(key)
    return found


async def measure(bootstrap: str, rest_url: str, topic: str = "readings", table: str = "sensor_stats",
                  probes: int = 40, spacing_s: float = 0.25, timeout_s: float = 30.0, poll_s: float = POLL_S,
                  progress=None, windows: bool = False, changelog: str | None = None) -> dict:
    """Run ``probes`` probes, ``spacing_s`` apart, polled together every ``poll_s``; return latency percentiles in ms.
    ``windows``: ``table`` is windowed, and a probe is visible once its key's window is. ``changelog``: the table's
    changelog topic, to split each probe's time by hop (``hops`` in the result)."""
    from confluent_kafka import Producer

    producer = Producer(kafka_client_config(bootstrap, **{"enable.idempotence": True, "linger.ms": 0}))
    ends = changelog_ends(bootstrap, changelog) if changelog else None
    async with httpx.AsyncClient(base_url=rest_url, timeout=5) as client:
        out, state = await _run(producer, client, topic, table, probes, spacing_s, timeout_s, poll_s, progress,
                                _poll_windows if windows else _poll)
    if ends is not None:
        out["hops"] = hops(state, changelog_times(bootstrap, changelog, ends, set(state.latencies)))
    return out


async def run_probes(producer, client: httpx.AsyncClient, topic: str, table: str, probes: int, spacing_s: float,
                     timeout_s: float, poll_s: float, progress=None, poll=_poll) -> dict:
    """:func:`measure` with its producer and its router client given."""
    return (await _run(producer, client, topic, table, probes, spacing_s, timeout_s, poll_s, progress, poll))[0]


async def _run(producer, client: httpx.AsyncClient, topic: str, table: str, probes: int, spacing_s: float,
               timeout_s: float, poll_s: float, progress=None, poll=_poll) -> tuple[dict, _Probes]:
    state = _Probes(producer, topic, uuid.uuid4().hex[:6])
    started = time.monotonic()
    made = 0
    # Bounded: every probe is produced by started + probes * spacing_s and given up on timeout_s later.
    while made < probes or state.sent_at:
        now = time.monotonic()
        while made < probes and now >= started + made * spacing_s:
            state.produce(made)
            made += 1
            if progress:
                progress(made, probes)
        producer.poll(0)  # delivery reports: a probe the broker refused is not asked for
        keys = list(state.sent_at)
        if keys:
            state.seen(await poll(client, table, keys), time.monotonic())
        state.expire(time.monotonic(), timeout_s)
        await asyncio.sleep(poll_s)
    producer.flush(5)
    seen = list(state.latencies.values())
    return {"probes": probes, "visible": len(seen), "failed_to_produce": state.failed,
            "freshness_p50_ms": round(percentile(seen, 50), 1), "freshness_p99_ms": round(percentile(seen, 99), 1),
            "freshness_mean_ms": round(statistics.fmean(seen), 1) if seen else None,
            "freshness_max_ms": round(max(seen), 1) if seen else None}, state


def changelog_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Where each partition of ``topic`` ends now: the probes' rows come after."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(kafka_client_config(bootstrap, **{"group.id": "freshness-hops", "enable.auto.commit": False}))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def changelog_times(bootstrap: str, topic: str, ends: dict[int, int], keys: set[str],
                    timeout_s: float = 20.0) -> dict[str, float]:
    """Each of ``keys``' first changelog row after ``ends``: its record timestamp (epoch ms)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(kafka_client_config(bootstrap, **{"group.id": "freshness-hops", "enable.auto.commit": False,
                                                          "enable.partition.eof": True}))
    found: dict[str, float] = {}
    try:
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in ends.items()])
        open_ = set(ends)
        deadline = time.monotonic() + timeout_s
        while open_ and time.monotonic() < deadline and len(found) < len(keys):
            for m in consumer.consume(1000, timeout=0.5):
                if m.error() is not None:
                    open_.discard(m.partition())
                    continue
                key = (m.key() or b"").decode(errors="replace")
                if key in keys and key not in found:
                    found[key] = float(m.timestamp()[1])
    finally:
        consumer.close()
    return found


def hops(state: _Probes, written_ms: dict[str, float]) -> dict[str, dict[str, float]]:
    """Each hop's p50 and p99 over the probes seen whose row was found (see the module's docstring)."""
    pipeline, serving = [], []
    for key, ms in written_ms.items():
        produced, seen = state.wall.get(key, (None, None))
        if produced is None or seen is None:
            continue
        pipeline.append(ms - produced * 1000.0)
        serving.append(seen * 1000.0 - ms)
    return {name: {"p50_ms": round(percentile(values, 50), 1), "p99_ms": round(percentile(values, 99), 1),
                   "probes": len(values)}
            for name, values in (("pipeline", pipeline), ("serving", serving))}


class InputLag:
    """Records of the input topic a table has not processed yet, as the router tells any caller (``/v1/tables``): the
    topic's end, read from the broker, beyond where the pipeline says the table is, in either pipeline mode."""

    def __init__(self, rest_url: str, table: str | None = None) -> None:
        self.table = table
        self._client = httpx.Client(base_url=rest_url, timeout=5)

    def sample(self) -> int | None:
        """The table's input lag in records (None: unknown)."""
        return self.sample_all().get(self.table) if self.table else None

    def sample_all(self) -> dict[str, int | None]:
        """Every pipeline table's input lag in records (None: unknown, e.g. before the pipeline's first progress)."""
        try:
            r = self._client.get("/v1/tables")
        except httpx.HTTPError:
            return {}
        if r.status_code != 200:
            return {}
        return {t["name"]: t["input_lag"]["records"] if t["pipeline"]["last_progress_ms"] is not None else None
                for t in orjson.loads(r.content)["tables"] if t.get("origin") == "pipeline"}

    def close(self) -> None:
        self._client.close()


def start_input_load(bootstrap: str, topic: str, rate: float, sensors: int, max_s: float) -> subprocess.Popen:
    """The demo producer as a process of its own at ``rate`` readings/s, stopping by itself after ``max_s``."""
    return subprocess.Popen([sys.executable, "-m", "tools.local.demo", "--bootstrap", bootstrap, "--topic", topic,
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


def measure_loaded(bootstrap: str, rest_url: str, topic: str, table: str, rate: float,
                   probes: int = 100, spacing_s: float = 0.25, timeout_s: float = 30.0, settle_s: float = 10.0,
                   drain_timeout_s: float = 120.0, say: Callable[[str], None] = lambda _m: None) -> dict:
    """Freshness while the input runs at ``rate`` readings/s, with the input lag sampled every second."""
    lag = InputLag(rest_url, table)
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
    p.add_argument("--poll-ms", type=float, default=POLL_S * 1000,
                   help="how often the outstanding probes are asked for")
    p.add_argument("--hops", default="sensor_stats-changelog", metavar="CHANGELOG",
                   help="split each probe's time by hop, with the table's changelog ('' : no)")
    a = p.parse_args(argv)
    out = asyncio.run(measure(a.bootstrap, a.router, a.topic, probes=a.probes, poll_s=a.poll_ms / 1000,
                              progress=lambda i, n: print(f"\rprobe {i}/{n}", end="", file=sys.stderr),
                              changelog=a.hops or None))
    print(file=sys.stderr)
    print(orjson.dumps(out).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

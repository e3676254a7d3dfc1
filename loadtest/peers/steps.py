"""Each step ``loadtest.peers`` measures one system by, with every system asked alike: its keys written, then CPU at
rest, freshness, lookups/s twice (its JIT cold, then warm), a burst, the highest rate it holds, and failover."""

from __future__ import annotations

import asyncio
import random
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from loadtest.peers.systems import TABLE
from loadtest.pipeline_rate import RATES

PATH = f"/v1/tables/{TABLE}/keys/"
PREFIX = "sensor-"


@dataclass(frozen=True)
class Plan:
    """How long each step runs: the full run's, or a few seconds of each (``--smoke``)."""

    keys: int = 10_000  # the table's keys, each written once before a system is measured; lookups ask for them
    warm_s: float = 300.0  # how long a system has run before it is measured (its start's JIT and first checkpoints)
    rest_s: float = 30.0
    probes: int = 240  # freshness probes, 0.25 s apart: a minute, one Real-time checkpoint interval
    wrk_s: float = 20.0
    burst_readings: int = 100_000
    rates: tuple[float, ...] = RATES
    hold_s: float = 60.0
    judged_s: float = 30.0
    failover_s: float = 25.0
    kill_at_s: float = 5.0
    failover_rate: float = 100.0


SMOKE = Plan(keys=500, warm_s=0.0, rest_s=3.0, probes=8, wrk_s=2.0, burst_readings=3_000, rates=(300,), hold_s=6.0,
             judged_s=3.0, failover_s=6.0, kill_at_s=2.0)


def populate(producer, topic: str, keys: int) -> None:
    """A demo reading for each of the table's keys, as the demo producer writes them (confluent-kafka, its default
    partitioner)."""
    from tools.local.demo import reading_for

    rng = random.Random(75)
    for i in range(keys):
        event = reading_for(i, rng)
        producer.produce(topic, key=event["sensor"].encode(), value=orjson.dumps(event))
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(30) == 0, "readings not delivered"


def sample_keys(keys: int, n: int = 100) -> list[str]:
    """``n`` of the table's keys spread over all of them: what "serves every key" is judged by."""
    return [f"{PREFIX}{i}" for i in range(0, keys, max(1, keys // n))]


def wait_serving(system, producer, topic: str, keys: int, timeout_s: float) -> None:
    """Until ``system`` serves the sample of keys; the keys are written again every 15 s meanwhile, since a peer's
    group starts at the input's end once it has joined (what was written before that, it never reads)."""
    deadline = time.monotonic() + timeout_s
    written = 0.0
    while time.monotonic() < deadline:
        if not system.alive():
            raise RuntimeError(f"{system.name} exited while starting")
        if time.monotonic() - written > 15:
            populate(producer, topic, keys)
            written = time.monotonic()
        try:
            if all(httpx.get(system.url + PATH + k, timeout=2).status_code == 200 for k in sample_keys(keys)):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{system.name} did not serve its keys within {timeout_s:.0f}s")


def wait_warm(system, warm_s: float, say) -> None:
    """Until ``system`` has run ``warm_s``."""
    from freshroute.proc import process_age_s

    wait = warm_s - min(process_age_s(pid) or 0.0 for pid in system.roots().values())
    if wait > 0:
        say(f"  waiting {wait:.0f}s until {system.name} has run {warm_s:.0f}s")
        time.sleep(wait)


async def _poll_each(client: httpx.AsyncClient, table: str, keys: list[str]) -> list[str]:
    """The keys among ``keys`` a system serves, one GET each (the peers have no batch lookup; freshroute is asked
    the same way, so that every system is polled alike)."""
    found = []
    for key in keys:
        try:
            if (await client.get(f"/v1/tables/{table}/keys/{key}")).status_code == 200:
                found.append(key)
        except httpx.HTTPError:
            pass
    return found


async def freshness(url: str, producer, topic: str, probes: int) -> dict:
    """Produce → visible for ``probes`` keys never seen before, by :mod:`loadtest.freshness`'s method."""
    from loadtest.freshness import POLL_S, run_probes

    async with httpx.AsyncClient(base_url=url, timeout=2) as client:
        return await run_probes(producer, client, topic, TABLE, probes, spacing_s=0.25, timeout_s=10.0,
                                poll_s=POLL_S, poll=_poll_each)


def lookups(url: str, keys: int, seconds: float) -> dict:
    """wrk, one thread and 32 connections, random keys of the table: lookups/s, p50 and p99."""
    from loadtest.loadclients import parse_wrk, wrk_command, wrk_env

    done = subprocess.run(wrk_command(url, 32, seconds), capture_output=True, text=True, timeout=seconds + 60,
                          env=wrk_env(TABLE, PREFIX, keys))
    doc = parse_wrk(done.stdout)
    return {"rps": round(doc["rps"]), "p50_ms": round(doc["p50_us"] / 1000, 2),
            "p99_ms": round(doc["p99_us"] / 1000, 2), "errors": doc["errors"]}


def grpc_gets(url: str, keys: int, seconds: float) -> dict:
    """h2load, one thread and 32 connections of one call in flight each, ``Router.Get`` of one served key (h2load
    sends the same request every time): calls/s, p50 and p99."""
    from loadtest.loadclients import GRPC_HEADERS, grpc_frame, h2load_command, parse_h2load, parse_h2load_log
    from proto import router_pb2

    with tempfile.TemporaryDirectory() as work:
        body, log = Path(work) / "get.bin", Path(work) / "h2load.log"
        body.write_bytes(grpc_frame(router_pb2.GetRequest(table=TABLE, key=f"{PREFIX}{keys // 2}").SerializeToString()))
        done = subprocess.run(h2load_command(url, 32, 1, seconds, body_file=body, headers=GRPC_HEADERS, log_file=log),
                              capture_output=True, text=True, timeout=seconds + 60)
        res = parse_h2load(done.stdout)
        latencies = sorted(parse_h2load_log(log)[0])
    pick = (lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)) if latencies else None
    return {"rps": round(res.rps), "p50_ms": pick(0.5) if pick else None, "p99_ms": pick(0.99) if pick else None,
            "errors": res.failed + res.errored + res.timeout}


async def paced(url: str, plan: Plan, kill) -> dict[str, int]:
    """``plan.failover_rate`` lookups/s for ``plan.failover_s`` through one door; ``kill()`` at ``plan.kill_at_s``.
    Every answer but a 200 counts as failed."""
    counts = {"ok": 0, "failed": 0}
    started = time.monotonic()
    killed = False
    pending: set[asyncio.Task] = set()
    async with httpx.AsyncClient(timeout=2, limits=httpx.Limits(max_connections=64)) as client:
        async def one(key: str) -> None:
            try:
                r = await client.get(url + PATH + key)
                counts["ok" if r.status_code == 200 else "failed"] += 1
            except httpx.HTTPError:
                counts["failed"] += 1

        rng = random.Random(25)
        for n in range(int(plan.failover_rate * plan.failover_s)):
            due = started + n / plan.failover_rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if not killed and time.monotonic() - started >= plan.kill_at_s:
                killed = True
                await asyncio.get_running_loop().run_in_executor(None, kill)
            task = asyncio.create_task(one(f"{PREFIX}{rng.randrange(plan.keys)}"))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
    return counts


def held_every_rate(steps: list[dict], rates: tuple[float, ...]) -> bool:
    """Whether the system held the ladder's every rate: its figure is then a floor, not its limit."""
    return len(steps) == len(rates) and all(s["held"] for s in steps)


def measure(system, producer, bootstrap: str, topic: str, plan: Plan, say) -> dict:
    """Every figure of one serving system, the others stopped. The failover step comes last: it kills an instance."""
    from contextlib import closing

    from loadtest import burst, pipeline_rate
    from loadtest.footprint import measure as cpu

    out: dict = {}
    wait_warm(system, plan.warm_s, say)
    say(f"  CPU at rest: {plan.rest_s:.0f}s at the demo's input, no lookups …")
    out["rest_cores"] = round(cpu(system.roots(), plan.rest_s).total_cores, 3)
    say(f"  freshness: {plan.probes} probes, each a new key, asked for every 2 ms …")
    doc = asyncio.run(freshness(system.url, producer, topic, plan.probes))
    out.update(freshness_p50_ms=doc["freshness_p50_ms"], freshness_p99_ms=doc["freshness_p99_ms"],
               never_visible=doc["probes"] - doc["visible"])
    for run in (1, 2):
        say(f"  lookups/s, run {run}: wrk, 32 connections, {plan.wrk_s:.0f} s over {plan.keys:,} keys …")
        out.update({f"lookups_{k}_{run}": v for k, v in lookups(system.url, plan.keys, plan.wrk_s).items()})
    if system.grpc_get is not None:
        say(f"  gRPC Get/s once warm: h2load, 32 connections, {plan.wrk_s:.0f} s …")
        out.update({f"grpc_{k}": v for k, v in grpc_gets(system.grpc_get, plan.keys, plan.wrk_s).items()})
    with closing(system.lag()) as lag:
        say(f"  burst: {plan.burst_readings:,} readings written at once → caught up …")
        doc = burst.measure(bootstrap, lag, topic, plan.burst_readings, plan.keys, say=say)
        out.update(burst_s=doc["pipeline_burst_s"], burst_producer_s=doc["producer_s"])
        say(f"  the highest rate held {plan.hold_s:.0f} s with bounded lag …")
        doc = pipeline_rate.measure(bootstrap, lag, topic, plan.rates, plan.hold_s, plan.judged_s, say=say)
        out.update(max_events_per_s=doc["pipeline_max_events_per_s"], rate_steps=doc["steps"],
                   max_events_capped=held_every_rate(doc["steps"], plan.rates))
    say(f"  failover: {plan.failover_rate:.0f} lookups/s for {plan.failover_s:.0f} s, kill -9 of an instance "
        f"{plan.kill_at_s:.0f} s in …")
    counts = asyncio.run(paced(system.url, plan, system.kill_one))
    out.update(failover_ok=counts["ok"], failover_failed=counts["failed"])
    say(f"  {dict((k, v) for k, v in out.items() if k != 'rate_steps')}")
    return out

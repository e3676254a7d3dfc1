"""freshroute beside its peers, measured in one run on one broker and one input: the demo's ``sensor_stats`` served by
freshroute's router, by Kafka Streams' interactive queries and by Faust's table views.

``python -m loadtest.peers`` runs beside a ``./dev up`` stack. It starts two instances of each peer (one standby copy
of each partition, as the stack keeps one), reading the stack's ``readings`` from their start, and measures each of
the three the same way:

- **freshness**: a reading for a key never seen before is produced; all three are asked for the key every 2 ms until
  it is there (produce → visible, p50 / p99 over the probes);
- **lookups/s**: wrk, 32 connections for 10 s, over the demo's 100 sensors (their p99 beside);
- **failed while an instance dies**: 100 lookups/s for 25 s through one door (freshroute's router, a peer's first
  instance), kill -9 of another instance 5 s in (a store node; the peer's second instance); every answer that is not
  a 200 counts (the killed instance is started again after).

The peers are built the first time: Kafka Streams with Maven (``kafka_streams/pom.xml``, the broker's Kafka
version), Faust (faust-streaming) in a virtual environment of its own under ``.freshroute/peers``. Ends with one
JSON line.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

from loadtest.stats import percentile

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FAUST_VERSION = "0.15.3"
SENSORS = 100
PATH = "/v1/tables/sensor_stats/keys/"


@dataclass
class Peer:
    """Two instances of a peer's app, each an HTTP door to the whole table."""

    name: str
    commands: list[list[str]]  # one per instance
    ports: list[int]
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)
    logs: Path = Path(tempfile.gettempdir())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def start(self, i: int) -> None:
        log = open(self.logs / f"{self.name}-{i}.log", "ab")
        self.procs[i] = subprocess.Popen(self.commands[i], stdout=log, stderr=subprocess.STDOUT, cwd=self.logs,
                                         start_new_session=True)

    def kill(self, i: int) -> None:
        os.killpg(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait()

    def stop(self) -> None:
        for i, proc in self.procs.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def kafka_streams_classpath(say) -> str:
    """The Kafka Streams app's classpath, built with Maven when missing or older than its sources."""
    project = HERE / "kafka_streams"
    jar = project / "target" / "peer-kafka-streams-0.1.0.jar"
    sources = [project / "pom.xml", *project.joinpath("src").rglob("*.java")]
    if not jar.exists() or any(s.stat().st_mtime > jar.stat().st_mtime for s in sources):
        say("building the Kafka Streams peer with Maven (loadtest/peers/kafka_streams) …")
        subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(project / "pom.xml"), "package"],
                       check=True)
    return f"{jar}:{project / 'target' / 'lib'}/*"


def faust_python(say) -> Path:
    """A Python with faust-streaming, in a virtual environment of its own (made the first time)."""
    venv = REPO / ".freshroute" / "peers" / "faust-venv"
    python = venv / "bin" / "python"
    if not python.exists() or subprocess.run([str(python), "-c", "import faust"], capture_output=True).returncode:
        say(f"installing faust-streaming {FAUST_VERSION} into {venv} …")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"faust-streaming=={FAUST_VERSION}"], check=True)
    return python


def peers(bootstrap: str, topic: str, partitions: int, logs: Path, say) -> list[Peer]:
    from tools.local.services import free_port

    run = uuid.uuid4().hex[:8]
    classpath = kafka_streams_classpath(say)
    ks_ports = [free_port(), free_port()]
    kafka_streams = Peer("kafka-streams", [
        ["java", "-Xmx512m", "-cp", classpath, "io.freshroute.peers.SensorStats", bootstrap, topic,
         f"peers-ks-{run}", str(logs / f"ks-state-{i}"), str(port)] for i, port in enumerate(ks_ports)], ks_ports,
        logs=logs)
    python = faust_python(say)
    faust_ports = [free_port(), free_port()]
    faust = Peer("faust", [
        [str(python), str(HERE / "faust_app.py"), bootstrap, topic, str(partitions), f"peers-faust-{run}",
         str(logs / f"faust-data-{i}"), str(port)] for i, port in enumerate(faust_ports)], faust_ports, logs=logs)
    return [kafka_streams, faust]


def produce(producer, topic: str, keys: list[str]) -> None:
    """A reading for each key, as the demo producer writes them (confluent-kafka, its default partitioner)."""
    for key in keys:
        producer.produce(topic, key=key.encode(), value=orjson.dumps({"sensor": key, "area": "probe", "reading": 1.0}))
    assert producer.flush(10) == 0, "readings not delivered"


async def _visible(client: httpx.AsyncClient, url: str, key: str, started: float, timeout_s: float) -> float | None:
    while time.monotonic() - started < timeout_s:
        try:
            if (await client.get(url + PATH + key)).status_code == 200:
                return (time.monotonic() - started) * 1000
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.002)
    return None


async def freshness(urls: dict[str, str], producer, topic: str, probes: int) -> dict[str, list[float | None]]:
    """Produce → visible, per system, for ``probes`` keys never seen before."""
    seen: dict[str, list[float | None]] = {name: [] for name in urls}
    run = uuid.uuid4().hex[:6]
    async with httpx.AsyncClient(timeout=2) as client:
        for i in range(probes):
            key = f"probe-{run}-{i}"
            started = time.monotonic()
            produce(producer, topic, [key])
            got = await asyncio.gather(*(_visible(client, url, key, started, 10.0) for url in urls.values()))
            for name, ms in zip(urls, got):
                seen[name].append(ms)
            await asyncio.sleep(0.1)
    return seen


def lookups_per_s(url: str) -> dict[str, float]:
    from loadtest.loadclients import parse_wrk, wrk_command, wrk_env

    done = subprocess.run(wrk_command(url, 32, 10), capture_output=True, text=True, timeout=60,
                          env=wrk_env("sensor_stats", "sensor-", SENSORS))
    doc = parse_wrk(done.stdout)
    return {"rps": round(doc["rps"]), "p99_ms": round(doc["p99_us"] / 1000, 2), "errors": doc["errors"]}


async def _paced(url: str, rate: float, duration_s: float, kill_at_s: float, kill) -> dict[str, int]:
    """``rate`` lookups/s over the sensors for ``duration_s``; ``kill()`` at ``kill_at_s``. Counts by outcome."""
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

        for n in range(int(rate * duration_s)):
            due = started + n / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if not killed and time.monotonic() - started >= kill_at_s:
                killed = True
                await asyncio.get_running_loop().run_in_executor(None, kill)
            task = asyncio.create_task(one(f"sensor-{n % SENSORS}"))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
    return counts


def wait_serving(url: str, timeout_s: float, what: str, alive=lambda: True) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} exited while starting")
        try:
            if all(httpx.get(url + PATH + f"sensor-{i}", timeout=2).status_code == 200 for i in range(SENSORS)):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{what} did not serve every sensor in {timeout_s:.0f}s")


def main(argv: list[str] | None = None) -> int:
    import argparse

    from confluent_kafka import Producer

    from freshroute.topics import describe_topic
    from pipeline.topics import admin_client
    from tools.local.stack import Stack

    parser = argparse.ArgumentParser(prog="python -m loadtest.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, default=Path(".freshroute/local"), help="the ./dev up stack's home")
    parser.add_argument("--probes", type=int, default=100)
    args = parser.parse_args(argv)
    say = lambda msg: print(msg, flush=True)  # noqa: E731

    stack = Stack.load(args.home)
    c = stack.config
    topic = f"{c.topic_prefix}readings"
    partitions = len(describe_topic(admin_client({"bootstrap.servers": c.bootstrap}), topic).partitions)
    logs = Path(tempfile.mkdtemp(prefix="freshroute-peers-"))
    others = peers(c.bootstrap, topic, partitions, logs, say)
    figures: dict[str, dict] = {"freshroute": {}, **{p.name: {} for p in others}}
    try:
        for p in others:
            for i in range(2):
                p.start(i)
        # The peers read the input from their start: every sensor has a reading once they serve it.
        producer = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0})
        produce(producer, topic, [f"sensor-{i}" for i in range(SENSORS)])
        for p in others:
            wait_serving(p.url, 180, p.name, lambda p=p: all(proc.poll() is None for proc in p.procs.values()))
            say(f"{p.name} serves every sensor (logs: {logs})")
        urls = {"freshroute": c.rest_url, **{p.name: p.url for p in others}}

        say(f"freshness: {args.probes} probes, each a new key, all three asked every 2 ms …")
        seen = asyncio.run(freshness(urls, producer, topic, args.probes))
        for name, values in seen.items():
            ok = [v for v in values if v is not None]
            p50, p99 = percentile(ok, 50), percentile(ok, 99)
            figures[name].update(freshness_p50_ms=p50 and round(p50, 1), freshness_p99_ms=p99 and round(p99, 1),
                                 never_visible=len(values) - len(ok))
        for name, url in urls.items():
            say(f"lookups/s: wrk against {name} …")
            figures[name].update({f"lookups_{k}": v for k, v in lookups_per_s(url).items()})

        victims = {"freshroute": ("store-node-2", lambda: stack.signal("store-node-2", signal.SIGKILL)),
                   **{p.name: (f"{p.name}-1", lambda p=p: p.kill(1)) for p in others}}
        for name, url in urls.items():
            victim, kill = victims[name]
            say(f"failover: 100 lookups/s through {name} for 25 s, kill -9 of {victim} 5 s in …")
            counts = asyncio.run(_paced(url, 100, 25, 5, kill))
            figures[name].update(failover_ok=counts["ok"], failover_failed=counts["failed"])
            if name == "freshroute":
                stack.start("store-node-2")
    finally:
        for p in others:
            p.stop()

    say("")
    say(f"{'':>16} {'freshness p50/p99 ms':>22} {'lookups/s (p99 ms)':>20} {'failed while one dies':>22}")
    for name, f in figures.items():
        say(f"{name:>16} {f['freshness_p50_ms']!s:>10} / {f['freshness_p99_ms']!s:<9} "
            f"{f['lookups_rps']:>9} ({f['lookups_p99_ms']}) "
            f"{f['failover_failed']:>12} of {f['failover_ok'] + f['failover_failed']}")
    print(orjson.dumps(figures).decode())
    return 0

"""freshroute beside its peers, measured in one run on one broker and one input: the demo's ``sensor_stats`` served by
freshroute's router, by Kafka Streams' interactive queries and by Faust's table views.

``python -m loadtest.peers`` runs beside a ``./dev up`` stack and measures one system at a time, the others not
running, so that none takes the others' CPU: freshroute first, then each peer while freshroute's pipeline, store
nodes and routers are stopped (the broker, Redis and the demo producer keep running; the components are started
again at the end). A peer runs two instances (one standby copy of each partition, as the stack keeps one), reading
the stack's ``readings`` from its start. Once a system has run five minutes (``--warm-s``):

- **CPU at rest**: the cores it uses keeping up with the demo's input over 30 s, no lookups (freshroute: its
  pipeline, store nodes, routers and Redis; the broker and the demo producer count for none);
- **freshness**: a reading for a key never seen before is produced every 0.25 s for a minute (the Real-time
  pipeline's checkpoint interval) and the system asked for each key not yet seen every 10 ms
  (``loadtest.freshness``'s method, the bench's): produce → visible, p50 / p99;
- **lookups/s**: wrk, 32 connections for 10 s, over the demo's 100 sensors (their p99 beside);
- **failed while an instance dies**: 100 lookups/s for 25 s through one door (freshroute's router, a peer's first
  instance), kill -9 of another instance 5 s in (a store node; the peer's second instance); every answer that is not
  a 200 counts.

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
from typing import TYPE_CHECKING

import httpx
import orjson

if TYPE_CHECKING:
    from tools.local.stack import Stack

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FAUST_VERSION = "0.15.3"
SENSORS = 100
PATH = "/v1/tables/sensor_stats/keys/"
SYSTEMS = ["freshroute", "kafka-streams", "faust"]


@dataclass
class Freshroute:
    """The ``./dev up`` stack, measured through its router."""

    stack: "Stack"
    name: str = "freshroute"

    @property
    def url(self) -> str:
        return self.stack.config.rest_url

    @property
    def serving(self) -> list[str]:
        """Its own components: the broker, Redis and the demo producer serve the peers too and keep running."""
        return ["pipeline", *self.stack.store_node_names(), *self.stack.router_names()]

    def roots(self) -> dict[str, int]:
        from loadtest.footprint import stack_roots

        shared = {*self.stack.broker_names(), "demo-producer"}
        return {n: pid for n, pid in stack_roots(self.stack).items() if n not in shared}

    def alive(self) -> bool:
        return all(self.stack.components[n].alive() for n in self.serving)

    def kill_one(self) -> str:
        self.stack.signal("store-node-2", signal.SIGKILL)
        return "store-node-2"


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

    def roots(self) -> dict[str, int]:
        return {f"{self.name}-{i}": proc.pid for i, proc in self.procs.items()}

    def alive(self) -> bool:
        return all(proc.poll() is None for proc in self.procs.values())

    def kill_one(self) -> str:
        self.kill(1)
        return f"{self.name}-1"

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
        return await run_probes(producer, client, topic, "sensor_stats", probes, spacing_s=0.25, timeout_s=10.0,
                                poll_s=POLL_S, poll=_poll_each)


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


def wait_warm(system, warm_s: float, say) -> None:
    """Until ``system`` has run ``warm_s``: its JIT done with its start, its first checkpoints behind it."""
    from freshroute.proc import process_age_s

    wait = warm_s - min(process_age_s(pid) or 0.0 for pid in system.roots().values())
    if wait > 0:
        say(f"  waiting {wait:.0f}s until {system.name} has run {warm_s:.0f}s")
        time.sleep(wait)


def wait_serving(system, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not system.alive():
            raise RuntimeError(f"{system.name} exited while starting")
        try:
            if all(httpx.get(system.url + PATH + f"sensor-{i}", timeout=2).status_code == 200
                   for i in range(SENSORS)):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{system.name} did not serve every sensor in {timeout_s:.0f}s")


def measure(system, producer, topic: str, args, say) -> dict:
    """Every figure of one warm system, the others stopped."""
    from loadtest.footprint import measure as cpu

    out: dict = {}
    wait_warm(system, args.warm_s, say)
    say(f"  CPU at rest: {args.rest_seconds:.0f}s at the demo's input, no lookups …")
    out["rest_cores"] = round(cpu(system.roots(), args.rest_seconds).total_cores, 3)
    say(f"  freshness: {args.probes} probes, each a new key, asked for every 10 ms …")
    doc = asyncio.run(freshness(system.url, producer, topic, args.probes))
    out.update(freshness_p50_ms=doc["freshness_p50_ms"], freshness_p99_ms=doc["freshness_p99_ms"],
               never_visible=doc["probes"] - doc["visible"])
    say("  lookups/s: wrk, 32 connections, 10 s …")
    out.update({f"lookups_{k}": v for k, v in lookups_per_s(system.url).items()})
    say("  failover: 100 lookups/s for 25 s, kill -9 of an instance 5 s in …")
    counts = asyncio.run(_paced(system.url, 100, 25, 5, system.kill_one))
    out.update(failover_ok=counts["ok"], failover_failed=counts["failed"])
    say(f"  {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    from confluent_kafka import Producer

    from freshroute.topics import describe_topic
    from pipeline.topics import admin_client
    from tools.local.stack import Stack

    parser = argparse.ArgumentParser(prog="python -m loadtest.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, default=Path(".freshroute/local"), help="the ./dev up stack's home")
    parser.add_argument("--probes", type=int, default=240,
                        help="freshness probes of each system, 0.25 s apart (240: a minute, one checkpoint interval)")
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS, help="which to measure")
    parser.add_argument("--warm-s", type=float, default=300.0,
                        help="how long each system has run before it is measured (the first minutes' checkpoints of "
                             "a Real-time query pause longer)")
    parser.add_argument("--rest-seconds", type=float, default=30.0, help="how long CPU at rest is measured")
    args = parser.parse_args(argv)
    say = lambda msg: print(msg, flush=True)  # noqa: E731

    stack = Stack.load(args.home)
    c = stack.config
    topic = f"{c.topic_prefix}readings"
    partitions = len(describe_topic(admin_client({"bootstrap.servers": c.bootstrap}), topic).partitions)
    logs = Path(tempfile.mkdtemp(prefix="freshroute-peers-"))
    others = [p for p in peers(c.bootstrap, topic, partitions, logs, say) if p.name in args.systems]
    producer = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0})
    ours = Freshroute(stack)
    figures: dict[str, dict] = {}

    if ours.name in args.systems:
        say("freshroute (the peers not running):")
        wait_serving(ours, 60)
        figures[ours.name] = measure(ours, producer, topic, args, say)
    say(f"stopping freshroute's {', '.join(ours.serving)} while the peers are measured (logs: {logs})")
    stack.stop(*ours.serving)
    try:
        for p in others:
            say(f"{p.name} (freshroute's own components stopped):")
            try:
                for i in range(2):
                    p.start(i)
                # A peer reads the input from its start: every sensor has a reading once it serves it.
                produce(producer, topic, [f"sensor-{i}" for i in range(SENSORS)])
                wait_serving(p, 180)
                figures[p.name] = measure(p, producer, topic, args, say)
            finally:
                p.stop()
    finally:
        say("starting freshroute's components again …")
        for name in ours.serving:
            stack.start(name)

    say("")
    say(f"{'':>16} {'freshness p50/p99 ms':>22} {'lookups/s (p99 ms)':>20} {'failed while one dies':>22} "
        f"{'cores at rest':>14}")
    for name, f in figures.items():
        say(f"{name:>16} {f['freshness_p50_ms']!s:>10} / {f['freshness_p99_ms']!s:<9} "
            f"{f['lookups_rps']:>9} ({f['lookups_p99_ms']}) "
            f"{f['failover_failed']:>12} of {f['failover_ok'] + f['failover_failed']} {f['rest_cores']:>14}")
    print(orjson.dumps(figures).decode())
    return 0

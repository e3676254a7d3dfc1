"""Failover scenarios: steady lookup load on the local stack while store nodes or Redis fail on schedule.

Reads the local stack's state file, runs a fixed-concurrency async lookup load (REST through
httpx, gRPC through grpc.aio, or both) for a bounded time, and at set times kill -9s a store
node (then starts it again), SIGSTOPs one for a while (then SIGCONT), restarts one, or stops
Redis (then starts it again) — only processes recorded in the state file. Every request is
recorded to ``requests.jsonl``; the report directory gets ``summary.json``, plots over time
with the faults marked, and (unless ``--no-check``) the consistency check of the recording.

    .venv/bin/python -m loadtest.scenario --scenario kill-node --duration 40 --out reports/kill-node
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from tools.local.stack import NoLocalStack, Stack
from loadtest.lookups import client_lookup, grpc_lookup, rest_lookup
from loadtest.stats import ANSWERED, percentile
from loadtest.workload import (DEFAULT_BOUND_MIX, BoundMixer, KeyChooser, Session, bound_params,
                               parse_bound_mix)


@dataclass(frozen=True)
class Fault:
    """At ``at_s``, do ``action`` to component ``target``; undo it ``hold_s`` later (if it has an undo)."""

    at_s: float
    action: str  # kill | pause | restart | redis-outage
    target: str
    hold_s: float = 5.0


def faults_for(scenario: str, duration_s: float, node: str, hold_s: float) -> list[Fault]:
    """The fault schedule of a named scenario: the fault at 1/3 of the run, leaving time to recover."""
    at = round(duration_s / 3, 1)
    if scenario == "steady":
        return []
    if scenario == "kill-node":
        return [Fault(at, "kill", node, hold_s)]
    if scenario == "pause-node":
        return [Fault(at, "pause", node, hold_s)]
    if scenario == "restart-node":
        return [Fault(at, "restart", node, 0.0)]
    if scenario == "redis-outage":
        return [Fault(at, "redis-outage", "redis", hold_s)]
    if scenario == "all":
        step = duration_s / 5
        return [Fault(round(step, 1), "kill", node, hold_s), Fault(round(2 * step, 1), "pause", node, hold_s),
                Fault(round(3 * step, 1), "restart", node, 0.0), Fault(round(4 * step, 1), "redis-outage", "redis", hold_s)]
    raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")


SCENARIOS = ("kill-node", "pause-node", "restart-node", "redis-outage", "all", "steady")


# A follower's fetch waits for new records at most the broker's replica.fetch.wait.max.ms (500 ms by default): what a
# leader appended that long before a follower died may not have reached it, and waits for its fencing too.
FOLLOWER_FETCH_WAIT_MS = 500
# How long after a broker's kill its leaving every in-sync set is watched for.
ISR_WATCH_S = 30.0

# (replicas, in-sync replicas) of every partition of the cluster
PartitionReplicas = list[tuple[list[int], list[int]]]


def cluster_isrs(bootstrap: str) -> Callable[[], PartitionReplicas]:
    """What reads the replicas and in-sync replicas of every partition, from the cluster's metadata."""
    from confluent_kafka.admin import AdminClient

    from freshroute.settings import kafka_client_config

    admin = AdminClient(kafka_client_config(bootstrap))

    def read() -> PartitionReplicas:
        md = admin.list_topics(timeout=2)
        return [(list(p.replicas), list(p.isrs)) for t in md.topics.values() for p in t.partitions.values()]

    return read


class FaultInjector:
    """Applies faults to processes recorded in the stack's state file, and undoes them.

    A killed broker's fencing is watched: ``held`` gets a window (from_ms, until_ms) of wall-clock time from just
    before the kill until the broker was in no in-sync set, within which records a leader appended were readable only
    at its end (:meth:`loadtest.label_truth.Timeline.held`).
    """

    def __init__(self, stack: Stack, t0: float, say: Callable[[str], None],
                 isrs: Callable[[], PartitionReplicas] | None = None) -> None:
        self.stack = stack
        self.t0 = t0
        self.say = say
        self.events: list[dict[str, Any]] = []
        self.held: list[tuple[int, int]] = []
        self._isrs = isrs
        self._watches: list[threading.Thread] = []
        self._undo: dict[str, Callable[[], None]] = {}

    def _event(self, text: str) -> None:
        t = round(time.monotonic() - self.t0, 3)
        self.events.append({"t": t, "event": text})
        self.say(f"[{t:6.1f}s] FAULT {text}")

    def _pid(self, name: str) -> int:
        return self.stack.components[name].pid

    def _wait_gone(self, name: str, timeout_s: float = 10.0) -> None:
        comp = self.stack.components[name]
        deadline = time.monotonic() + timeout_s
        while comp.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:  # reap it if this process started it (an earlier restart)
            os.waitpid(comp.pid, os.WNOHANG)
        except ChildProcessError:
            pass

    def _start(self, name: str) -> None:
        comp = self.stack.start(name)
        self._event(f"start {name} (pid {comp.pid})")

    def apply(self, fault: Fault) -> None:
        """Run one fault to completion, undo included (blocking: call it in a thread)."""
        name = fault.target
        if name not in self.stack.components:
            raise KeyError(f"the state file records no component {name!r}")
        if not self.stack.components[name].alive():
            self._event(f"skip {fault.action} {name}: not running")
            return
        if fault.action == "kill":
            self._event(f"kill -9 {name} (pid {self._pid(name)})")
            self._undo[name] = lambda: self._start(name)
            killed_ms = int(time.time() * 1000)
            self.stack.signal(name, signal.SIGKILL)
            self._watch_fencing(name, killed_ms)
            self._wait_gone(name)
            time.sleep(fault.hold_s)
            self._undo.pop(name)()
        elif fault.action == "pause":
            self._event(f"SIGSTOP {name} (pid {self._pid(name)}) for {fault.hold_s:g}s")
            self._undo[name] = lambda: (self.stack.signal(name, signal.SIGCONT), self._event(f"SIGCONT {name}"))
            self.stack.signal(name, signal.SIGSTOP)
            time.sleep(fault.hold_s)
            self._undo.pop(name)()
        elif fault.action == "restart":
            self._event(f"restart {name} (SIGTERM pid {self._pid(name)})")
            self._undo[name] = lambda: self._start(name)
            self.stack.stop(name)
            self._undo.pop(name)()
        elif fault.action == "redis-outage":
            self._event(f"stop {name} (pid {self._pid(name)}) for {fault.hold_s:g}s")
            self._undo[name] = lambda: self._start(name)
            self.stack.stop(name)
            time.sleep(fault.hold_s)
            self._undo.pop(name)()
        else:
            raise ValueError(f"unknown fault action {fault.action!r}")

    def _watch_fencing(self, name: str, killed_ms: int) -> None:
        """If ``name`` is a broker of the stack, note in the background when it has left every in-sync set."""
        brokers = getattr(self.stack, "broker_names", None)
        if brokers is None or name not in brokers():
            return
        node = dict(zip(brokers(), self.stack.broker_nodes()))[name].node_id
        if self._isrs is None:
            self._isrs = cluster_isrs(self.stack.config.bootstrap)
        read = self._isrs

        def watch() -> None:
            deadline = time.monotonic() + ISR_WATCH_S
            while time.monotonic() < deadline:
                try:
                    # A partition the broker alone holds keeps it as its last in-sync replica: it waits for no other.
                    mine = [isr for replicas, isr in read() if node in replicas and len(replicas) > 1]
                except Exception:  # noqa: BLE001 - a broker that does not answer now may the next time
                    mine = None
                if mine is not None and not any(node in isr for isr in mine):
                    self.held.append((killed_ms - FOLLOWER_FETCH_WAIT_MS, int(time.time() * 1000)))
                    self._event(f"{name} is in no in-sync replica set")
                    return
                time.sleep(0.1)
            self._event(f"{name} still in an in-sync replica set {ISR_WATCH_S:g} s after its kill")

        thread = threading.Thread(target=watch, name=f"fencing-{name}", daemon=True)
        thread.start()
        self._watches.append(thread)

    def settle(self, timeout_s: float = ISR_WATCH_S) -> None:
        """Wait for the watches of killed brokers' fencing to end."""
        deadline = time.monotonic() + timeout_s
        for thread in self._watches:
            thread.join(max(0.0, deadline - time.monotonic()))

    def undo_all(self) -> None:
        """Resume or restart whatever a fault left down (after an interruption)."""
        for name, undo in list(self._undo.items()):
            self._undo.pop(name, None)
            try:
                undo()
            except Exception as e:  # noqa: BLE001 - keep undoing the others
                self.say(f"could not undo the fault on {name}: {e}")


@dataclass(frozen=True)
class LoadConfig:
    """The steady load: who asks what, how often, for how long."""

    table: str = "sensor_stats"
    key_prefix: str = "sensor-"
    keys: int = 100
    distribution: str = "uniform"
    zipf_s: float = 1.1
    bound_mix: str = DEFAULT_BOUND_MIX
    # rest | grpc | both (workers alternate) | client (freshroute.client, no router) | all (workers take turns)
    protocol: str = "rest"
    concurrency: int = 16
    rate: float = 300.0  # total requests/s across workers; 0 = as fast as the workers go
    duration_s: float = 30.0
    max_requests: int = 2_000_000
    timeout_s: float = 5.0
    seed: int = 1
    window_span_ms: int = 0  # > 0: window lookups of a windowed table, each the key's windows of this last span
    # With a windowed ``window_table``: the last ``window_workers`` workers read its windows of ``window_span_ms``
    # while the others read ``table``'s keys; both are checked.
    window_table: str = ""
    window_workers: int = 0
    # Read your writes: writers each producing readings of a key of their own to the input, every one followed by a
    # REST lookup after its write token (the consistency check's (d)); their lookups come on top of ``rate``.
    writers: int = 0
    bootstrap: str = ""
    input_topic: str = "readings"


class Recorder:
    """Keeps every record in memory for the report and streams it to a JSONL file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = open(path, "wb")
        self.records: list[dict[str, Any]] = []

    def add(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        self._f.write(orjson.dumps(rec) + b"\n")

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


async def _worker(i: int, cfg: LoadConfig, rest: Any, grpc_stub: Any, client: Any, rec: Recorder, t0: float,
                  deadline: float, budget: list[int]) -> None:
    import random

    rng = random.Random(cfg.seed * 1000 + i)
    chooser = KeyChooser.for_keyspace(cfg.key_prefix, cfg.keys, cfg.distribution, cfg.zipf_s, rng=rng)
    mixer = BoundMixer(parse_bound_mix(cfg.bound_mix), rng)
    session = Session(f"w{i}")
    proto = worker_protocol(cfg.protocol, i)
    table, span_ms = cfg.table, cfg.window_span_ms
    if cfg.window_table:
        table, span_ms = (cfg.window_table, cfg.window_span_ms) if i >= cfg.concurrency - cfg.window_workers \
            else (cfg.table, 0)
    interval = cfg.concurrency / cfg.rate if cfg.rate > 0 else 0.0
    # Spread the workers' first requests over one interval so that a paced load is smooth.
    next_at = time.monotonic() + (interval * i / cfg.concurrency if interval else 0.0)
    while time.monotonic() < deadline and budget[0] > 0:
        if interval:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            # Skip missed slots instead of bursting to catch up: a stalled node must not
            # turn into a thundering herd when it comes back.
            next_at = max(next_at + interval, time.monotonic())
        if time.monotonic() >= deadline:
            break
        budget[0] -= 1
        key = chooser.choose()
        choice = mixer.choose()
        bound = bound_params(choice, session, table)
        seq = session.next_seq()
        span = None
        if span_ms:
            now = int(time.time() * 1000)
            span = (now - span_ms, now + 1)
        if proto == "rest":
            r = await rest_lookup(rest, table, key, choice.kind, bound, t0, session.name, seq, span)
        elif proto == "client":
            r = await client_lookup(client, table, key, choice.kind, bound, t0, session.name, seq, span)
        else:
            r = await grpc_lookup(grpc_stub, table, key, choice.kind, bound, t0, session.name, seq, cfg.timeout_s,
                                  span)
        if r["outcome"] in ANSWERED:
            session.observe(table, r.get("position"))
        rec.add(r)


async def _writer(i: int, cfg: LoadConfig, rest: Any, rec: Recorder, t0: float, deadline: float) -> None:
    """Produce a reading of this writer's own sensor, then look it up after its write token; until ``deadline``."""
    from confluent_kafka import Producer

    from freshroute.settings import kafka_client_config
    from freshroute.write_tokens.make import write_token
    from loadtest.read_your_writes import NotDelivered, deliver

    producer = Producer(kafka_client_config(cfg.bootstrap, **{"linger.ms": 0}))
    key = f"ryw-{cfg.seed}-{i}"
    n = 0
    while time.monotonic() < deadline:
        n += 1
        event = {"sensor": key, "area": "ryw", "reading": float(n)}
        try:
            msg = await asyncio.to_thread(deliver, producer, cfg.input_topic, key.encode(), orjson.dumps(event),
                                          cfg.timeout_s)
        except NotDelivered:
            continue  # nothing to wait for
        # The wait ends within the request's own timeout, so that the router's answer comes before the client gives up.
        bound = {"after": write_token(msg), "wait_ms": round(cfg.timeout_s * 800)}
        r = await rest_lookup(rest, cfg.table, key, "after", bound, t0, f"writer-{i}", n)
        r["after_offsets"] = {str(msg.partition()): msg.offset()}
        rec.add(r)


PROTOCOLS = ("rest", "grpc", "both", "client", "all")
_TURNS = {"both": ("rest", "grpc"), "all": ("rest", "grpc", "client")}


def spoken(protocol: str) -> tuple[str, ...]:
    """The protocols a load's workers speak: its own, or the ones ``both`` and ``all`` mix."""
    return _TURNS.get(protocol, (protocol,))


def worker_protocol(protocol: str, i: int) -> str:
    """What worker ``i`` speaks: its turn among :func:`spoken`."""
    turns = spoken(protocol)
    return turns[i % len(turns)]


async def run_load(cfg: LoadConfig, rest_url: str, grpc_address: str, recorder: Recorder,
                   faults: list[Fault], injector: FaultInjector | None, t0: float,
                   say: Callable[[str], None], redis_url: str = "", namespace: str = "freshroute",
                   stop: threading.Event | None = None) -> None:
    """Run the load for ``cfg.duration_s`` (or until ``stop`` is set) while firing ``faults`` at their times; print
    progress each second.

    ``--protocol client`` reads through :class:`freshroute.client.AsyncClient`, bootstrapped
    from ``redis_url`` with the router as its fallback.
    """
    import grpc
    import httpx

    from freshroute.client import AsyncClient, RoutingPolicy
    from proto import router_pb2_grpc

    deadline = t0 + cfg.duration_s
    budget = [cfg.max_requests]
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    # One per-request timeout for every protocol: the client's request deadline is the one REST and gRPC wait.
    policy = RoutingPolicy(request_timeout_ms=round(cfg.timeout_s * 1000))
    direct = AsyncClient(redis_url, router=rest_url, namespace=namespace, policy=policy) \
        if "client" in spoken(cfg.protocol) else None
    async with httpx.AsyncClient(base_url=rest_url, timeout=cfg.timeout_s, limits=limits) as rest, \
            grpc.aio.insecure_channel(grpc_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        if direct is not None:
            await direct.start()
        workers = [asyncio.create_task(_worker(i, cfg, rest, stub, direct, recorder, t0, deadline, budget))
                   for i in range(cfg.concurrency)]
        workers += [asyncio.create_task(_writer(i, cfg, rest, recorder, t0, deadline)) for i in range(cfg.writers)]
        if stop is not None:
            workers.append(asyncio.create_task(_end_when(stop, deadline, budget)))
        fault_tasks = [asyncio.create_task(_fire_at(f, injector, t0, deadline, say))
                       for f in sorted(faults, key=lambda f: f.at_s)]
        seen = 0
        try:
            while not all(w.done() for w in workers):
                await asyncio.wait(workers, timeout=1.0)
                now = time.monotonic() - t0
                recent = recorder.records[seen:]
                seen = len(recorder.records)
                lat = [r["latency_ms"] for r in recent]
                bad = sum(r["outcome"] not in ANSWERED for r in recent)
                lag = max((r["lag"]["ms"] for r in recent if r.get("lag") and r["lag"]["ms"] is not None), default=None)
                p50, p99 = percentile(lat, 50), percentile(lat, 99)
                say(f"[{now:6.1f}s] {len(recent):5d} req/s  p50 {p50 or 0:7.1f} ms  p99 {p99 or 0:7.1f} ms  "
                    f"failed {bad:4d}  max lag served {lag if lag is not None else '-'} ms  total {seen}")
                recorder.flush()
            for w in workers:
                w.result()  # a worker's own bug must not pass silently
            if fault_tasks:
                # A fault still holding finishes its undo (restart, SIGCONT) before the report.
                await asyncio.wait(fault_tasks, timeout=max(f.hold_s for f in faults) + 30)
        finally:
            for task in workers + fault_tasks:
                task.cancel()
            if direct is not None:
                await direct.close()


async def _end_when(stop: threading.Event, deadline: float, budget: list[int]) -> None:
    """Spend the request budget once ``stop`` is set: each worker ends after the request it is making."""
    while not stop.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if stop.is_set():
        budget[0] = 0


async def _fire_at(fault: Fault, injector: FaultInjector | None, t0: float, deadline: float,
                   say: Callable[[str], None]) -> None:
    await asyncio.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
    if injector is None or time.monotonic() >= deadline:
        return  # the load is over: a fault now would be measured by nothing
    try:
        # In a thread: stopping a process waits for it, and the load must not stall meanwhile.
        await asyncio.to_thread(injector.apply, fault)
    except Exception as e:  # noqa: BLE001 - report it with the run rather than abort the load
        injector.events.append({"t": round(time.monotonic() - t0, 3), "event": f"FAILED {fault.action} {fault.target}: {e}"})
        say(f"fault {fault.action} {fault.target} failed: {e}")


def run(stack: Stack, cfg: LoadConfig, faults: list[Fault], out_dir: Path, check: bool = True,
        plots: bool = True, say: Callable[[str], None] = print, title: str = "",
        stop: threading.Event | None = None, injector_for: Callable[..., Any] | None = None,
        check_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one scenario against ``stack`` and write its report; returns the summary (with ``consistency``).
    ``stop``, when set, ends the load before ``cfg.duration_s``: a load that lasts as long as what it measures.
    ``injector_for(stack, t0, say)`` makes what applies the faults (default: :class:`FaultInjector`'s processes);
    ``check_options`` go to the consistency check."""
    from loadtest.report import write_report

    if cfg.protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}")
    if cfg.concurrency < 1 or cfg.duration_s <= 0:
        raise ValueError("concurrency must be >= 1 and duration > 0")
    parse_bound_mix(cfg.bound_mix)  # fail before starting anything
    out_dir.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(out_dir / "requests.jsonl")
    t0 = time.monotonic()
    injector = (injector_for or FaultInjector)(stack, t0, say)
    c = stack.config
    say(f"{title or 'scenario'}: {cfg.protocol} load, {cfg.concurrency} workers, "
        f"{'%g req/s' % cfg.rate if cfg.rate else 'unpaced'}, {cfg.duration_s:g}s, keys {cfg.distribution}, "
        f"bounds {cfg.bound_mix}; faults: {', '.join(f'{f.action} {f.target} at {f.at_s:g}s' for f in faults) or 'none'}")
    try:
        asyncio.run(run_load(cfg, c.rest_url, c.grpc_address, recorder, faults, injector, t0, say, c.redis_url,
                             c.namespace, stop))
    finally:
        injector.undo_all()
        recorder.close()
    duration = time.monotonic() - t0
    if hasattr(injector, "settle"):
        injector.settle()
    extra: dict[str, Any] = {"scenario": title, "load": cfg.__dict__, "recording": str(recorder.path)}
    if check:
        from loadtest.consistency import changelog_topic, check as check_records, read_changelog, table_window
        from loadtest.input_truth import read_input

        say("consistency check: reading the changelog back …")
        inputs, read = None, "unread: no input topic"
        if cfg.input_topic:
            try:
                inputs, read = read_input(c.bootstrap, cfg.input_topic), f"read: {cfg.input_topic}"
            except Exception as e:  # noqa: BLE001 - without its input only (f) goes unchecked
                read = f"unread: {type(e).__name__}: {e}"
        reports = []
        options = {"held": list(getattr(injector, "held", ())), **(check_options or {})}
        try:
            for table in [cfg.table, *([cfg.window_table] if cfg.window_table and cfg.window_workers else [])]:
                topic = changelog_topic(table, c.redis_url, c.namespace, c.topic_prefix)
                reports.append(check_records(recorder.records, read_changelog(c.bootstrap, topic), table,
                                             table_window(table, c.redis_url, c.namespace), **options,
                                             inputs=inputs).to_dict())
            extra["consistency"] = merged(reports) | {"inputs": read}
        except Exception as e:  # noqa: BLE001 - the run's report still gets written, with the reason
            extra["consistency"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        (out_dir / "consistency.json").write_bytes(orjson.dumps(extra["consistency"], option=orjson.OPT_INDENT_2))
    summary = write_report(recorder.records, injector.events, duration, out_dir, title, extra, plots)
    return summary


def merged(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One check report of several tables' (:meth:`loadtest.consistency.CheckReport.to_dict`): counts summed, each
    table's own under ``tables``; a single table's as it is."""
    if len(reports) == 1:
        return reports[0]
    out: dict[str, Any] = {"ok": all(r["ok"] for r in reports), "table": "+".join(r["table"] for r in reports),
                           "violations_by_kind": {}, "offending": [], "tables": {r["table"]: r for r in reports}}
    for r in reports:
        for k, v in r.items():
            if isinstance(v, int) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
        for kind, n in r["violations_by_kind"].items():
            out["violations_by_kind"][kind] = out["violations_by_kind"].get(kind, 0) + n
        out["offending"] += r["offending"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.scenario", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=SCENARIOS, default="kill-node")
    p.add_argument("--home", default=".freshroute/local", help="the local stack's directory (holds state.json)")
    p.add_argument("--node", default="store-node-2", help="store node to fault (a component name in the state file)")
    p.add_argument("--hold", type=float, default=5.0, help="seconds a node stays killed/paused, Redis stays down")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load (bounded; max 900)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rate", type=float, default=300.0, help="total requests/s; 0 = unpaced")
    p.add_argument("--protocol", choices=PROTOCOLS, default="both",
                   help="client: freshroute.client reading the store nodes directly; all: rest, grpc and client "
                        "workers in turn")
    p.add_argument("--table", default="sensor_stats")
    p.add_argument("--keys", type=int, default=100, help="keyspace size: {prefix}0 .. {prefix}{keys-1}")
    p.add_argument("--key-prefix", default="sensor-")
    p.add_argument("--distribution", choices=("uniform", "zipf"), default="uniform")
    p.add_argument("--zipf-s", type=float, default=1.1)
    p.add_argument("--bounds", default=DEFAULT_BOUND_MIX, help="weighted bound mix, e.g. none:4,max_lag=100:2,session:2")
    p.add_argument("--timeout", type=float, default=5.0, help="per-request timeout (s), of every protocol")
    p.add_argument("--window-span-ms", type=int, default=0,
                   help="window lookups of a windowed --table: each the key's windows of this last span (ms)")
    p.add_argument("--writers", type=int, default=0,
                   help="read your writes: writers producing readings of their own keys, each read back after its "
                        "write token (checked by the consistency check)")
    p.add_argument("--out", type=Path, default=None, help="report directory (default reports/<scenario>-<time>)")
    p.add_argument("--no-check", action="store_true", help="skip the consistency check")
    p.add_argument("--no-plots", action="store_true")
    a = p.parse_args(argv)
    if not 0 < a.duration <= 900:
        p.error("--duration must be within (0, 900] s")
    try:
        stack = Stack.load(Path(a.home), lambda m: print(m, file=sys.stderr, flush=True))
    except NoLocalStack as e:
        print(e.message, file=sys.stderr)
        return 2
    dead = [n for n in ("router", a.node) if n in stack.components and not stack.components[n].alive()]
    if dead or a.node not in stack.components:
        print(f"the local stack is not running as needed (down: {dead or [a.node]})", file=sys.stderr)
        return 2
    cfg = LoadConfig(table=a.table, key_prefix=a.key_prefix, keys=a.keys, distribution=a.distribution,
                     zipf_s=a.zipf_s, bound_mix=a.bounds, protocol=a.protocol, concurrency=a.concurrency,
                     rate=a.rate, duration_s=a.duration, timeout_s=a.timeout, window_span_ms=a.window_span_ms,
                     writers=a.writers, bootstrap=stack.config.bootstrap,
                     input_topic=f"{stack.config.topic_prefix}readings")
    out = a.out or Path("reports") / f"{a.scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    faults = faults_for(a.scenario, a.duration, a.node, a.hold)
    summary = run(stack, cfg, faults, out, check=not a.no_check, plots=not a.no_plots,
                  say=lambda m: print(m, file=sys.stderr, flush=True), title=a.scenario)
    brief = {k: summary[k] for k in ("requests", "answered", "failed", "throughput_rps", "latency", "errors_by_code",
                                     "staleness_served", "faults")}
    if "consistency" in summary:
        brief["consistency_ok"] = summary["consistency"].get("ok")
    print(f"report: {out}/summary.json, {out}/requests.jsonl, plots in {out}/", file=sys.stderr)
    print(orjson.dumps(brief).decode())
    return 0 if summary.get("consistency", {"ok": True}).get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())

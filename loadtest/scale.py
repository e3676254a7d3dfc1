"""The cluster at scale, by simulation: N store nodes' membership against a real Redis, the real
assignor under its lease, and real router processes, with nodes killed one after another.

    python -m loadtest.scale --nodes 10 100 300 1000 --tables 10 --standby-replicas 2

Each simulated node is the store node's own :class:`store_node.membership.Membership` — its
heartbeats, reports, lease attempts and assignment following, through the real metadata
code — over replicas that exist only as reports: a replica given to a node restores for
``--restore-ms`` and is then caught up. Nodes are spread over worker processes; the first
node runs alone in its own process and takes the assignor lease, so the assignor is timed
without the simulation's own load in its process. For each cluster size the run kills nodes
one at a time (they stop heartbeating, as after kill -9), measures the time from the kill to
an assignment without the node, brings the node back empty, and waits for the cluster to
settle before the next kill. With ``--write-rate`` every partition takes writes, so every
replica's position moves at every heartbeat, as in a busy cluster. It prints a table, writes
``scale.json`` and plots every figure against N in ``scale.png``. Loopback only; every run ends
by itself.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import math
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.local.services import free_port, start_redis
from freshroute.metadata.reports import ReplicaReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.rounds import UNREAD
from freshroute.metadata.store import text, MetadataStore
from freshroute.metadata.tables import TableSpec
from freshroute.proc import cpu_seconds, rss_kib, stat_fields

NAMESPACE = "scale"


# ---- one simulated node ----------------------------------------------------------------------

class SimReplicas:
    """A node's replicas as reports only: restoring for ``restore_ms`` after being given, then caught up.

    With ``write_rate`` (records/s into every partition) a caught-up replica's position follows
    the partition's end, so every heartbeat reports positions that moved, as under real writes."""

    def __init__(self, restore_ms: int, write_rate: float = 0.0) -> None:
        self._restore_ms = restore_ms
        self._write_rate = write_rate
        self._since: dict[tuple[str, int], int] = {}
        self._roles: dict[tuple[str, int], Role] = {}
        self._reports: tuple[ReplicaReport, ...] = ()
        self._valid_until = 0  # the reports stay as they are until then (the next restore to finish)

    def follow(self, desired: dict) -> None:
        now = int(time.time() * 1000)
        roles = {key: role for key, (_, role) in desired.items()}
        if roles != self._roles:
            self._roles = roles
            self._since = {key: self._since.get(key, now) for key in desired}
            self._valid_until = 0

    def reports(self, now: int) -> tuple[ReplicaReport, ...]:
        if now < self._valid_until:
            return self._reports
        end = 1000 + int(self._write_rate * now / 1000)
        out, restoring = [], []
        for (table, partition), role in self._roles.items():
            done = self._since[(table, partition)] + self._restore_ms
            if now < done:
                out.append(ReplicaReport(table, partition, role, ReplicaState.RESTORING, 0, end, 10**9))
                restoring.append(done)
            else:
                state = ReplicaState.ACTIVE if role is Role.ACTIVE else ReplicaState.STANDBY
                out.append(ReplicaReport(table, partition, role, state, end, end, 0))
        self._reports = tuple(out)
        self._valid_until = 0 if self._write_rate else min(restoring, default=2**62)
        return self._reports


def _membership(node_id: str, md: MetadataStore, poll_ms: int, restore_ms: int, write_rate: float):
    from store_node.membership import Membership
    from store_node.settings import StoreNodeSettings

    replicas = SimReplicas(restore_ms, write_rate)
    settings = StoreNodeSettings(node_id=node_id, assignment_poll_ms=poll_ms)
    return Membership(settings, md, f"127.0.0.1:{10000 + int(node_id.rsplit('-', 1)[1])}", replicas.reports,
                      replicas.follow)


class _TimedSteps:
    """Wraps the lead's assignor: CPU (thread time) and wall time of every step, and whether it computed."""

    def __init__(self, loop: Any) -> None:
        self._loop = loop
        self._step = loop.step
        # (wall time at end, cpu s, wall s, published a repair) of the steps that computed
        self.runs: list[tuple[float, float, float, bool]] = []
        self.idle_cpu_s = 0.0
        self.idle_steps = 0
        loop.step = self.step

    def step(self, now_ms: int, lease: Any = UNREAD) -> Any:
        before, repairs = self._loop.computations, self._loop.repairs
        cpu, wall = time.thread_time(), time.perf_counter()
        out = self._step(now_ms, lease)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        if self._loop.computations != before:
            self.runs.append((time.time(), cpu, wall, self._loop.repairs != repairs))
        else:
            self.idle_cpu_s += cpu
            self.idle_steps += 1
        return out


def worker(conn: Any, redis_url: str, node_ids: list[str], poll_ms: int, restore_ms: int, write_rate: float,
           lead: bool, deadline_s: float) -> None:
    """Tick every node of this process on schedule; obey kill/revive/stop; report figures at the end.

    The nodes due at the same moment send their rounds in one pipeline
    (:meth:`Membership.tick_together`): Redis sees every node's commands, the simulation saves a
    round trip per node.
    """
    from store_node.membership import Membership

    if not lead:
        # The simulated nodes are the harness: the assignor's process, the routers and Redis,
        # which are measured, come first for the CPU. Their lateness is measured (tick_late_p99_ms)
        # rather than logged by every node.
        os.nice(10)
        logging.getLogger("store_node.assignor").setLevel(logging.ERROR)
    md = MetadataStore.from_url(redis_url, NAMESPACE)
    beat_bytes = [0, 0]  # bytes sent by beats, beats
    rounds = md.rounds

    def counting_rounds(requests):
        for r in requests:
            if r.beat_ms is not None:
                beat_bytes[0] += len(r.node_id) * 2 + 13 + 4 + len(r.report or b"") + len(r.positions or b"") + \
                    6 * 16  # ids, numbers, keys (approx.)
                beat_bytes[1] += 1
        return rounds(requests)
    md.rounds = counting_rounds  # type: ignore[method-assign]
    nodes = {n: _membership(n, md, poll_ms, restore_ms, write_rate) for n in node_ids}
    timed = _TimedSteps(nodes[node_ids[0]].assignor) if lead else None
    period = min(200, poll_ms) / 1000
    due = [(time.monotonic() + i * period / len(node_ids), n) for i, n in enumerate(node_ids)]
    heapq.heapify(due)
    dead: set[str] = set()
    late = []
    end = time.monotonic() + deadline_s
    parent = os.getppid()
    conn.send("ready")
    while time.monotonic() < end and os.getppid() == parent:  # ends with the run, even one killed
        while conn.poll():
            msg = conn.recv()
            if msg[0] == "kill":
                dead.add(msg[1])
            elif msg[0] == "revive":
                dead.discard(msg[1])
                nodes[msg[1]] = _membership(msg[1], md, poll_ms, restore_ms, write_rate)
            elif msg[0] == "stop":
                end = 0
        now = time.monotonic()
        if due[0][0] > now:
            time.sleep(min(due[0][0] - now, 0.01))
            continue
        batch = []
        while due and due[0][0] <= now and len(batch) < 200:
            at, n = heapq.heappop(due)
            late.append(now - at)
            batch.append((max(at + period, now), n))
        for item in batch:
            heapq.heappush(due, item)
        Membership.tick_together([nodes[n] for _, n in batch if n not in dead])
    conn.send({"beat_bytes": beat_bytes[0], "beats": beat_bytes[1],
               "tick_late_p99_ms": 1000 * sorted(late)[int(0.99 * (len(late) - 1))] if late else 0,
               "assignor_runs": timed.runs if timed else [],
               "assignor_idle_cpu_s": timed.idle_cpu_s if timed else 0.0,
               "assignor_idle_steps": timed.idle_steps if timed else 0})


# ---- measuring processes ------------------------------------------------------------------------

def cpu_s(pid: int) -> float:
    fields = stat_fields(pid)
    return cpu_seconds(fields) if fields is not None else 0.0


def rss_mb(pid: int) -> float:
    return (rss_kib(pid) or 0) / 1024


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


@dataclass
class Figures:
    nodes: int
    partitions: int
    replicas: int
    first_assignment_cpu_s: float = 0.0
    death_to_published_ms: list[float] = field(default_factory=list)
    assignor_cpu_ms_after_death: list[float] = field(default_factory=list)  # the run that published the repair
    rebalance_cpu_ms_after_death: list[float] = field(default_factory=list)  # the full run after it
    moves_after_death: list[int] = field(default_factory=list)  # new placements
    role_changes_after_death: list[int] = field(default_factory=list)
    dead_node_replicas: list[int] = field(default_factory=list)
    assignor_idle_cpu_ms_per_poll: float = 0.0
    router_cpu_pct: float = 0.0
    router_cpu_ms_per_refresh: float = 0.0
    router_rss_mb: float = 0.0
    redis_cpu_pct: float = 0.0
    redis_ops_per_s: float = 0.0
    bytes_per_heartbeat: float = 0.0
    report_bytes: int = 0
    tick_late_p99_ms: float = 0.0
    console: dict[str, float] = field(default_factory=dict)  # with --console: what the console costs and how it responds

    def summary(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if not isinstance(v, (list, dict))}
        d.update(self.console)
        d.update(kills=len(self.death_to_published_ms),
                 death_to_published_p50_ms=_pct(self.death_to_published_ms, 0.5),
                 death_to_published_p99_ms=_pct(self.death_to_published_ms, 0.99),
                 assignor_cpu_ms_after_death_p50=_pct(self.assignor_cpu_ms_after_death, 0.5),
                 assignor_cpu_ms_after_death_max=max(self.assignor_cpu_ms_after_death, default=float("nan")),
                 rebalance_cpu_ms_after_death_p50=_pct(self.rebalance_cpu_ms_after_death, 0.5),
                 moves_after_death_max=max(self.moves_after_death, default=0),
                 role_changes_after_death_max=max(self.role_changes_after_death, default=0),
                 dead_node_replicas_max=max(self.dead_node_replicas, default=0))
        return d


def _moves(before: dict, after: dict) -> tuple[int, int]:
    """(replicas placed on a node that did not host them, replicas whose role changed in place)."""
    def roles(a: dict) -> dict:
        return {(k, n): i == 0 for k, ns in a.items() for i, n in enumerate(ns)}
    b, a = roles(before), roles(after)
    return sum(1 for x in a if x not in b), sum(1 for x, r in a.items() if x in b and b[x] != r)


def run_one(n_nodes: int, tables: int, partitions: int, standbys: int, kills: int, routers: int,
            workers: int, poll_ms: int, restore_ms: int, write_rate: float, work: Path, say: Any,
            console: Path | None = None) -> Figures:
    """One cluster size; with ``console`` (a folder for its screenshot), the operator's console measured too."""
    redis_svc = start_redis(work / f"redis-{n_nodes}")
    md = MetadataStore.from_url(redis_svc.address, NAMESPACE)
    md.register_tables([TableSpec(f"t{i}", f"t{i}-changelog", partitions, "k", standby_replicas=standbys)
                        for i in range(tables)])
    figs = Figures(n_nodes, tables * partitions, tables * partitions * (1 + standbys))
    ids = [f"node-{i:04d}" for i in range(n_nodes)]
    ctx = mp.get_context("spawn")
    deadline_s = 120 + kills * 12
    procs, conns, owner = [], [], {}
    router_procs = []
    try:
        # The lead first, alone: it takes the lease before anyone else asks for it.
        groups = [[ids[0]]] + [ids[1 + i::workers] for i in range(workers) if ids[1 + i::workers]]
        for g, group in enumerate(groups):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker, args=(child, redis_svc.address, group, 100 if g == 0 else poll_ms,
                                                 restore_ms, write_rate, g == 0, deadline_s), daemon=True)
            p.start()
            if parent.poll(60):
                parent.recv()
            procs.append(p)
            conns.append(parent)
            for n in group:
                owner[n] = parent
            if g == 0:
                _wait(lambda: md.redis.get(md.keys.assignor) is not None, 10)
        rest_ports = [free_port() for _ in range(routers)]
        for i in range(routers):
            env = dict(os.environ, FRESHROUTE_REDIS_URL=redis_svc.address, FRESHROUTE_NAMESPACE=NAMESPACE,
                       FRESHROUTE_HOST="127.0.0.1", FRESHROUTE_REST_PORT=str(rest_ports[i]),
                       FRESHROUTE_GRPC_PORT=str(free_port()), FRESHROUTE_LOG_LEVEL="WARNING")
            log = open(work / f"router-{n_nodes}-{i}.log", "ab")
            router_procs.append(subprocess.Popen([sys.executable, "-m", "router"], env=env, stdout=log, stderr=log))
        say(f"N={n_nodes}: {len(groups) - 1} worker processes and the lead started; waiting for the first assignment")
        _wait(lambda: _placed(md, ids), 120)
        first = md.assignment()
        assert first is not None
        # Quiet cluster: every replica restored, nothing moving.
        _settle(md, 4.0, 90)
        say(f"N={n_nodes}: settled; measuring the quiet cluster for 10 s")
        r_pids = [p.pid for p in router_procs]
        redis_pid = redis_svc.proc.pid
        t0, rc0, dc0 = time.monotonic(), [cpu_s(p) for p in r_pids], cpu_s(redis_pid)
        ops0 = int(md.redis.info("stats")["total_commands_processed"])
        time.sleep(10)
        el = time.monotonic() - t0
        ops1 = int(md.redis.info("stats")["total_commands_processed"])
        router_cpu = statistics.mean((cpu_s(p) - c) / el for p, c in zip(r_pids, rc0)) if r_pids else 0.0
        figs.router_cpu_pct = 100 * router_cpu
        figs.router_cpu_ms_per_refresh = 1000 * router_cpu * 0.150  # the router refreshes every 150 ms
        figs.router_rss_mb = max((rss_mb(p) for p in r_pids), default=0.0)
        figs.redis_cpu_pct = 100 * (cpu_s(redis_pid) - dc0) / el
        figs.redis_ops_per_s = (ops1 - ops0) / el
        figs.report_bytes = max((len(md.redis.get(md.keys.node(n)) or b"") for n in ids[:20]), default=0)
        if console is not None and r_pids:
            figs.console = measure_console(f"http://127.0.0.1:{rest_ports[0]}", r_pids[0],
                                           console / f"console-{n_nodes}.png", say)
        windows: list[tuple[float, float]] = []
        for k in range(kills):
            victim = ids[1 + (k * 7919) % (n_nodes - 1)]
            before = md.assignment()
            assert before is not None
            hosted = sum(victim in ns for ns in before.replicas.values())
            killed = time.time()
            owner[victim].send(("kill", victim))
            _wait(lambda: not md.redis.hexists(md.keys.placements, victim), 30, interval=0.005)
            published = time.time()
            after = md.assignment()
            assert after is not None
            figs.death_to_published_ms.append(1000 * (published - killed))
            windows.append((killed, published))
            placed, promoted = _moves(before.replicas, after.replicas)
            figs.moves_after_death.append(placed)
            figs.role_changes_after_death.append(promoted)
            figs.dead_node_replicas.append(hosted)
            owner[victim].send(("revive", victim))
            _wait(lambda: md.redis.hexists(md.keys.placements, victim), 30)
            _settle(md, 1.5, 30)
            say(f"N={n_nodes}: kill {k + 1}/{kills}: {victim} ({hosted} replicas) → assignment without it after "
                f"{figs.death_to_published_ms[-1]:.0f} ms: {placed} new placements, {promoted} role changes "
                f"(lease: {text(md.redis.get(md.keys.assignor))})")
        for c in conns:
            c.send(("stop",))
        results = [c.recv() if c.poll(30) else {} for c in conns]
        lead = results[0]
        runs = lead.get("assignor_runs", [])
        if runs:
            figs.first_assignment_cpu_s = runs[0][1]
        # The computation that followed each kill: the first run after the kill that wrote it out.
        figs.assignor_cpu_ms_after_death, figs.rebalance_cpu_ms_after_death = _after_kills(runs, windows)
        figs.assignor_idle_cpu_ms_per_poll = 1000 * lead.get("assignor_idle_cpu_s", 0) / \
            max(1, lead.get("assignor_idle_steps", 0))
        beats = sum(r.get("beats", 0) for r in results[1:])
        figs.bytes_per_heartbeat = sum(r.get("beat_bytes", 0) for r in results[1:]) / max(1, beats)
        figs.tick_late_p99_ms = max((r.get("tick_late_p99_ms", 0) for r in results[1:]), default=0)
        return figs
    finally:
        for p in router_procs:
            p.terminate()
            p.wait(10)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
        redis_svc.stop()


def measure_console(rest_url: str, router_pid: int, screenshot: Path, say: Any) -> dict[str, float]:
    """The operator's console on this cluster: its two views' answer time and size, the router's CPU with one console
    open against the quiet figure, and in headless Chromium the time to the first drawing, a table's replicas on
    demand, and how long the page takes to answer a script while it polls (its responsiveness)."""
    import httpx

    from loadtest.console_poller import ConsolePoller

    out: dict[str, float] = {}
    with httpx.Client(base_url=rest_url, timeout=30) as http:
        times, size = [], 0
        for _ in range(5):  # each past the summary's cache (kept 20 times its build: ~1 s at 1,000 nodes): built anew
            time.sleep(2.0)
            t0 = time.perf_counter()
            r = http.get("/v1/cluster/summary")
            times.append(1000 * (time.perf_counter() - t0))
            size = len(r.content)
        out["console_summary_ms"], out["console_summary_kib"] = statistics.median(times), size / 1024
        table0 = r.json()["tables"][0]["name"]
        t0 = time.perf_counter()
        grid = http.get(f"/v1/cluster/tables/{table0}", params={"limit": 256})
        out["console_grid_ms"], out["console_grid_kib"] = 1000 * (time.perf_counter() - t0), len(grid.content) / 1024
    cpu0, t0 = cpu_s(router_pid), time.monotonic()
    with ConsolePoller(rest_url, max_s=40) as poller:
        time.sleep(10)
    out["console_router_cpu_pct"] = 100 * (cpu_s(router_pid) - cpu0) / (time.monotonic() - t0)
    out["console_poll_p50_ms"] = statistics.median(poller.poll_ms) if poller.poll_ms else float("nan")

    import shutil

    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        say("console: Debian's chromium is not installed; the page is not measured")
        return out
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            page.goto(f"{rest_url}/console")
            page.wait_for_selector("#nodes tbody tr", timeout=60_000)
            page.wait_for_selector("#grid td.replica", timeout=60_000)
            out["console_page_ready_s"] = time.perf_counter() - t0
            last = page.evaluate("[...document.querySelectorAll('#tables tbody tr')].at(-1).dataset.table")
            t0 = time.perf_counter()
            page.click(f"#tables tr[data-table='{last}']")
            # Polled from here: the page's policy forbids the string evaluation wait_for_function relies on.
            while page.evaluate("document.querySelector('#grid').dataset.table") != last:
                if time.perf_counter() - t0 > 60:
                    raise TimeoutError(f"the console did not draw {last}'s replicas within 60 s")
                time.sleep(0.02)
            out["console_table_open_s"] = time.perf_counter() - t0
            evals = []
            for _ in range(40):  # 10 s of the page polling: a script's answer waits for whatever it is doing
                t0 = time.perf_counter()
                page.evaluate("1")
                evals.append(1000 * (time.perf_counter() - t0))
                time.sleep(0.25)
            out["console_page_eval_p99_ms"] = _pct(evals, 0.99)
            page.screenshot(path=str(screenshot))
        finally:
            browser.close()
    say("console: " + ", ".join(f"{k} {v:.1f}" for k, v in out.items()))
    return out


def _after_kills(runs: list, windows: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The assignor's CPU for each kill: the run that published the assignment without the node
    (the repair; runs that reports changing set off meanwhile are not it), and the run after it
    (the rebalance)."""
    repairs, rebalances = [], []
    for killed, published in windows:
        i = next((i for i, (end, _, _, repaired) in enumerate(runs)
                  if repaired and killed < end <= published + 0.05), None)
        if i is not None:
            repairs.append(1000 * runs[i][1])
            if i + 1 < len(runs):
                rebalances.append(1000 * runs[i + 1][1])
    return repairs, rebalances


def _placed(md: MetadataStore, ids: list[str]) -> bool:
    return md.redis.hlen(md.keys.placements) >= len(ids)


def _settle(md: MetadataStore, quiet_s: float, timeout_s: float) -> None:
    """Until the assignment has not changed for ``quiet_s`` (bounded by ``timeout_s``)."""
    end = time.monotonic() + timeout_s
    last, since = md.versions()[1], time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.1)
        v = md.versions()[1]
        if v != last:
            last, since = v, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


def _wait(cond: Any, timeout_s: float, interval: float = 0.05) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(interval)
    raise TimeoutError("condition not met in time")


# ---- report ---------------------------------------------------------------------------------------

COLUMNS = [
    ("nodes", "N", "{:d}"),
    ("kills", "kills", "{:d}"),
    ("death_to_published_p50_ms", "death→published p50 ms", "{:.0f}"),
    ("death_to_published_p99_ms", "p99 ms", "{:.0f}"),
    ("assignor_cpu_ms_after_death_p50", "assignor CPU/death ms p50", "{:.1f}"),
    ("assignor_cpu_ms_after_death_max", "max", "{:.1f}"),
    ("rebalance_cpu_ms_after_death_p50", "rebalance CPU after it ms p50", "{:.1f}"),
    ("first_assignment_cpu_s", "first assignment CPU s", "{:.2f}"),
    ("moves_after_death_max", "new placements/death max", "{:d}"),
    ("role_changes_after_death_max", "role changes/death max", "{:d}"),
    ("dead_node_replicas_max", "dead node's replicas max", "{:d}"),
    ("assignor_idle_cpu_ms_per_poll", "assignor idle CPU/poll ms", "{:.2f}"),
    ("router_cpu_pct", "router CPU %", "{:.1f}"),
    ("router_cpu_ms_per_refresh", "router CPU/refresh ms", "{:.2f}"),
    ("router_rss_mb", "router RSS MB", "{:.0f}"),
    ("redis_cpu_pct", "Redis CPU %", "{:.1f}"),
    ("redis_ops_per_s", "Redis ops/s", "{:.0f}"),
    ("bytes_per_heartbeat", "bytes/heartbeat", "{:.0f}"),
    ("report_bytes", "full report bytes", "{:d}"),
    ("tick_late_p99_ms", "sim nodes' tick lateness p99 ms", "{:.0f}"),
]


def table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for key, title, fmt in COLUMNS:
        cells = []
        for r in rows:
            v = r.get(key)
            try:
                cells.append(fmt.format(v))
            except (TypeError, ValueError):
                cells.append(str(v))
        lines.append(f"{title:>28}  " + "  ".join(f"{c:>9}" for c in cells))
    return "\n".join(lines)


PLOTS = [
    (("death_to_published_p50_ms", "death_to_published_p99_ms"), "death → published assignment (ms)", 1500),
    (("assignor_cpu_ms_after_death_p50", "assignor_cpu_ms_after_death_max", "rebalance_cpu_ms_after_death_p50"),
     "assignor CPU per death (ms)", 200),
    (("router_cpu_pct",), "router CPU (% of a core)", 5),
    (("router_rss_mb",), "router memory (MB RSS)", None),
    (("redis_cpu_pct",), "Redis CPU (% of a core)", 50),
    (("redis_ops_per_s",), "Redis ops/s", None),
    (("bytes_per_heartbeat",), "bytes written per heartbeat", None),
    (("moves_after_death_max", "dead_node_replicas_max", "role_changes_after_death_max"),
     "replicas moved per death", None),
]


def plot(rows: list[dict[str, Any]], path: Path, title_suffix: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(16, 7.5))
    xs = [r["nodes"] for r in rows]
    for ax, (keys, title, target) in zip(axes.flat, PLOTS):
        for key in keys:
            points = [(x, r[key]) for x, r in zip(xs, rows) if isinstance(r.get(key), (int, float))
                      and math.isfinite(r[key])]  # a figure a run could not measure is left out
            ax.plot([x for x, _ in points], [v for _, v in points], marker="o", label=key.replace("_", " "))
        if target is not None:
            ax.axhline(target, color="red", linestyle="--", linewidth=1, label=f"target {target}")
        ax.set_xscale("log")
        ax.set_xlim(min(xs) / 1.5, max(xs) * 1.5)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("store nodes")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"freshroute metadata at scale ({rows[-1]['partitions']:,} partitions, "
                 f"{rows[-1]['replicas']:,} replicas{title_suffix})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 300, 1000])
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--partitions", type=int, default=None,
                   help="partitions per table (default: as many as nodes, so 10 tables give 10 partitions per node)")
    p.add_argument("--standby-replicas", type=int, default=2)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--routers", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="processes the simulated nodes are spread over")
    p.add_argument("--poll-ms", type=int, default=200,
                   help="the simulated nodes' assignment poll (the lead, which assigns, polls every 100 ms as real nodes do)")
    p.add_argument("--restore-ms", type=int, default=1000)
    p.add_argument("--write-rate", type=float, default=0.0,
                   help="records/s into every partition: replicas' positions move at every heartbeat (0: a quiet cluster)")
    p.add_argument("--out", type=Path, default=Path("scale-results"))
    p.add_argument("--console", action="store_true",
                   help="also measure the operator's console on each size (its views, the router's CPU with it open, "
                        "and the page in headless Chromium)")
    a = p.parse_args(argv)
    if any(n < 2 for n in a.nodes):
        p.error("--nodes: at least 2 (one node is the assignor, the others are killed)")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []

    def say(msg: str) -> None:
        print(msg, flush=True)

    # Stopped from outside, the run still stops its Redis and routers (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with tempfile.TemporaryDirectory(prefix="freshroute-scale-") as tmp:
        for n in a.nodes:
            figs = run_one(n, a.tables, a.partitions or n, a.standby_replicas, a.kills, a.routers, a.workers,
                           a.poll_ms, a.restore_ms, a.write_rate, Path(tmp), say, a.out if a.console else None)
            rows.append(figs.summary())
            (a.out / "scale.json").write_text(json.dumps({"rows": rows, "args": {
                k: str(v) for k, v in vars(a).items()}}, indent=1))
    print(table(rows))
    plot(rows, a.out / "scale.png",
         f", every partition written at {a.write_rate:g}/s" if a.write_rate else ", no writes")
    print(f"wrote {a.out / 'scale.json'} and {a.out / 'scale.png'}")
    print(json.dumps({f"{r['nodes']}": {k: r[k] for k, _, _ in COLUMNS if k in r} |
                      {k: v for k, v in r.items() if k.startswith("console_")} for r in rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

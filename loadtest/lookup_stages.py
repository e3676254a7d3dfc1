"""Where a lookup's time goes: the routers' and the store nodes' CPU per lookup, by stage, under saturation.

wrk loads the REST port of a running local stack (every router behind it) with point lookups of rotating keys;
meanwhile ``/proc`` gives each process's CPU and py-spy samples every router and store node without pausing them.
A sample is charged to the stage of its innermost frame in the project's code — the C code a frame calls (httptools,
orjson, rocksdict, the kernel's sockets) counts for the frame that called it — and a sample with no project frame
to the event loop. CPU per lookup is a process's CPU over the lookups answered; a stage's share is its share of the
process's samples. The router's compiled lookup path (native/dataplane) runs on threads py-spy does not sample: its
CPU is read per thread from ``/proc`` and shown as a stage of its own.

    python -m loadtest.lookup_stages [--home .freshroute/local] [--seconds 10] [--query max_lag=100]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import orjson

from loadtest import loadclients as lc
from loadtest.footprint import stack_roots, tree_cpu_seconds

ROOT = Path(__file__).resolve().parents[1]

# Stage of a frame: by (file, function) first, then by file; files are relative to the project's root.
ROUTER_STAGES: Mapping[str, str] = {
    "router/transports/http1.py": "http",
    "router/auth.py": "admit", "router/rate_limit.py": "admit",
    "router/rest/routes.py": "parse", "freshroute/bound.py": "parse",
    "router/routing.py": "route", "freshroute/routing/core.py": "route", "freshroute/routing/selection.py": "route",
    "freshroute/routing/attempts.py": "route", "freshroute/routing/drivers.py": "route",
    "freshroute/routing/snapshot.py": "route", "freshroute/routing/counts.py": "route",
    "freshroute/keys.py": "route", "freshroute/formats.py": "route", "freshroute/lag.py": "route",
    "freshroute/write_tokens/read_after.py": "route",
    "freshroute/routing/store.py": "forward", "freshroute/wire.py": "forward",
    "freshroute/routing/results.py": "answer", "freshroute/routing/answers.py": "answer",
    "freshroute/position.py": "answer", "freshroute/metadata/progress.py": "answer",
    # The loop's own work (asyncio's selector and callbacks, below the process's entry frame) is the event loop's.
    "router/main.py": "event loop", "router/runtime.py": "event loop",
    "freshroute/routing/refresher.py": "control plane", "freshroute/heartbeats.py": "control plane",
    "freshroute/metadata/store.py": "control plane", "router/metrics.py": "control plane",
}
ROUTER_FUNCTIONS: Mapping[tuple[str, str], str] = {
    # The key route's answer is its JSON body (orjson) and the error's translation.
    ("router/rest/routes.py", "respond"): "answer", ("router/rest/routes.py", "answer"): "answer",
    ("router/rest/routes.py", "admit"): "admit",
}
STORE_STAGES: Mapping[str, str] = {
    "store_node/read_port.py": "read port", "freshroute/wire.py": "wire",
    "freshroute/bound.py": "judge", "store_node/replica.py": "judge", "freshroute/lag.py": "judge",
    "freshroute/position.py": "judge",
    "store_node/replica_store.py": "read", "store_node/history.py": "read",
    "store_node/node.py": "event loop", "store_node/service.py": "event loop",
    # What a node does whether or not it is asked: tail its changelogs, and keep its membership and assignment.
    **dict.fromkeys(("store_node/changelog.py", "store_node/changelog_fetch.py", "store_node/applier.py",
                     "store_node/end_offsets.py", "store_node/bulk_restore.py", "store_node/store_checkpoint.py",
                     "freshroute/changelog_reader.py"), "changelog"),
    **dict.fromkeys(("store_node/membership.py", "store_node/input_ends.py", "store_node/assignor.py",
                     "store_node/assignment_follower.py", "freshroute/metadata/store.py", "freshroute/heartbeats.py",
                     "store_node/metrics.py"), "control plane"),
}
STAGE_ORDER = ("compiled path", "http", "admit", "parse", "route", "forward", "answer", "read port", "wire", "judge", "read",
               "event loop", "changelog", "control plane", "elsewhere")
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*):\d+\)$")


def stage_of(stack: str, files: Mapping[str, str], functions: Mapping[tuple[str, str], str]) -> str:
    """The stage of one collapsed py-spy stack (outermost frame first): its innermost project frame's, "event loop"
    when it has none, "elsewhere" when that frame is project code of no stage."""
    for frame in reversed(stack.split(";")):
        m = _FRAME.match(frame)
        if m is None:
            continue
        path = Path(m["file"])
        if not path.is_absolute() or not path.is_relative_to(ROOT) or ".venv" in path.parts:
            continue
        rel = path.relative_to(ROOT).as_posix()
        return functions.get((rel, m["function"])) or files.get(rel, "elsewhere")
    return "event loop"


def stages_of_samples(raw: str, files: Mapping[str, str],
                      functions: Mapping[tuple[str, str], str] = {}) -> Counter[str]:
    """Samples by stage of py-spy's ``--format raw`` output (one ``stack count`` per line)."""
    out: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out[stage_of(stack, files, functions)] += int(count)
    return out


def py_spy() -> str:
    """py-spy beside this interpreter (the load extra installs it), or on the PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise RuntimeError("py-spy is not installed: pip install 'freshroute[load]'")
    return found


# The router's compiled lookup path runs on threads of its own (native/dataplane names them so), which py-spy does
# not sample: their CPU is read from /proc as a stage of its own.
COMPILED_THREADS = "rest-front-"


def thread_cpu_seconds(pid: int, prefix: str) -> float:
    """CPU seconds used so far by the threads of process ``pid`` whose name starts with ``prefix``."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            raw = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        name, after = raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()
        if name.startswith(prefix):
            total += int(after[11]) + int(after[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class RoleCost:
    """One role's processes under the load: CPU per lookup, its compiled path's part, and its samples by stage."""

    role: str
    cpu_us_per_lookup: float
    samples: Counter[str]
    compiled_us_per_lookup: float = 0.0

    def by_stage(self) -> dict[str, float]:
        """µs per lookup of each stage, in the order a lookup meets them: the compiled path's as measured, the rest
        of the CPU by the Python threads' samples."""
        total = sum(self.samples.values()) or 1
        python_us = self.cpu_us_per_lookup - self.compiled_us_per_lookup
        out = {"compiled path": round(self.compiled_us_per_lookup, 1)} if self.compiled_us_per_lookup else {}
        return {**out, **{s: round(python_us * self.samples[s] / total, 1) for s in STAGE_ORDER if self.samples[s]}}


def measure(rest_url: str, routers: Mapping[str, int], store_nodes: Mapping[str, int], table: str, key_prefix: str,
            keys: int, seconds: float, connections: int, query: str = "", headers: tuple[str, ...] = (),
            rate: int = 250, work: Path | None = None) -> dict[str, Any]:
    """Load the REST port for ``seconds`` while sampling every process; the figures as one dict."""
    work = work or Path(tempfile.mkdtemp(prefix="freshroute-stages-"))
    work.mkdir(parents=True, exist_ok=True)
    spy = py_spy()
    processes = {**routers, **store_nodes}
    recorders = {name: subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--format", "raw", "--full-filenames", "--nonblocking",
         "--rate", str(rate), "--duration", f"{seconds + 1:g}", "--output", str(work / f"{name}.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for name, pid in processes.items()}
    time.sleep(0.5)  # every sampler attached before the load starts
    before = tree_cpu_seconds(processes)
    compiled_before = sum(thread_cpu_seconds(pid, COMPILED_THREADS) for pid in routers.values())
    cmd = lc.wrk_command(rest_url + "/", connections, seconds, headers=headers)
    out = lc.parse_wrk(lc.run(cmd, seconds + 30, lc.wrk_env(table, key_prefix, keys, query)))
    used = {n: s - before[n] for n, s in tree_cpu_seconds(processes).items()}
    compiled = sum(thread_cpu_seconds(pid, COMPILED_THREADS) for pid in routers.values()) - compiled_before
    for name, proc in recorders.items():
        _, err = proc.communicate(timeout=seconds + 30)
        if proc.returncode != 0:
            raise RuntimeError(f"py-spy could not sample {name}: {err.decode(errors='replace')[-400:]}")
    lookups = out["requests"] - out["errors"]
    if lookups <= 0:
        raise RuntimeError(f"no lookup was answered: {out}")

    def role(name: str, members: Mapping[str, int], files: Mapping[str, str],
             functions: Mapping[tuple[str, str], str], compiled_s: float = 0.0) -> RoleCost:
        samples: Counter[str] = Counter()
        for member in members:
            samples += stages_of_samples((work / f"{member}.txt").read_text(), files, functions)
        return RoleCost(name, sum(used[m] for m in members) / lookups * 1e6, samples, compiled_s / lookups * 1e6)

    costs = [role("router", routers, ROUTER_STAGES, ROUTER_FUNCTIONS, compiled),
             role("store node", store_nodes, STORE_STAGES, {})]
    return {"lookups_per_s": round(out["rps"], 1), "lookups": lookups, "errors": out["errors"],
            "connections": connections, "seconds": seconds, "query": query,
            **{c.role.replace(" ", "_"): {"cpu_us_per_lookup": round(c.cpu_us_per_lookup, 1), "stages_us": c.by_stage(),
                                          "samples": sum(c.samples.values())} for c in costs}}


def report(fig: Mapping[str, Any]) -> str:
    lines = [f"{fig['lookups']:,} lookups at {fig['lookups_per_s']:,.0f}/s over {fig['connections']} connections"
             + (f" (?{fig['query']})" if fig["query"] else "")]
    for role in ("router", "store_node"):
        r = fig[role]
        lines.append(f"  {role.replace('_', ' ')}: {r['cpu_us_per_lookup']:,.1f} µs of CPU per lookup "
                     f"({r['samples']:,} samples)")
        lines += [f"    {stage:<11} {us:7.1f} µs" for stage, us in r["stages_us"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from tools.local.stack import Stack

    p = argparse.ArgumentParser(prog="python -m loadtest.lookup_stages", description=__doc__.split("\n\n")[0])
    p.add_argument("--home", default=".freshroute/local", help="the local stack's directory (holds state.json)")
    p.add_argument("--table", default="sensor_stats")
    p.add_argument("--key-prefix", default="sensor-")
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--query", default="", help="every lookup's query string, e.g. max_lag=100")
    p.add_argument("--header", action="append", default=[], help="a header of every lookup, e.g. an authorization")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line after the table")
    a = p.parse_args(argv)
    stack = Stack.load(Path(a.home))
    pid = stack_roots(stack)
    routers = {n: pid[n] for n in stack.router_names() if n in pid}
    nodes = {n: pid[n] for n in stack.store_node_names() if n in pid}
    fig = measure(stack.config.rest_url, routers, nodes, a.table, a.key_prefix, a.keys, a.seconds, a.connections,
                  a.query, tuple(a.header))
    print(report(fig))
    if a.json:
        print(orjson.dumps(fig).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

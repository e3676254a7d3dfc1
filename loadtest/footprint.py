"""What the stack costs while it only keeps up with its input: CPU of each component over a window.

A component is a process the stack started and every process it started in turn (the
pipeline's JVM and Python workers, the broker's threads), read from ``/proc``: user + system
time of each live process plus what its exited children it waited for had used. Processes
started or ended within the window count for what they used in it.

    python -m loadtest.footprint [--home .freshroute/local] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from freshroute.proc import stat_fields

_TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    """Every process's live children, from one pass over ``/proc``."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            if fields is not None:
                out.setdefault(int(fields[1]), []).append(int(name))
    return out


def tree_cpu_seconds(roots: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each root's process tree (live processes, and the children they reaped)."""
    children = _children()
    out: dict[str, float] = {}
    for name, root in roots.items():
        total, todo, seen = 0, [root], set()
        while todo:  # a tree of a few hundred processes at most; ``seen`` guards against pid reuse loops
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            fields = stat_fields(pid)
            if fields is None:
                continue
            # utime, stime, cutime, cstime: fields 14-17 of /proc/<pid>/stat, 11-14 after the name.
            total += sum(int(x) for x in fields[11:15])
            todo.extend(children.get(pid, ()))
        out[name] = total / _TICK
    return out


@dataclass(frozen=True)
class Footprint:
    seconds: float
    cores: dict[str, float]  # component → cores used over the window

    @property
    def total_cores(self) -> float:
        return sum(self.cores.values())

    def describe(self) -> str:
        parts = sorted(self.cores.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{name} {cores:.3f}" for name, cores in parts)


def measure(roots: Mapping[str, int], seconds: float, sleep: Callable[[float], None] = time.sleep) -> Footprint:
    """Cores each component used over ``seconds``."""
    t0, before = time.monotonic(), tree_cpu_seconds(roots)
    sleep(seconds)
    after, elapsed = tree_cpu_seconds(roots), time.monotonic() - t0
    return Footprint(elapsed, {n: max(0.0, (after[n] - before[n]) / elapsed) for n in roots})


def stack_roots(stack) -> dict[str, int]:
    """Component name → pid of every live component of a local stack."""
    return {c.name: c.pid for c in stack.components.values() if c.pid and c.alive()}


def main(argv: list[str] | None = None) -> int:
    from pathlib import Path

    from freshroute.local.stack import Stack

    p = argparse.ArgumentParser(prog="python -m loadtest.footprint", description=__doc__.split("\n\n")[0])
    p.add_argument("--home", default=".freshroute/local", help="the local stack's directory (holds state.json)")
    p.add_argument("--seconds", type=float, default=30.0)
    a = p.parse_args(argv)
    stack = Stack.load(Path(a.home))
    fp = measure(stack_roots(stack), a.seconds)
    print(f"stack CPU over {fp.seconds:.0f} s: {fp.total_cores:.3f} cores ({fp.describe()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

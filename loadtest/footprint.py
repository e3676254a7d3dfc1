"""What the stack costs while it only keeps up with its input: CPU of each component over a window.

A component is a process the stack started and every process it started in turn (the
pipeline's JVM and Python workers, the broker's threads), read from ``/proc``: user + system
time of each live process plus what its exited children it waited for had used. Processes
started or ended within the window count for what they used in it.

    python -m loadtest.footprint [--home .freshroute/local] [--seconds 30]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

from freshroute.proc import children_by_parent, cpu_seconds, process_tree, stat_fields

T = TypeVar("T")


def tree_cpu_seconds(roots: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each root's process tree (live processes, and the children they reaped)."""
    children = children_by_parent()
    out: dict[str, float] = {}
    for name, root in roots.items():
        fields = (stat_fields(pid) for pid in process_tree(root, children))
        out[name] = sum(cpu_seconds(f, reaped=True) for f in fields if f is not None)
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


def during(roots: Mapping[str, int], work: Callable[[], T]) -> tuple[T, Footprint]:
    """``work()``'s result, and the cores each component used while it ran."""
    t0, before = time.monotonic(), tree_cpu_seconds(roots)
    out = work()
    after, elapsed = tree_cpu_seconds(roots), time.monotonic() - t0
    return out, Footprint(elapsed, {n: max(0.0, (after[n] - before[n]) / elapsed) for n in roots})


def measure(roots: Mapping[str, int], seconds: float, sleep: Callable[[float], None] = time.sleep) -> Footprint:
    """Cores each component used over ``seconds``."""
    return during(roots, lambda: sleep(seconds))[1]


def stack_roots(stack) -> dict[str, int]:
    """Component name → pid of every live component of a local stack."""
    return {c.name: c.pid for c in stack.components.values() if c.pid and c.alive()}


def main(argv: list[str] | None = None) -> int:
    from pathlib import Path

    from tools.local.stack import Stack

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

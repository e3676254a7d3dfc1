"""Does any component of the stack cost more the longer it runs? CPU and RSS of each, once a minute.

Attaches to a running local stack (``local up``, demo producer on) and, for ``--minutes``, takes each
component's CPU over the past minute (its whole process tree, from ``/proc``) and its RSS. At the end
it fits a line through each component's CPU from ``--from-minute`` on and reports the growth that line
gives over the run, against the target: no component grows by more than 0.02 cores. A plot of every
component's CPU and RSS over time goes beside the JSON report.

    python -m loadtest.soak --minutes 60 [--home .freshroute/local] [--out reports/soak]

The last line printed is the summary as JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from freshroute.proc import children_by_parent, process_tree, rss_kib
from loadtest.footprint import stack_roots, tree_cpu_seconds

GROWTH_TARGET_CORES = 0.02


def tree_rss_mib(roots: dict[str, int]) -> dict[str, float]:
    children = children_by_parent()
    return {name: sum(rss_kib(pid) or 0 for pid in process_tree(root, children)) / 1024
            for name, root in roots.items()}


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points; 0 for fewer than two."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in points) / var


def summarize(samples: list[dict[str, Any]], from_minute: int) -> dict[str, Any]:
    """Per component: CPU at the first and last minute counted, the fitted growth and slope, RSS growth."""
    counted = [s for s in samples if s["minute"] >= from_minute] or samples
    components = sorted({n for s in samples for n in s["cores"]})
    out: dict[str, Any] = {}
    for name in components:
        cpu = [(s["minute"], s["cores"][name]) for s in counted if name in s["cores"]]
        rss = [(s["minute"], s["rss_mib"][name]) for s in counted if name in s["rss_mib"]]
        if not cpu:
            continue
        per_minute = slope(cpu)
        span = cpu[-1][0] - cpu[0][0]
        out[name] = {"cores_first": round(cpu[0][1], 3), "cores_last": round(cpu[-1][1], 3),
                     "cores_per_minute": round(per_minute, 5), "cores_growth": round(per_minute * span, 3),
                     "rss_mib_first": round(rss[0][1], 1) if rss else None,
                     "rss_mib_last": round(rss[-1][1], 1) if rss else None}
    worst = max(out.items(), key=lambda kv: kv[1]["cores_growth"], default=(None, {"cores_growth": 0.0}))
    return {"minutes": len(samples), "from_minute": from_minute, "components": out,
            "worst_component": worst[0], "worst_growth_cores": worst[1]["cores_growth"],
            "target_growth_cores": GROWTH_TARGET_CORES,
            "met": worst[1]["cores_growth"] <= GROWTH_TARGET_CORES}


def plot(samples: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cpu_ax, rss_ax) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name in sorted({n for s in samples for n in s["cores"]}):
        xs = [s["minute"] for s in samples if name in s["cores"]]
        cpu_ax.plot(xs, [s["cores"][name] for s in samples if name in s["cores"]], label=name)
        rss_ax.plot(xs, [s["rss_mib"][name] for s in samples if name in s["rss_mib"]], label=name)
    cpu_ax.set_ylabel("cores (past minute)")
    rss_ax.set_ylabel("RSS (MiB)")
    rss_ax.set_xlabel("minute")
    cpu_ax.legend(fontsize=7, ncol=3)
    cpu_ax.set_title("each component of the stack, once a minute")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(home: Path, minutes: int, from_minute: int, out: Path, interval_s: float = 60.0) -> dict[str, Any]:
    from tools.local.stack import Stack

    stack = Stack.load(home)
    roots = stack_roots(stack)
    if not roots:
        raise SystemExit(f"no live component in the stack under {home}: start one with `freshroute local up`")
    out.mkdir(parents=True, exist_ok=True)
    samples: list[dict[str, Any]] = []
    before, t0 = tree_cpu_seconds(roots), time.monotonic()
    for minute in range(1, minutes + 1):
        time.sleep(max(0.0, t0 + minute * interval_s - time.monotonic()))
        now = tree_cpu_seconds(roots)
        cores = {n: max(0.0, (now[n] - before[n]) / interval_s) for n in roots}
        before = now
        sample = {"minute": minute, "cores": cores, "rss_mib": tree_rss_mib(roots)}
        samples.append(sample)
        busiest = ", ".join(f"{n} {c:.3f}" for n, c in sorted(cores.items(), key=lambda kv: -kv[1])[:4])
        print(f"minute {minute:3d}/{minutes}: {sum(cores.values()):.3f} cores ({busiest})", flush=True)
        (out / "samples.json").write_bytes(orjson.dumps(samples, option=orjson.OPT_INDENT_2))
    summary = summarize(samples, from_minute)
    (out / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    plot(samples, out / "soak.png")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--home", default=".freshroute/local", help="the local stack's directory (holds state.json)")
    p.add_argument("--minutes", type=int, default=60, choices=range(1, 24 * 60 + 1), metavar="1-1440")
    p.add_argument("--from-minute", type=int, default=5, help="the fit starts here: the first minutes are warm-up")
    p.add_argument("--out", default="reports/soak")
    a = p.parse_args(argv)
    summary = run(Path(a.home), a.minutes, min(a.from_minute, a.minutes), Path(a.out))
    for name, c in summary["components"].items():
        print(f"  {name:<16} {c['cores_first']:.3f} → {c['cores_last']:.3f} cores, growth {c['cores_growth']:+.3f} "
              f"({c['cores_per_minute'] * 60:+.4f}/hour); RSS {c['rss_mib_first']} → {c['rss_mib_last']} MiB")
    print(f"worst growth: {summary['worst_component']} {summary['worst_growth_cores']:+.3f} cores "
          f"(target ≤ {GROWTH_TARGET_CORES}): {'met' if summary['met'] else 'NOT met'}; plot {Path(a.out) / 'soak.png'}")
    print(orjson.dumps(summary).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

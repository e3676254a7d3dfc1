"""Partitions, not only kills: a stack in network namespaces, its links cut under a recorded lookup load, and every
answer judged afterwards.

    sudo .venv/bin/python -m loadtest.partitions                       # every scenario, about 2 minutes each
    sudo .venv/bin/python -m loadtest.partitions --scenarios node-broker router-node --hold 10

The process makes the network (:mod:`loadtest.partitions.network`) and runs itself again inside the harness's own
namespace, which starts the stack (every component in a namespace of its own), runs each scenario
(:mod:`loadtest.partitions.faults`) with :func:`loadtest.scenario.run` and checks its recording against the
changelog (:mod:`loadtest.consistency`, labels included). The stack is stopped and every namespace deleted at the
end, also on Ctrl-C; a run that was killed outright is swept by the next.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from loadtest.partitions.faults import SCENARIOS, NetworkFaults
from loadtest.partitions.figures import scenario_row, table_lines
from loadtest.partitions.settled import keys_lost
from loadtest.partitions.slow_links import SlowLinks
from loadtest.partitions.network import (Network, NetworkError, leftover_tags, namespaces, run_tag, sweep,
                                         why_not_here)
from tools.local.stack import NETNS_SUBNET, Stack, StackConfig

HARNESS_ADDRESS = f"{NETNS_SUBNET}.100"
BOUNDS = "none:3,max_lag=0:2,max_lag=100:1,max_staleness_ms=1000:2,session:2"


def stack_config(out: Path, tag: str) -> StackConfig:
    """The stack a run partitions: three store nodes, one router, the demo's input; changelogs kept whole (hour-long
    segments) so that the checker decides every answer."""
    return StackConfig(home=out / "stack", netns=tag, routers=1, changelog_segment_ms=3_600_000,
                       store_ports=(0, 0, 0), rest_port=0, grpc_port=0, broker_port=0, redis_port=0).resolved()


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def outside(a: argparse.Namespace, argv: list[str]) -> int:
    """Make the network, run the harness inside it, and remove the network whatever happens."""
    why = why_not_here()
    if why:
        say(f"cannot partition here: {why}")
        return 3
    swept = sweep(leftover_tags(namespaces()))
    if swept:
        say(f"removed {len(swept)} namespaces of an earlier run that ended without removing them")
    tag = run_tag()
    network = Network(tag, stack_config(a.out, tag).places(), HARNESS_ADDRESS)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    child: subprocess.Popen[bytes] | None = None
    try:
        network.create(say)
        child = subprocess.Popen(["ip", "netns", "exec", network.harness, sys.executable, "-m", "loadtest.partitions",
                                  "--inside", tag, *argv])
        return child.wait()
    except KeyboardInterrupt:
        if child is not None:
            child.send_signal(signal.SIGINT)
            child.wait(timeout=120)
        return 130
    except NetworkError as e:
        say(f"cannot partition here: {e}")
        return 3
    finally:
        network.remove()


def inside(a: argparse.Namespace, tag: str) -> int:
    """Start the stack, run every scenario, write the table; stop the stack."""
    from loadtest.scenario import LoadConfig, run

    config = stack_config(a.out, tag)
    network = Network(tag, config.places(), HARNESS_ADDRESS)
    stack = Stack(config, progress=say)
    rows: list[dict[str, Any]] = []
    slow: dict[str, SlowLinks] = {}
    for scenario in (SCENARIOS[name] for name in a.scenarios if SCENARIOS[name].way == "slow"):
        addresses = stack.command_for(scenario.component)[2]
        host, grpc = addresses["address"].rsplit(":", 1)
        ports = {"grpc": int(grpc), "read": int(addresses["read_address"].rsplit(":", 1)[1])}
        (config.home / "logs").mkdir(parents=True, exist_ok=True)
        slow[scenario.component] = SlowLinks(config.place_of(scenario.component), host, ports,
                                             config.home / "logs" / f"toxiproxy-{scenario.component}.log")
    try:
        for links in slow.values():
            links.start()
        stack.up()
        for name in a.scenarios:
            scenario = SCENARIOS[name]
            at = a.warm
            load = LoadConfig(keys=100, bound_mix=BOUNDS, protocol=a.protocol, concurrency=16, rate=a.rate,
                              duration_s=at + a.hold + a.recover, timeout_s=5.0, bootstrap=config.bootstrap,
                              input_topic=f"{config.topic_prefix}readings")
            summary = run(stack, load, scenario.faults(at, a.hold), a.out / name, plots=not a.no_plots, say=say,
                          title=f"{name}: {scenario.story}",
                          injector_for=lambda s, t0, talk: NetworkFaults(s, t0, talk, network, slow),
                          check_options={"label_slack_ms": a.label_slack_ms})
            lost = keys_lost(stack, load.table, [f"{load.key_prefix}{i}" for i in range(load.keys)])
            rows.append(scenario_row(scenario, summary, a.out / name / "requests.jsonl", a.label_slack_ms, lost))
            say("  ".join(f"{k} {v}" for k, v in rows[-1].items()))
    finally:
        network.heal_all()
        stack.down()
        for links in slow.values():
            links.stop()
    (a.out / "partitions.json").write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    for line in table_lines(rows):
        print(line)
    print(orjson.dumps({"partitions": rows}).decode())
    return 0 if all(r["refuted"] == 0 and r["data_lost"] == 0 for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m loadtest.partitions", description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS),
                   metavar="SCENARIO", help=f"of {', '.join(SCENARIOS)} (default: all)")
    p.add_argument("--warm", type=float, default=10.0, help="seconds of load before the cut")
    p.add_argument("--hold", type=float, default=15.0, help="seconds the cut holds")
    p.add_argument("--recover", type=float, default=15.0, help="seconds of load after healing")
    p.add_argument("--rate", type=float, default=200.0, help="lookups/s through the router (bounded load)")
    p.add_argument("--protocol", choices=("rest", "grpc", "both", "client", "all"), default="rest")
    p.add_argument("--label-slack-ms", type=int, default=2000,
                   help="how far a label may trail the truth before the checker refutes it")
    p.add_argument("--out", type=Path, default=None, help="report directory (default reports/partitions-<time>)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--inside", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for value, name, most in ((a.warm, "--warm", 300), (a.hold, "--hold", 600), (a.recover, "--recover", 300)):
        if not 0 < value <= most:
            p.error(f"{name} must be within (0, {most}] s")
    if a.out is None:
        a.out = Path("reports") / f"partitions-{time.strftime('%Y%m%d-%H%M%S')}"
        argv = [*argv, "--out", str(a.out)]
    a.out = a.out.resolve()
    return inside(a, a.inside) if a.inside else outside(a, argv)


if __name__ == "__main__":
    sys.exit(main())

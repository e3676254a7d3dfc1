"""Partitions, not only kills: a stack in network namespaces, its links cut under a recorded lookup load, and every
answer judged afterwards.

    sudo .venv/bin/python -m loadtest.partitions                       # every scenario, about 2 minutes each
    sudo .venv/bin/python -m loadtest.partitions --scenarios node-broker router-node --hold 10

The process makes the network (:mod:`loadtest.partitions.network`) and runs itself again inside the harness's own
namespace, which starts the stack (every component in a namespace of its own), runs each scenario
(:mod:`loadtest.partitions.faults`) with :func:`loadtest.scenario.run` and checks its recording against the
changelog (:mod:`loadtest.consistency`, labels included). The stack (thrown away with the run) is killed and every
namespace deleted at the end, also on Ctrl-C or SIGTERM; a run that was killed outright is swept by the next.
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

from loadtest.partitions.faults import SCENARIOS, TABLE, NetworkFaults, Scenario
from loadtest.partitions.figures import fault_times, scenario_row, table_lines
from loadtest.partitions.settled import WINDOW_TABLE, settle
from loadtest.partitions.slow_links import SlowLinks
from loadtest.partitions.watch import ClusterWatch
from loadtest.partitions.network import (Network, NetworkError, leftover_tags, namespaces, run_tag, sweep,
                                         why_not_here)
from loadtest.label_truth import LABEL_SLACK_MS
from loadtest.scenario import PROTOCOLS, LoadConfig, run
from tools.local.stack import NETNS_SUBNET, Stack, StackConfig

HARNESS_ADDRESS = f"{NETNS_SUBNET}.100"
BOUNDS = "none:3,max_lag=0:2,max_lag=100:1,max_staleness_ms=1000:2,session:2"
WRITERS = 2


def stack_config(out: Path, tag: str, sentinel: bool = False, pipeline_mode: str = "realtime") -> StackConfig:
    """The stack a run partitions: three store nodes, one router, the demo's input (with ``sentinel``, Redis behind
    Sentinel: a replica and three sentinels); changelogs kept whole (hour-long segments) so that the checker decides
    every answer."""
    return StackConfig(home=out / ("stack-sentinel" if sentinel else "stack"), netns=tag, routers=1,
                       changelog_segment_ms=3_600_000, store_ports=(0, 0, 0), rest_port=0, grpc_port=0,
                       broker_port=0, redis_port=0, redis_sentinel=sentinel, pipeline_mode=pipeline_mode).resolved()


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def interrupt_on_term() -> None:
    """SIGTERM ends a run as Ctrl-C does, through every ``finally`` that stops the stack and removes the network."""
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


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
    sentinel = any(SCENARIOS[name].sentinel for name in a.scenarios)
    network = Network(tag, stack_config(a.out, tag, sentinel).places(), HARNESS_ADDRESS)
    interrupt_on_term()
    child: subprocess.Popen[bytes] | None = None
    try:
        network.create(say)
        child = subprocess.Popen(["ip", "netns", "exec", network.harness, sys.executable, "-m", "loadtest.partitions",
                                  "--inside", tag, *argv])
        return child.wait()
    except KeyboardInterrupt:
        if child is not None:
            # SIGTERM, not SIGINT: a run started in the background of a shell ignores SIGINT.
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=120)
        return 130
    except NetworkError as e:
        say(f"cannot partition here: {e}")
        return 3
    finally:
        network.remove()


def inside(a: argparse.Namespace, tag: str) -> int:
    """Run the scenarios on a stack of each kind they need; write the table."""
    interrupt_on_term()
    rows: list[dict[str, Any]] = []
    try:
        for sentinel in (False, True):
            names = [name for name in a.scenarios if SCENARIOS[name].sentinel == sentinel]
            if names:
                on_a_stack(a, tag, names, sentinel, rows)
    finally:  # what was measured is kept, also when a later stack fails to start
        (a.out / "partitions.json").write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    for line in table_lines(rows):
        print(line)
    print(orjson.dumps({"partitions": rows}).decode())
    return 0 if all(r["refuted"] == 0 and r["data_lost"] == 0 for r in rows) else 1


def on_a_stack(a: argparse.Namespace, tag: str, names: list[str], sentinel: bool, rows: list[dict[str, Any]]) -> None:
    """Start a stack, run each scenario on it and judge it into ``rows``; kill the stack whatever happens."""
    config = stack_config(a.out, tag, sentinel, a.pipeline_mode)
    network = Network(tag, config.places(), HARNESS_ADDRESS)
    stack = Stack(config, progress=say)
    slow = {s.component: slow_links(stack, s.component) for s in (SCENARIOS[n] for n in names) if s.way == "slow"}
    try:
        for links in slow.values():
            links.start()
        stack.up()
        for name in names:
            rows.append(one_scenario(a, stack, SCENARIOS[name], network, slow))
            say("  ".join(f"{k} {v}" for k, v in rows[-1].items()))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stack's end is not cut short by a second one
        network.heal_all()
        stack.discard()
        for links in slow.values():
            links.stop()
        interrupt_on_term()


def slow_links(stack: Stack, component: str) -> SlowLinks:
    """Proxies in front of a store node's two ports (gRPC and the read port), in its namespace."""
    config = stack.config
    addresses = stack.command_for(component)[2]
    host, grpc = addresses["address"].rsplit(":", 1)
    ports = {"grpc": int(grpc), "read": int(addresses["read_address"].rsplit(":", 1)[1])}
    (config.home / "logs").mkdir(parents=True, exist_ok=True)
    return SlowLinks(config.place_of(component), host, ports, config.home / "logs" / f"toxiproxy-{component}.log")


def one_scenario(a: argparse.Namespace, stack: Stack, scenario: Scenario, network: Network,
                 slow: dict[str, SlowLinks]) -> dict[str, Any]:
    """Load, fault, heal, check; the scenario's row."""
    config = stack.config
    # Two writers read each of their readings back after its write token (the check's read-your-writes); a quarter
    # of the workers read a key's windows of the last minute, each with its final flag.
    load = LoadConfig(keys=100, bound_mix=BOUNDS, protocol=a.protocol, concurrency=16, rate=a.rate,
                      table=TABLE, duration_s=a.warm + a.hold + a.recover, timeout_s=5.0, writers=WRITERS,
                      window_table=WINDOW_TABLE, window_workers=4, window_span_ms=60_000,
                      bootstrap=config.bootstrap, input_topic=f"{config.topic_prefix}readings")
    injectors: list[NetworkFaults] = []

    def injector(s: Stack, t0: float, talk: Any) -> NetworkFaults:
        injectors.append(NetworkFaults(s, t0, talk, network, slow))
        return injectors[-1]

    with ClusterWatch(config.rest_url, stack.components["router"].addresses["metrics"]) as watch:
        summary = run(stack, load, scenario.faults(a.warm, a.hold), a.out / scenario.name, plots=not a.no_plots,
                      say=say, title=f"{scenario.name}: {scenario.story}", injector_for=injector,
                      check_options={"label_slack_ms": a.label_slack_ms})
    recording = a.out / scenario.name / "requests.jsonl"
    settled = settle(stack, {load.table: [f"{load.key_prefix}{i}" for i in range(load.keys)]}, recording)
    times = (injectors[0].t0, *fault_times(summary))
    view, metrics = scenario.sign(a.label_slack_ms), scenario.metrics_sign(a.label_slack_ms)
    shown = watch.shows(view, *times) if view else (None, None)
    counted = watch.shows(metrics, *times) if metrics else (None, None)
    return scenario_row(scenario, summary, recording, a.label_slack_ms, settled, shown, counted)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m loadtest.partitions", description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS),
                   metavar="SCENARIO", help=f"of {', '.join(SCENARIOS)} (default: all)")
    p.add_argument("--warm", type=float, default=10.0, help="seconds of load before the cut")
    p.add_argument("--hold", type=float, default=15.0, help="seconds the cut holds")
    p.add_argument("--recover", type=float, default=15.0, help="seconds of load after healing")
    p.add_argument("--rate", type=float, default=200.0, help="lookups/s through the router (bounded load)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="rest")
    p.add_argument("--pipeline-mode", choices=("realtime", "microbatch"), default="realtime",
                   help="the stack's pipeline_mode: microbatch to see windows become final (architecture.md)")
    p.add_argument("--label-slack-ms", type=int, default=LABEL_SLACK_MS,
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

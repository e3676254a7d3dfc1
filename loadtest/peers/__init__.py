"""freshroute beside its peers, measured in one run on one broker and one input: the demo's ``sensor_stats`` served by
freshroute's router, by Kafka Streams' interactive queries and by Faust's table views.

``python -m loadtest.peers`` runs beside a ``./dev up`` stack and measures one system at a time, the others not
running, so that none takes the others' CPU: freshroute first, then each peer while freshroute's pipeline, store
nodes and routers are stopped (the broker, Redis and the demo producer keep running; the components are started
again at the end). A peer runs two instances (one standby copy of each partition, as the stack keeps one), its
consumer group starting at the input's end. Redis GET/s is measured first, so that a reader can tell a slow day.
Each system's 10,000 keys are written, and once it has run five minutes (``--warm-s``; :mod:`loadtest.peers.steps`):

- **CPU at rest**: the cores it uses keeping up with the demo's input over 30 s, no lookups (freshroute: its
  pipeline, store nodes, routers and Redis; the broker and the demo producer count for none);
- **freshness**: a reading for a key never seen before is produced every 0.25 s for a minute (the Real-time
  pipeline's checkpoint interval) and the system asked for each key not yet seen every 2 ms
  (``loadtest.freshness``'s method, the bench's): produce → visible, p50 / p99;
- **lookups/s**: wrk, one thread and 32 connections for 20 s over the 10,000 keys, twice: its JIT cold, then warm;
  freshroute's gRPC ``Router.Get`` too (h2load, 32 connections of one call each; the peers serve HTTP only);
- **a burst**: 100,000 readings written at once by one producer → caught up (``loadtest.burst``: freshroute's every
  table by ``/v1/tables``' input lag, a peer by its consumer group's committed offsets);
- **the highest rate held**: the input at 1,000, 2,000, 3,500 … readings/s for 60 s each until its lag keeps growing
  (``loadtest.pipeline_rate``, as ``pipeline_max_events_per_s`` judges freshroute);
- **failed while an instance dies**: 100 lookups/s for 25 s through one door (freshroute's router, a peer's first
  instance), kill -9 of another instance 5 s in (a store node; the peer's second instance); every answer that is not
  a 200 counts.

``--smoke`` runs a few seconds of each step for every system (under 3 minutes), to check the harness before the full
run (about 40 minutes). The peers are built the first time: Kafka Streams with Maven (``kafka_streams/pom.xml``, the
broker's Kafka version, Javalin on Jetty), Faust (faust-streaming) in a virtual environment of its own under
``.freshroute/peers``. Ends with the side-by-side table (:mod:`loadtest.peers.report`) and one JSON line.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import orjson

from loadtest.peers.steps import SMOKE, Plan

SYSTEMS = ["freshroute", "kafka-streams", "faust"]


def redis_get_rps(host: str, port: int) -> float:
    """``redis-benchmark -t get`` (50 clients) on the stack's Redis: how fast this machine is today."""
    from loadtest.loadclients import parse_redis_benchmark, redis_benchmark_command

    done = subprocess.run(redis_benchmark_command(host, port, 50, 200_000), capture_output=True, text=True,
                          timeout=120)
    return parse_redis_benchmark(done.stdout)


def main(argv: list[str] | None = None) -> int:
    import argparse
    from dataclasses import replace

    from confluent_kafka import Producer

    from freshroute.topics import describe_topic
    from loadtest.peers.report import table
    from loadtest.peers.steps import measure, wait_serving
    from loadtest.peers.systems import Freshroute, peers
    from pipeline.topics import admin_client
    from tools.local.stack import Stack

    parser = argparse.ArgumentParser(prog="python -m loadtest.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, default=Path(".freshroute/local"), help="the ./dev up stack's home")
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS, help="which to measure")
    parser.add_argument("--smoke", action="store_true", help="a few seconds of each step, to check the harness")
    parser.add_argument("--warm-s", type=float, help="how long each system has run before it is measured "
                                                     f"(default {Plan.warm_s:.0f}; --smoke: 0)")
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else Plan()
    if args.warm_s is not None:
        plan = replace(plan, warm_s=args.warm_s)
    say = lambda msg: print(msg, flush=True)  # noqa: E731

    stack = Stack.load(args.home)
    c = stack.config
    topic = f"{c.topic_prefix}readings"
    partitions = len(describe_topic(admin_client({"bootstrap.servers": c.bootstrap}), topic).partitions)
    logs = Path(tempfile.mkdtemp(prefix="freshroute-peers-"))
    others = peers(c.bootstrap, topic, partitions, logs, args.systems, say)
    producer = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0})
    ours = Freshroute(stack)
    figures: dict[str, dict] = {}
    redis_get = redis_get_rps(c.host, c.redis_port)
    say(f"Redis GET/s (redis-benchmark -t get, 50 clients): {redis_get:,.0f}")

    try:
        if ours.name in args.systems:
            say("freshroute (the peers not running):")
            wait_serving(ours, producer, topic, plan.keys, 120)
            figures[ours.name] = measure(ours, producer, c.bootstrap, topic, plan, say)
        if others:
            say(f"stopping freshroute's {', '.join(ours.serving)} while the peers are measured (logs: {logs})")
            stack.stop(*ours.serving)
        for p in others:
            say(f"{p.name} (freshroute's own components stopped):")
            try:
                p.start()
                wait_serving(p, producer, topic, plan.keys, 180)
                figures[p.name] = measure(p, producer, c.bootstrap, topic, plan, say)
            except (RuntimeError, TimeoutError) as e:  # a peer that does not serve is reported, the rest measured
                say(f"  {p.name} NOT measured: {e} (its logs: {logs})")
            finally:
                p.stop()
    finally:
        # The peers' turn stopped them, and freshroute's failover step killed a store node.
        stopped = [name for name in ours.serving if not stack.components[name].alive()]
        if stopped:
            say(f"starting freshroute's {', '.join(stopped)} again …")
            for name in stopped:
                stack.start(name)

    say("")
    say(f"Redis GET/s {redis_get:,.0f}")
    say(table(figures, plan))
    print(orjson.dumps({"redis_get_rps": round(redis_get), "plan": "smoke" if args.smoke else "full",
                        "systems": figures}).decode())
    return 0

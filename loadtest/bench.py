"""Side-by-side benchmarks against the local stack, all in one run; the last line printed is one JSON object.

Throughput (saturation, the same number of requests in flight for every target):

- ``router_rest_rps``     wrk (1 thread, Lua script rotating keys) → router REST
- ``router_grpc_rps``     h2load (1 thread, gRPC frames over h2c) → router ``Router.Get``
- ``baseline_grpc_rps``   the same h2load → a minimal grpc.aio ``Router.Get`` answering from a dict
- ``direct_store_rps``    a store node's read port (no router), one key per frame, as many in flight
  (``loadtest.readport``: asyncio connections reading answers by their length)
- ``redis_get_rps``       redis-benchmark GET, no pipelining → the stack's Redis
- ``window_rps``          the same wrk → router REST, each request a key's last 6 windows of ``sensor_windows``
  (``/keys/{key}/windows?from=&to=``), interleaved with point gets of the same keys
- ``console_open_rest_rps`` / ``console_closed_rest_rps``: the same wrk with one console open (its polls, from
  ``loadtest.console_poller``) and with none, interleaved; ``console_poll_p99_ms`` its polls under that load, and
  ``console_poll_router_cpu_ms`` the routers' CPU per poll without lookups
- ``transports_rest_rps`` / ``uvicorn_rest_rps`` and ``transports_grpc_rps`` / ``grpcaio_grpc_rps``:
  wrk and h2load → two router processes of the bench's own, one with router/transports and
  one with uvicorn's httptools protocol and grpc.aio alone (the transports must pay for themselves)

Latency at a fixed moderate rate (not saturation), from h2load's per-request log:
``router_grpc_p50/p99_ms``, ``router_rest_p50/p99_ms`` (h2load --h1, keys rotating) and
``direct_store_p50_ms`` (one frame at a time on a store node's read port, ``loadtest.readport``). Freshness (event → visible in a lookup): ``loadtest.freshness``.
Restore: on the stack's broker, a changelog topic of the bench's own (``--restore-records``,
1,000,000 by default, so that a restore takes seconds) with its table spec in a Redis
namespace of its own; a store node process the bench starts in that namespace restores it
into an empty directory (``restore_rps``, changelog → RocksDB, read from the node's log),
against a plain confluent-kafka consumer reading the same changelog (``raw_consume_rps``).
All of it is removed afterwards (``loadtest/restore.py``).

    .venv/bin/freshroute bench            (or: .venv/bin/python -m loadtest.bench)

The load clients are single-threaded C programs so that they take one core at most; on a
2-core machine the server side keeps the other one — the ratios matter more than the figures.
The two figures of each target are measured in alternating runs (``--rounds``, a b b a a b):
throughput as the median of its runs, latency as the percentile of all its samples.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import closing
from pathlib import Path
from typing import Any, Callable

import orjson

from loadtest import loadclients as lc
from loadtest.stats import percentile

FIGURES = ("router_grpc_rps", "router_rest_rps", "direct_store_rps", "baseline_grpc_rps", "redis_get_rps",
           "router_grpc_p50_ms", "router_grpc_p99_ms", "router_rest_p50_ms", "router_rest_p99_ms",
           "direct_store_p50_ms", "freshness_p50_ms", "freshness_p99_ms", "freshness_p99_ms_cold",
           "freshness_p99_ms_loaded", "freshness_p99_ms_windows", "freshness_p99_ms_checkpoint",
           "freshness_max_ms_checkpoint", "restore_rps",
           "raw_consume_rps",
           "client_get_rps", "redis_py_get_rps", "client_get_p50_ms", "redis_py_get_p50_ms",
           "client_get_many_keys_per_s", "redis_py_mget_keys_per_s", "client_sync_get_rps", "redis_py_sync_get_rps",
           "client_sync_get_p50_ms", "redis_py_sync_get_p50_ms", "transports_rest_rps", "uvicorn_rest_rps",
           "transports_grpc_rps", "grpcaio_grpc_rps", "stack_idle_cpu_cores", "broker_idle_cpu_cores",
           "pipeline_idle_cpu_cores",
           "router_rest_p99_ms_busy", "secure_rest_rps", "secure_grpc_rps", "secure_lookup_cpu_us",
           "bad_token_cpu_us", "secure_rest_p99_ms", "secure_rest_p99_ms_flooded", "window_rps",
           "console_open_rest_rps", "console_closed_rest_rps", "console_poll_p99_ms", "console_poll_router_cpu_ms",
           "local_up_s", "pipeline_replay_s", "pipeline_burst_s", "pipeline_max_events_per_s",
           "ryw_wait_p50_ms", "ryw_wait_p99_ms",
           "ryw_stale_reads", "ryw_not_yet_visible", "asof_rest_rps", "asof_p50_ms", "asof_p99_ms",
           "router_cpu_us_per_lookup", "store_node_cpu_us_per_lookup",
           "compiled_rest_rps", "python_rest_rps", "compiled_rest_p99_ms", "python_rest_p99_ms",
           "compiled_router_cpu_us", "python_router_cpu_us", "compiled_grpc_rps", "python_grpc_rps",
           "compiled_grpc_cpu_us", "python_grpc_cpu_us",
           "version_lookups_per_s", "version_lookups_failed", "version_answers_mixed", "version_switch_visible_ms",
           "version_rollback_ms", "version_build_s_per_million", "version_build_cpu_s_per_million")

WINDOW_COUNT = 6  # window_rps: each lookup asks for a key's last this many windows
BUSY_CONNECTIONS = 32  # router_rest_p99_ms_busy: lookups in flight while the pipeline runs
WARM_AFTER_S = 120.0  # freshness_p99_ms: probes start once the stack has run this long
# The console's CPU figure's window: about 60 polls, so that one of /proc's 10 ms ticks moves it by 0.17 ms a poll.
CONSOLE_CPU_WINDOW_S = 30.0
LOADED_RATE = 5000.0  # freshness_p99_ms_loaded: readings/s the bench's own producer adds to the input
FLOOD_RATE, FLOOD_CLIENTS = 4000.0, 8  # secure_rest_p99_ms_flooded: requests/s with bad tokens, beside the probe

# (name, numerator, denominator or None, comparison, limit)
TARGETS = (
    ("router_rest_rps / redis_get_rps", "router_rest_rps", "redis_get_rps", ">=", 0.15),
    ("router_grpc_rps / baseline_grpc_rps", "router_grpc_rps", "baseline_grpc_rps", ">=", 0.75),
    ("router_grpc_p50_ms / direct_store_p50_ms", "router_grpc_p50_ms", "direct_store_p50_ms", "<=", 1.5),
    # Event → visible: right after `local up` returns, on a warm stack, with the input at 5,000/s, a reading in its
    # window, and over a Real-time query's checkpoint (when it pauses). Kafka Streams shows an event in 12 ms at
    # p99 on this machine (docs/benchmarks.md, beside its peers).
    ("freshness_p99_ms_cold", "freshness_p99_ms_cold", None, "<=", 200.0),
    ("freshness_p50_ms", "freshness_p50_ms", None, "<=", 10.0),
    ("freshness_p99_ms", "freshness_p99_ms", None, "<=", 25.0),
    ("freshness_p99_ms_loaded", "freshness_p99_ms_loaded", None, "<=", 100.0),
    ("freshness_p99_ms_windows", "freshness_p99_ms_windows", None, "<=", 500.0),
    ("freshness_p99_ms_checkpoint", "freshness_p99_ms_checkpoint", None, "<=", 50.0),
    ("freshness_max_ms_checkpoint", "freshness_max_ms_checkpoint", None, "<=", 250.0),
    # Processing: 100,000 readings written at once, and the rate held for a minute.
    ("pipeline_burst_s", "pipeline_burst_s", None, "<=", 10.0),
    ("pipeline_max_events_per_s", "pipeline_max_events_per_s", None, ">=", 10000.0),
    # Read your writes: what waiting for a write token costs over a plain lookup, and never a value without it.
    ("ryw_wait_p99_ms", "ryw_wait_p99_ms", None, "<=", 50.0),
    ("ryw_stale_reads", "ryw_stale_reads", None, "<=", 0.0),
    # A table redefined under lookups: built beside, switched to, rolled back; no answer failed or mixed. The rate
    # is the product's (2,000/s) less 5%; visibility is the slowest router's.
    ("version_lookups_per_s", "version_lookups_per_s", None, ">=", 1900.0),
    ("version_lookups_failed", "version_lookups_failed", None, "<=", 0.0),
    ("version_answers_mixed", "version_answers_mixed", None, "<=", 0.0),
    ("version_switch_visible_ms", "version_switch_visible_ms", None, "<=", 1000.0),
    ("version_rollback_ms", "version_rollback_ms", None, "<=", 1000.0),
    ("restore_rps / raw_consume_rps", "restore_rps", "raw_consume_rps", ">=", 0.6),
    ("client_get_rps / redis_py_get_rps", "client_get_rps", "redis_py_get_rps", ">=", 0.7),
    ("client_get_p50_ms / redis_py_get_p50_ms", "client_get_p50_ms", "redis_py_get_p50_ms", "<=", 1.3),
    ("client_get_many_keys_per_s / redis_py_mget_keys_per_s", "client_get_many_keys_per_s",
     "redis_py_mget_keys_per_s", ">=", 0.5),
    # The hand-written transports stay only while they pay for themselves.
    ("transports_rest_rps / uvicorn_rest_rps", "transports_rest_rps", "uvicorn_rest_rps", ">=", 1.0),
    ("transports_grpc_rps / grpcaio_grpc_rps", "transports_grpc_rps", "grpcaio_grpc_rps", ">=", 1.0),
    # The compiled lookup path: twice the Python path's lookups, a tail no longer, a fifth of its router CPU.
    ("compiled_rest_rps / python_rest_rps", "compiled_rest_rps", "python_rest_rps", ">=", 2.0),
    ("compiled_rest_p99_ms / python_rest_p99_ms", "compiled_rest_p99_ms", "python_rest_p99_ms", "<=", 1.0),
    ("compiled_router_cpu_us", "compiled_router_cpu_us", None, "<=", 25.0),
    ("compiled_grpc_rps / python_grpc_rps", "compiled_grpc_rps", "python_grpc_rps", ">=", 2.0),
    # What the stack takes from lookups on a small machine while it only keeps up with its input.
    ("stack_idle_cpu_cores", "stack_idle_cpu_cores", None, "<=", 0.4),
    ("pipeline_idle_cpu_cores", "pipeline_idle_cpu_cores", None, "<=", 0.15),
    ("router_rest_p99_ms_busy", "router_rest_p99_ms_busy", None, "<=", 12.0),
    # TLS and a bearer token on keep-alive connections must cost a few percent, not a factor.
    ("secure_rest_rps / router_rest_rps", "secure_rest_rps", "router_rest_rps", ">=", 0.75),
    ("secure_grpc_rps / router_grpc_rps", "secure_grpc_rps", "router_grpc_rps", ">=", 0.75),
    # A bad token costs a cheap refusal: less CPU than a lookup, and a flood of them leaves lookups' tail as it was.
    ("bad_token_cpu_us / secure_lookup_cpu_us", "bad_token_cpu_us", "secure_lookup_cpu_us", "<=", 1.0),
    ("secure_rest_p99_ms_flooded / secure_rest_p99_ms", "secure_rest_p99_ms_flooded", "secure_rest_p99_ms", "<=",
     1.5),
    # A key's recent windows cost about what a point get does: one range read on one replica.
    ("window_rps / router_rest_rps", "window_rps", "router_rest_rps", ">=", 0.5),
    # A versioned table's lookup as of a time: one seek in the key's run of versions beside a point get.
    ("asof_rest_rps / router_rest_rps", "asof_rest_rps", "router_rest_rps", ">=", 0.8),
    ("asof_p99_ms / router_rest_p99_ms", "asof_p99_ms", "router_rest_p99_ms", "<=", 1.5),
    # An open console costs lookups nothing beyond this machine's noise.
    ("console_open_rest_rps / console_closed_rest_rps", "console_open_rest_rps", "console_closed_rest_rps", ">=",
     0.95),
)

LOAD_CLIENTS = {"asof_rest_rps": "wrk -t1 (Lua: rotating keys, ?as_of=) against a versioned table of the bench's "
                                 "own (loadtest.versioned), interleaved with plain lookups of it",
                "asof_p99_ms": "h2load -t1 --h1 --rps, rotating keys, ?as_of=",
                "router_rest_rps": "wrk -t1 (Lua: rotating keys)",
                "compiled_rest_rps": "wrk -t1 (Lua: rotating keys), a router with the compiled path, interleaved with "
                                     "python_rest_rps",
                "python_rest_rps": "wrk -t1 (Lua: rotating keys), a router whose Python front serves REST",
                "compiled_rest_p99_ms": "wrk -t1 (as compiled_rest_rps), its p99", "python_rest_p99_ms": "wrk -t1 (as "
                "python_rest_rps), its p99", "compiled_router_cpu_us": "wrk -t1 (as compiled_rest_rps): the router "
                "process's /proc CPU over lookups answered",
                "compiled_grpc_rps": "h2load -t1 (gRPC frames, h2c), the router with the compiled path, interleaved "
                                     "with python_grpc_rps",
                "python_grpc_rps": "h2load -t1 (gRPC frames, h2c), a router whose Python front serves gRPC",
                "compiled_grpc_cpu_us": "h2load -t1 (as compiled_grpc_rps): the router process's /proc CPU over calls "
                                        "answered",
                "python_grpc_cpu_us": "h2load -t1 (as python_grpc_rps): the router process's /proc CPU over calls "
                                      "answered", "python_router_cpu_us": "wrk -t1 (as python_rest_rps): the "
                "router process's /proc CPU over lookups answered", "window_rps": "wrk -t1 (Lua: rotating keys, /windows)", "router_grpc_rps": "h2load -t1 (gRPC frames, h2c)",
                "baseline_grpc_rps": "h2load -t1 (gRPC frames, h2c)", "direct_store_rps": "loadtest.readport (asyncio, frames on the read port)",
                "redis_get_rps": "redis-benchmark -P 1",
                "latency": "h2load -t1 --rps (fixed rate) --log-file; REST with --h1 and rotating keys",
                "freshness": "loadtest.freshness (confluent-kafka producer + httpx polling)",
                "restore_rps": "a new store node, empty dir: Σ offsets / window from its log",
                "raw_consume_rps": "confluent-kafka Consumer, all partitions, offset 0 → end",
                "client": "loadtest.clientbench: one Python process per side (asyncio; sync = threads)",
                "transports": "wrk -t1 and h2load -t1 against two router processes of the bench's own",
                "stack_idle_cpu_cores": "none: /proc CPU of every stack process tree (loadtest.footprint)",
                "broker_idle_cpu_cores": "none: /proc CPU of the broker processes in the same window",
                "pipeline_idle_cpu_cores": "none: /proc CPU of the pipeline's process tree in the same window",
                "freshness_windows": "loadtest.freshness, polling each probe key's windows",
                "freshness_checkpoint": "loadtest.freshness, probes spread over one checkpoint interval and more",
                "pipeline_max_events_per_s": "loadtest.pipeline_rate: tools.local.demo at each rate of a ladder, "
                                             "60 s each, every table's input lag from /v1/tables",
                "read_your_writes": "loadtest.read_your_writes: 4 threads, confluent-kafka delivery reports → "
                                    "write_token → httpx REST lookups with after= and without",
                "router_rest_p99_ms_busy": "wrk -t1 -c32 (Lua: rotating keys), saturation, pipeline running",
                "secure": "wrk -t1 (HTTPS) and h2load -t1 (TLS, ALPN h2), a bearer token on every request, against "
                          "as many router processes of the bench's own as the stack runs",
                "secure_lookup_cpu_us": "h2load -t1 --h1 over TLS, saturation; routers' /proc CPU / requests",
                "bad_token_cpu_us": "h2load -t1 --h1 over TLS, saturation, a wrong token; /proc CPU / refusals",
                "secure_rest_p99_ms_flooded": f"h2load --rps probe beside h2load --rps {FLOOD_RATE:g}/s, bad tokens",
                "console_open_rest_rps": "wrk -t1 (Lua: rotating keys) with loadtest.console_poller polling as one "
                                         "open console does (summary and a grid page every 0.5 s)",
                "console_closed_rest_rps": "wrk -t1 (Lua: rotating keys), interleaved with console_open_rest_rps",
                "console_poll_p99_ms": "loadtest.console_poller, under console_open_rest_rps's load",
                "console_poll_router_cpu_ms": "none: the routers' /proc CPU with loadtest.console_poller against "
                                              "without, per poll",
                "version": "loadtest.table_versions: a stack of its own, lookups at a fixed rate over keep-alive "
                           "connections spread evenly over its routers (loadtest.http_load: uvloop, httptools)"}


RESTORE_FIGURES = ("restore_rps", "raw_consume_rps")
VERSION_FIGURES = tuple(k for k in FIGURES if k.startswith("version_"))


def expected_figures(no_restore: bool, restore_only: bool, no_cold: bool = False,
                     no_versions: bool = False) -> list[str]:
    """The figures a run with these options must produce (its exit code says whether it did)."""
    if restore_only:
        return list(RESTORE_FIGURES)
    return [k for k in FIGURES if not (no_restore and k in RESTORE_FIGURES)
            and not (no_cold and k in ("freshness_p99_ms_cold", "local_up_s"))
            and not (no_versions and k in VERSION_FIGURES)]


def evaluate_targets(fig: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target ratio with its value and whether it is met (None when a figure is missing)."""
    out = []
    for name, num, den, op, limit in TARGETS:
        a = fig.get(num)
        b = fig.get(den) if den else 1.0
        value = a / b if a is not None and b not in (None, 0) else None
        met = None if value is None else (value >= limit if op == ">=" else value <= limit)
        out.append({"target": f"{name} {op} {limit:g}", "value": None if value is None else round(value, 3), "met": met})
    return out


def interleaved(rounds: int, a: Callable[[], Any], b: Callable[[], Any]) -> tuple[list[Any], list[Any]]:
    """``a`` and ``b`` run ``rounds`` times each, alternating which goes first (a b, b a, a b, …).

    On a shared machine the load from other processes comes and goes within seconds; pairs
    of runs taken side by side, in both orders, let it weigh on both figures alike.
    """
    xs: list[Any] = []
    ys: list[Any] = []
    for r in range(rounds):
        for run, out in ((a, xs), (b, ys)) if r % 2 == 0 else ((b, ys), (a, xs)):
            out.append(run())
    return xs, ys


def together(rounds: int, a: Callable[[], Any], b: Callable[[], Any]) -> tuple[list[Any], list[Any]]:
    """``a`` and ``b`` run ``rounds`` times each, both at once each time.

    For latency at a low rate: paced runs load the machine little, so the two can share
    every moment of it, and the load from other processes weighs on each sample of both
    sides alike rather than on whichever run it happened to fall in.
    """
    from concurrent.futures import ThreadPoolExecutor

    xs: list[Any] = []
    ys: list[Any] = []
    with ThreadPoolExecutor(2) as pool:
        for _ in range(rounds):
            fa, fb = pool.submit(a), pool.submit(b)
            xs.append(fa.result())
            ys.append(fb.result())
    return xs, ys


def median_of(values: list[float | None]) -> float | None:
    """The median of the runs that produced a figure (None if none did)."""
    import statistics

    got = [v for v in values if v is not None]
    return round(statistics.median(got), 1) if got else None


def medians_into(fig: dict[str, Any], compiled: list[Any], python: list[Any], names: dict[str, str]) -> None:
    """Each side's median of each measured field over its runs that completed, as ``{side}_{name}`` figures."""
    for side, runs in (("compiled", compiled), ("python", python)):
        done = [r for r in runs if r]
        for field, name in names.items():
            fig[f"{side}_{name}"] = median_of([r[field] for r in done])


# --- the steps --------------------------------------------------------------------------------
class Bench:
    """One benchmark run against a loaded local stack."""

    def __init__(self, stack: Any, args: argparse.Namespace, say: Callable[[str], None]) -> None:
        self.stack = stack
        self.a = args
        self.say = say
        self.c = stack.config
        self.work = Path(tempfile.mkdtemp(prefix="freshroute-bench-"))
        self.fig: dict[str, Any] = {k: None for k in FIGURES}
        self.notes: dict[str, Any] = {}
        self.keys: list[str] = []
        self.window_size_ms = 10_000  # the windowed table's slide, read from the router when measured

    # keys ------------------------------------------------------------------------------------
    def find_keys(self) -> None:
        """The leading keys of the keyspace that answer 200 (so that no load client counts 404s)."""
        import httpx

        a = self.a
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=self.c.rest_url, timeout=5) as client:
            while True:
                keys = []
                for i in range(a.keys):
                    key = f"{a.key_prefix}{i}"
                    if client.get(f"/v1/tables/{a.table}/keys/{key}").status_code != 200:
                        break
                    keys.append(key)
                if len(keys) == a.keys or time.monotonic() > deadline:
                    break
                time.sleep(1)
        if not keys:
            raise RuntimeError(f"{a.key_prefix}0 is not served by {self.c.rest_url}: is the demo producer running?")
        self.keys = keys
        self.say(f"  {len(keys)} keys answer: {keys[0]} … {keys[-1]}")

    # gRPC bodies -------------------------------------------------------------------------------
    def grpc_body(self) -> Path:
        """h2load body for Router.Get of one served key (h2load posts the same body every time)."""
        from proto import router_pb2

        req = router_pb2.GetRequest(table=self.a.table, key=self.keys[min(1, len(self.keys) - 1)])
        path = self.work / "router_get.bin"
        path.write_bytes(lc.grpc_frame(req.SerializeToString()))
        return path

    def ok_size(self, address: str, body: Path) -> int:
        """Bytes of one OK Router.Get answer as it travels (message + 5-byte frame header)."""
        import grpc

        from proto import router_pb2, router_pb2_grpc

        req = router_pb2.GetRequest.FromString(lc.grpc_unframe(body.read_bytes())[0])
        with grpc.insecure_channel(address) as ch:
            resp = router_pb2_grpc.RouterStub(ch).Get(req, timeout=5)
        if not resp.found:
            raise RuntimeError(f"Router.Get({req.key}) at {address} found nothing")
        return len(resp.SerializeToString()) + 5

    def store_read(self) -> tuple[str, Any]:
        """(read port address, one-key ReadBatch) of a store node serving the key's partition."""
        import grpc

        from freshroute.keys import partition_for, serialize_key
        from loadtest.readport import read_batch
        from proto import router_pb2, router_pb2_grpc, store_pb2

        key = self.keys[min(1, len(self.keys) - 1)]
        with grpc.insecure_channel(self.c.grpc_address) as ch:
            tables = router_pb2_grpc.RouterStub(ch).ListTables(router_pb2.ListTablesRequest(), timeout=5).tables
        partitions = next(t.partitions for t in tables if t.name == self.a.table)
        batch = store_pb2.ReadBatch(reads=[store_pb2.KeyRead(
            id=1, table=self.a.table, partition=partition_for(serialize_key(key), partitions), key=serialize_key(key),
            bound=store_pb2.ReadBound())])
        found: list[tuple[int, str]] = []
        for name in self.stack.store_node_names():
            comp = self.stack.components.get(name)
            if comp is None or not comp.alive():
                continue
            address = comp.addresses["read_address"]
            try:
                [res] = read_batch(address, batch, timeout_s=5).results
            except OSError:
                continue
            if res.status == store_pb2.OK:
                # The active replica first: that is where the router sends a bound-less read too.
                found.append((0 if res.replica.role == store_pb2.ACTIVE else 1, address))
        if not found:
            raise RuntimeError(f"no store node's read port answers {key} in partition {batch.reads[0].partition}")
        _, address = min(found)
        self.notes["direct_store"] = {"read_port": address, "key": key, "partition": batch.reads[0].partition}
        return address, batch

    def throughput_store(self, address: str, batch: Any) -> float:
        from loadtest.readport import throughput

        conns, in_flight = self.grpc_shape()
        rps = throughput(address, batch, conns, in_flight, self.a.duration)
        self.say(f"  direct_store: {rps:,.0f} req/s ({conns} connections × {in_flight} in flight on the read port)")
        return round(rps, 1)

    def latency_store(self, address: str, batch: Any) -> list[float]:
        from loadtest.readport import latencies

        lat = latencies(address, batch, self.a.latency_rate, self.a.latency_duration)
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        self.say(f"  direct_store_latency: p50 {p50 or 0:.2f} ms  p99 {p99 or 0:.2f} ms ({len(lat)} samples)")
        return lat

    def run_h2load(self, label: str, url: str, body: Path | None, ok_size: int | None, clients: int, streams: int,
                   duration_s: float, rps_per_client: float | None = None, http1: bool = False,
                   input_file: Path | None = None, warm_up_s: float = 1.0,
                   headers: tuple[str, ...] = ()) -> tuple[lc.H2loadResult, list[float]]:
        log = self.work / f"{label}.log" if rps_per_client else None
        if log is not None:
            log.unlink(missing_ok=True)  # h2load appends to its log file: one run's samples only
        cmd = lc.h2load_command(url, clients, streams, duration_s, body_file=body,
                                headers=(*(lc.GRPC_HEADERS if body is not None else ()), *headers),
                                rps_per_client=rps_per_client,
                                log_file=log, http1=http1, warm_up_s=warm_up_s, input_file=input_file)
        res = lc.parse_h2load(lc.run(cmd, duration_s + warm_up_s + 30))
        problems = []
        if res.failed or res.errored or res.timeout or res.status_2xx != res.done:
            problems.append(f"{res.failed} failed, {res.errored} errored, {res.timeout} timeout, "
                            f"{res.status_2xx}/{res.done} 2xx")
        if ok_size and res.done:
            # h2load does not read gRPC trailers; an error answer has no data frame, an OK one
            # has about ok_size bytes, so the bytes received tell how many answers were OK.
            per = res.data_bytes / res.done
            if per < 0.9 * ok_size:
                problems.append(f"{per:.0f} data bytes per answer, an OK answer has ~{ok_size}: gRPC errors")
        if problems:
            self.notes[f"{label}_problems"] = "; ".join(problems)
            self.say(f"  ! {label}: {'; '.join(problems)}")
        latencies = lc.parse_h2load_log(log)[0] if log else []
        return res, latencies

    # throughput --------------------------------------------------------------------------------
    def grpc_shape(self) -> tuple[int, int]:
        """(connections, streams per connection) giving ``concurrency`` requests in flight."""
        conns = max(1, min(self.a.grpc_connections, self.a.concurrency))
        return conns, math.ceil(self.a.concurrency / conns)

    def throughput_grpc(self, label: str, url: str, body: Path, ok_size: int, headers: tuple[str, ...] = ()) -> float:
        conns, streams = self.grpc_shape()
        res, _ = self.run_h2load(label, url, body, ok_size, conns, streams, self.a.duration, headers=headers)
        self.say(f"  {label}: {res.rps:,.0f} req/s ({res.succeeded} answers in {self.a.duration:g}s, "
                 f"{conns} conns × {streams} streams)")
        return round(res.rps, 1)

    def throughput_rest(self, label: str = "router_rest", url: str | None = None, headers: tuple[str, ...] = (),
                        table: str | None = None, query: str = "") -> float:
        cmd = lc.wrk_command((url or self.c.rest_url) + "/", self.a.concurrency, self.a.duration, headers=headers)
        out = lc.parse_wrk(lc.run(cmd, self.a.duration + 30, lc.wrk_env(table or self.a.table, self.a.key_prefix,
                                                                        len(self.keys), query)))
        if out["errors"]:
            self.notes[f"{label}_problems"] = f"{out['errors']} errors (non-2xx or socket) of {out['requests']}"
            self.say(f"  ! {label}: {self.notes[f'{label}_problems']}")
        self.say(f"  {label}: {out['rps']:,.0f} req/s ({out['requests']} requests, {self.a.concurrency} connections)")
        return round(out["rps"], 1)

    def console_open_vs_closed(self) -> None:
        """REST lookups with one console open (its polls, see loadtest.console_poller) and with none, interleaved."""
        from loadtest.console_poller import ConsolePoller

        polls: list[float] = []

        def opened() -> float:
            with ConsolePoller(self.c.rest_url, max_s=self.a.duration + 60) as console:
                rps = self.throughput_rest("console_open_rest")
            polls.extend(console.poll_ms)
            if console.failures:
                raise RuntimeError(f"{console.failures} of the console's {console.polls + console.failures} polls failed")
            return rps

        with_console, without = self.paired("console_open_rest", opened, "console_closed_rest",
                                            lambda: self.throughput_rest("console_closed_rest"))
        self.fig["console_open_rest_rps"], self.fig["console_closed_rest_rps"] = median_of(with_console), \
            median_of(without)
        p99 = percentile(polls, 99)
        self.fig["console_poll_p99_ms"] = round(p99, 1) if p99 is not None else None
        self.say(f"  a console poll (summary + grid page) under that load: p99 {self.fig['console_poll_p99_ms']} ms "
                 f"over {len(polls)} polls")
        # What a poll costs the routers, without lookups: their CPU over a window with a console open, less the
        # same window's without one, per poll.
        from loadtest.footprint import tree_cpu_seconds

        roots = {name: comp.pid for name, comp in self.stack.components.items() if comp.role == "router"}
        window_s = CONSOLE_CPU_WINDOW_S

        def router_cpu(console: bool) -> tuple[float, int]:
            before = sum(tree_cpu_seconds(roots).values())
            if console:
                with ConsolePoller(self.c.rest_url, max_s=window_s + 30) as poller:
                    time.sleep(window_s)
                return sum(tree_cpu_seconds(roots).values()) - before, poller.polls
            time.sleep(window_s)
            return sum(tree_cpu_seconds(roots).values()) - before, 0

        with_polls, idle = self.paired("console_router_cpu", lambda: router_cpu(True), "idle_router_cpu",
                                       lambda: router_cpu(False), record=False)
        per_poll = [(opened[0] - closed[0]) / opened[1] * 1000 for opened, closed in zip(with_polls, idle)
                    if opened and closed and opened[1]]
        self.fig["console_poll_router_cpu_ms"] = round(median_of(per_poll), 2) if per_poll else None
        self.say(f"  router CPU per console poll (no lookups): {self.fig['console_poll_router_cpu_ms']} ms")

    def throughput_windows(self) -> float:
        """Saturation throughput of window lookups: each a key's last WINDOW_COUNT windows of the windowed table."""
        a = self.a
        size = self.window_size_ms
        to = (int(time.time() * 1000) // size + 1) * size
        query = f"from={to - WINDOW_COUNT * size}&to={to}"
        cmd = lc.wrk_command(self.c.rest_url + "/", a.concurrency, a.duration)
        out = lc.parse_wrk(lc.run(cmd, a.duration + 30, lc.wrk_env(a.window_table, a.key_prefix, len(self.keys),
                                                                   query, "/windows")))
        if out["errors"]:
            self.notes["window_problems"] = f"{out['errors']} errors (non-2xx or socket) of {out['requests']}"
            self.say(f"  ! window: {self.notes['window_problems']}")
        self.say(f"  window: {out['rps']:,.0f} req/s ({out['requests']} requests of {WINDOW_COUNT} windows, "
                 f"{a.concurrency} connections)")
        return round(out["rps"], 1)

    def windows_vs_points(self) -> None:
        """Window lookups against point gets of the same keys, interleaved; the target is against router_rest_rps."""
        import httpx

        spec = next((t for t in httpx.get(f"{self.c.rest_url}/v1/tables", timeout=5).json()["tables"]
                     if t["name"] == self.a.window_table), None)
        if spec is None or "window" not in spec:
            raise RuntimeError(f"the stack serves no windowed table {self.a.window_table!r}")
        self.window_size_ms = int(spec["window"]["slide_ms"])
        points, windows = self.paired("window_point_rest", lambda: self.throughput_rest("window_point_rest"), "window",
                                      self.throughput_windows)
        self.fig["window_rps"] = median_of(windows)
        self.notes["window_point_rest_rps"] = median_of(points)

    def versioned_vs_points(self) -> None:
        """Lookups as of a time on a versioned table of the bench's own (``loadtest.versioned``: each key with 10
        versions) against plain lookups of the same table and keys, interleaved: throughput (wrk) and latency at the
        fixed rate (h2load --h1). The targets are against router_rest_rps and router_rest_p99_ms."""
        from loadtest.versioned import VersionedTable

        with VersionedTable(self.c, self.keys) as table:
            query = f"as_of={table.as_of_ms}"
            asof, points = self.paired("asof_rest", lambda: self.throughput_rest("asof_rest", table=table.name,
                                                                                 query=query),
                                       "asof_point_rest", lambda: self.throughput_rest("asof_point_rest",
                                                                                       table=table.name))
            self.fig["asof_rest_rps"], self.notes["asof_point_rest_rps"] = median_of(asof), median_of(points)
            base = f"{self.c.rest_url}/v1/tables/{table.name}/keys/"
            as_of_uris, point_uris = self.work / "asof_uris.txt", self.work / "asof_point_uris.txt"
            as_of_uris.write_text("".join(f"{base}{k}?{query}\n" for k in self.keys))
            point_uris.write_text("".join(f"{base}{k}\n" for k in self.keys))
            asof_lat, point_lat = self.paired(
                "asof_latency", lambda: self.latency_samples("asof_latency", "", None, None, http1=True,
                                                             input_file=as_of_uris),
                "asof_point_latency", lambda: self.latency_samples("asof_point_latency", "", None, None, http1=True,
                                                                   input_file=point_uris), record=False)
            self.fig["asof_p50_ms"], self.fig["asof_p99_ms"] = self.p50_p99([x for r in asof_lat if r for x in r])
            self.notes["asof_point_p50_ms"], self.notes["asof_point_p99_ms"] = self.p50_p99(
                [x for r in point_lat if r for x in r])

    def rest_p99_busy(self) -> float | None:
        """REST p99 (ms) at saturation with BUSY_CONNECTIONS connections, the pipeline running at the
        demo rate: the tail latency the stack's own CPU use costs lookups on a small machine."""
        p99s = []
        for _ in range(self.a.rounds):
            cmd = lc.wrk_command(self.c.rest_url + "/", BUSY_CONNECTIONS, self.a.duration)
            out = lc.parse_wrk(lc.run(cmd, self.a.duration + 30,
                                      lc.wrk_env(self.a.table, self.a.key_prefix, len(self.keys))))
            if out["errors"]:
                self.notes["router_rest_busy_problems"] = f"{out['errors']} errors of {out['requests']}"
                self.say(f"  ! router_rest_busy: {self.notes['router_rest_busy_problems']}")
            p99s.append(out["p99_us"] / 1000)
            self.say(f"  router_rest_busy: p99 {out['p99_us'] / 1000:.2f} ms, p50 {out['p50_us'] / 1000:.2f} ms "
                     f"at {out['rps']:,.0f} req/s")
        return median_of(p99s)

    def throughput_redis(self) -> float:
        host, port = self.c.host, self.c.redis_port
        import redis

        redis.Redis(host=host, port=port, socket_timeout=2).ping()  # redis-benchmark spins on a dead server
        n = self.a.redis_requests
        rps = lc.parse_redis_benchmark(lc.run(lc.redis_benchmark_command(host, port, self.a.concurrency, n), 120))
        self.say(f"  redis GET: {rps:,.0f} req/s ({n} requests, {self.a.concurrency} clients)")
        return round(rps, 1)

    # latency at a fixed rate ----------------------------------------------------------------------
    def latency_samples(self, label: str, url: str, body: Path | None, ok_size: int | None, http1: bool = False,
                        input_file: Path | None = None, headers: tuple[str, ...] = ()) -> list[float]:
        """Latencies (ms) of one run at the fixed rate."""
        clients = max(1, self.a.latency_clients)
        res, lat = self.run_h2load(label, url, body, ok_size, clients, 1, self.a.latency_duration,
                                   rps_per_client=self.a.latency_rate / clients, http1=http1, input_file=input_file,
                                   headers=headers)
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        self.say(f"  {label}: p50 {p50 or 0:.2f} ms  p99 {p99 or 0:.2f} ms at {res.rps:,.0f} req/s ({len(lat)} samples)")
        return lat

    @staticmethod
    def p50_p99(latencies: list[float]) -> tuple[float | None, float | None]:
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        return (round(p50, 3) if p50 is not None else None), (round(p99, 3) if p99 is not None else None)

    def paired(self, label_a: str, run_a: Callable[[], Any], label_b: str, run_b: Callable[[], Any],
               record: bool = True, at_once: bool = False) -> tuple[list[Any], list[Any]]:
        """The runs of a target's two figures, interleaved over ``--rounds`` (``at_once``: each round's two
        runs at the same time, see :func:`together`); a failed run counts as None.

        ``record`` keeps every run's figure in the notes (``rounds``), to show the spread.
        """

        def guarded(label: str, run: Callable[[], Any]) -> Callable[[], Any]:
            def call() -> Any:
                try:
                    return run()
                except Exception as e:  # noqa: BLE001 - one failed run must not lose the other rounds
                    self.say(f"  ! {label} failed: {type(e).__name__}: {e}")
                    self.notes.setdefault("errors", {})[label] = f"{type(e).__name__}: {e}"
                    return None
            return call

        xs, ys = (together if at_once else interleaved)(max(1, self.a.rounds), guarded(label_a, run_a),
                                                         guarded(label_b, run_b))
        if record:
            self.notes.setdefault("rounds", {}).update({label_a: xs, label_b: ys})
        return xs, ys

    # the hand-written transports against the libraries they stand in for -------------------------
    def transports_vs_libraries(self, body: Path, ok_size: int) -> None:
        """Two router processes of the bench's own over the stack's metadata, one with router/transports
        (the HTTP/1.1 lookup path, the HTTP/2 gRPC front) and one with uvicorn's httptools protocol and
        grpc.aio alone: REST and gRPC throughput, side by side."""
        fig = self.fig
        with_transports = self.start_router("transports", transports=True)
        try:
            with_libraries = self.start_router("libraries", transports=False)
            try:
                (t_rest, t_grpc), (l_rest, l_grpc) = with_transports[1:], with_libraries[1:]
                t, lib = self.paired("transports_rest", lambda: self.throughput_rest("transports_rest", t_rest),
                                     "uvicorn_rest", lambda: self.throughput_rest("uvicorn_rest", l_rest))
                fig["transports_rest_rps"], fig["uvicorn_rest_rps"] = median_of(t), median_of(lib)
                t, lib = self.paired(
                    "transports_grpc", lambda: self.throughput_grpc("transports_grpc", t_grpc, body, ok_size),
                    "grpcaio_grpc", lambda: self.throughput_grpc("grpcaio_grpc", l_grpc, body, ok_size))
                fig["transports_grpc_rps"], fig["grpcaio_grpc_rps"] = median_of(t), median_of(lib)
            finally:
                lc.stop_process(with_libraries[0])
        finally:
            lc.stop_process(with_transports[0])

    def start_router(self, name: str, transports: bool,
                     data_plane: str = "python") -> tuple[subprocess.Popen, str, str]:
        """A router process over the stack's Redis namespace on ports of its own: (process, REST url, gRPC Get url).
        Its REST port is the Python front's unless ``data_plane`` is "compiled"."""
        procs, rest, grpc_url = self.start_routers(name, {"FRESHROUTE_GRPC_FRONT": str(transports).lower(),
                                                          "FRESHROUTE_REST_FAST_PATH": str(transports).lower(),
                                                          "FRESHROUTE_DATA_PLANE": data_plane})
        return procs[0], rest, grpc_url

    def compiled_vs_python(self) -> None:
        """A router process with the compiled lookup path against one whose Python front serves REST (the path
        before it), wrk's runs interleaved: lookups/s and p99 at the bench's connections, and each process's CPU
        per lookup from /proc over its runs."""
        from loadtest.footprint import tree_cpu_seconds

        fig = self.fig
        compiled = self.start_router("compiled", transports=True, data_plane="compiled")
        try:
            python = self.start_router("python", transports=True)
            try:
                def run(label: str, router: tuple[subprocess.Popen, str, str]) -> Callable[[], dict[str, float]]:
                    def measured() -> dict[str, float]:
                        before = tree_cpu_seconds({label: router[0].pid})[label]
                        cmd = lc.wrk_command(router[1] + "/", self.a.concurrency, self.a.duration)
                        out = lc.parse_wrk(lc.run(cmd, self.a.duration + 30, lc.wrk_env(
                            self.a.table, self.a.key_prefix, len(self.keys))))
                        used = tree_cpu_seconds({label: router[0].pid})[label] - before
                        answered = out["requests"] - out["errors"]
                        if out["errors"]:
                            self.notes[f"{label}_problems"] = f"{out['errors']} errors of {out['requests']}"
                        self.say(f"  {label}: {out['rps']:,.0f} req/s, p99 {out['p99_us'] / 1000:.2f} ms, "
                                 f"{used / max(answered, 1) * 1e6:.1f} µs of router CPU per lookup")
                        return {"rps": round(out["rps"], 1), "p99_ms": out["p99_us"] / 1000,
                                "cpu_us": round(used / max(answered, 1) * 1e6, 1)}
                    return measured

                xs, ys = self.paired("compiled_rest", run("compiled_rest", compiled), "python_rest",
                                     run("python_rest", python))
                medians_into(fig, xs, ys, {"rps": "rest_rps", "p99_ms": "rest_p99_ms", "cpu_us": "router_cpu_us"})
                body = self.grpc_body()
                ok_size = self.ok_size(compiled[2].split("//", 1)[1].split("/", 1)[0], body)

                def grpc_run(label: str, router: tuple[subprocess.Popen, str, str]) -> Callable[[], dict[str, float]]:
                    def measured() -> dict[str, float]:
                        before = tree_cpu_seconds({label: router[0].pid})[label]
                        conns, streams = self.grpc_shape()
                        res, _ = self.run_h2load(label, router[2], body, ok_size, conns, streams, self.a.duration)
                        used = tree_cpu_seconds({label: router[0].pid})[label] - before
                        cpu_us = used / max(res.succeeded, 1) * 1e6
                        self.say(f"  {label}: {res.rps:,.0f} calls/s, {cpu_us:.1f} µs of router CPU per call")
                        return {"rps": round(res.rps, 1), "cpu_us": round(cpu_us, 1)}
                    return measured

                if ok_size:
                    xs, ys = self.paired("compiled_grpc", grpc_run("compiled_grpc", compiled), "python_grpc",
                                         grpc_run("python_grpc", python))
                    medians_into(fig, xs, ys, {"rps": "grpc_rps", "cpu_us": "grpc_cpu_us"})
            finally:
                lc.stop_process(python[0])
        finally:
            lc.stop_process(compiled[0])

    def start_routers(self, name: str, env_extra: dict[str, str], count: int = 1, scheme: str = "http",
                      headers: dict[str, str] | None = None,
                      verify: Any = True) -> tuple[list[subprocess.Popen], str, str]:
        """``count`` router processes sharing ports of their own (SO_REUSEPORT) over the stack's Redis namespace:
        (processes, REST url, gRPC Get url), once one answers a lookup."""
        import httpx

        from tools.local.services import free_port

        c = self.c
        rest_port, grpc_port = free_port(), free_port()
        env = {"FRESHROUTE_REDIS_URL": c.redis_url, "FRESHROUTE_NAMESPACE": c.namespace, "FRESHROUTE_HOST": "127.0.0.1",
               "FRESHROUTE_REST_PORT": str(rest_port), "FRESHROUTE_GRPC_PORT": str(grpc_port),
               "FRESHROUTE_REUSE_PORT": str(count > 1).lower(), "FRESHROUTE_LOG_LEVEL": "WARNING", **env_extra}
        procs = []
        for i in range(count):
            log = open(self.work / f"router-{name}-{i}.log", "w+")
            # A session of its own, as every stack component has: under the kernel's autogroup scheduling
            # the router then gets a CPU share of its own, not one shared with the bench's load clients.
            procs.append(subprocess.Popen([sys.executable, "-m", "router"], env={**os.environ, **env}, stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        rest = f"{scheme}://127.0.0.1:{rest_port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            try:
                if httpx.get(f"{rest}/v1/tables/{self.a.table}/keys/{self.keys[0]}", timeout=1, headers=headers,
                             verify=verify).status_code == 200:
                    time.sleep(1.0 if count > 1 else 0)  # the others bind while the first answers
                    return procs, rest, f"{scheme}://127.0.0.1:{grpc_port}/freshroute.v1.Router/Get"
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        for p in procs:
            lc.stop_process(p)
        tails = [(self.work / f"router-{name}-{i}.log").read_text()[-500:] for i in range(count)]
        raise RuntimeError(f"router ({name}) did not answer a lookup: {tails}")

    def secure_vs_plain(self, body: Path, ok_size: int) -> None:
        """Routers with TLS and a bearer token, as many processes as the stack's, against the stack's own
        plain routers, interleaved: what security costs a lookup over keep-alive connections."""
        import ssl

        from tools.local.certs import issue, make_ca
        from router.auth import token_hash

        pki = self.work / "pki"
        ca = make_ca(pki)
        server = issue(ca, pki, "router", "bench router", hosts=("127.0.0.1",))
        token = "bench-" + os.urandom(12).hex()
        auth = pki / "auth.json"
        # A rate far above what the bench reaches: every read is counted through the shared buckets in Redis.
        auth.write_text(orjson.dumps({"principals": [
            {"name": "bench", "token_sha256": token_hash(token), "tables": [self.a.table],
             "rate": {"reads_per_s": 10_000_000, "burst": 10_000_000}}]}).decode())
        env = {"FRESHROUTE_AUTH_FILE": str(auth), "FRESHROUTE_TLS_CERT": str(server.cert),
               "FRESHROUTE_TLS_KEY": str(server.key)}
        bearer, grpc_bearer = f"Authorization: Bearer {token}", f"authorization: Bearer {token}"
        procs, rest, grpc_url = self.start_routers("secure", env, count=self.c.routers, scheme="https",
                                                   headers={"authorization": f"Bearer {token}"},
                                                   verify=ssl.create_default_context(cafile=str(ca.cert)))
        fig = self.fig
        try:
            secure, plain = self.paired("secure_rest", lambda: self.throughput_rest("secure_rest", rest, (bearer,)),
                                        "plain_rest", lambda: self.throughput_rest("plain_rest"))
            fig["secure_rest_rps"], self.notes["plain_rest_rps_interleaved"] = median_of(secure), median_of(plain)
            plain_grpc = f"http://{self.c.grpc_address}/freshroute.v1.Router/Get"
            secure, plain = self.paired(
                "secure_grpc", lambda: self.throughput_grpc("secure_grpc", grpc_url, body, ok_size, (grpc_bearer,)),
                "plain_grpc", lambda: self.throughput_grpc("plain_grpc", plain_grpc, body, ok_size))
            fig["secure_grpc_rps"], self.notes["plain_grpc_rps_interleaved"] = median_of(secure), median_of(plain)
            self.bad_token_flood(rest, token, [p.pid for p in procs])
        finally:
            for p in procs:
                lc.stop_process(p)

    def bad_token_flood(self, rest: str, token: str, pids: list[int]) -> None:
        """What bad tokens cost the secured routers: their CPU per refusal against per authorised lookup (each at
        saturation), and authorised lookups' latency at the fixed rate alone and beside a flood of bad tokens."""
        from loadtest.footprint import tree_cpu_seconds

        a, fig = self.a, self.fig
        uris = self.work / "secure_uris.txt"
        uris.write_text("".join(f"{rest}/v1/tables/{a.table}/keys/{k}\n" for k in self.keys))
        good, bad = (f"authorization: Bearer {token}",), (f"authorization: Bearer wrong-{token}",)
        roots = {str(pid): pid for pid in pids}

        def cpu_us_per_request(label: str, headers: tuple[str, ...], status: str) -> float | None:
            before = sum(tree_cpu_seconds(roots).values())
            cmd = lc.h2load_command("", a.concurrency, 1, a.duration, headers=headers, http1=True, input_file=uris)
            res = lc.parse_h2load(lc.run(cmd, a.duration + 30))
            used = sum(tree_cpu_seconds(roots).values()) - before
            answered = res.status_2xx if status == "2xx" else res.status_4xx
            if answered != res.done or not res.done:
                self.notes[f"{label}_problems"] = f"{answered} of {res.done} answers {status}"
                self.say(f"  ! {label}: {self.notes[f'{label}_problems']}")
            us = used / max(1, res.done) * 1e6
            self.say(f"  {label}: {us:,.1f} µs of router CPU per request ({res.done} at {res.rps:,.0f} req/s, "
                     f"{status})")
            return round(us, 1)

        looked, refused = self.paired("secure_lookup_cpu", lambda: cpu_us_per_request("secure_lookup_cpu", good, "2xx"),
                                      "bad_token_cpu", lambda: cpu_us_per_request("bad_token_cpu", bad, "4xx"))
        fig["secure_lookup_cpu_us"], fig["bad_token_cpu_us"] = median_of(looked), median_of(refused)

        def probe(flooded: bool) -> list[float]:
            label = "secure_rest_latency" + ("_flooded" if flooded else "")
            flood = None
            if flooded:
                cmd = lc.h2load_command("", FLOOD_CLIENTS, 1, a.latency_duration + 2, headers=bad, http1=True,
                                        rps_per_client=FLOOD_RATE / FLOOD_CLIENTS, input_file=uris)
                flood = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                return self.latency_samples(label, "", None, None, http1=True, input_file=uris, headers=good)
            finally:
                if flood is not None:
                    out, _ = flood.communicate(timeout=a.latency_duration + 60)
                    res = lc.parse_h2load(out)
                    self.notes.setdefault("bad_token_flood", []).append(
                        {"rps": round(res.rps), "refused_401": res.status_4xx, "done": res.done})

        steady, flooded = self.paired("secure_rest_latency", lambda: probe(False),
                                      "secure_rest_latency_flooded", lambda: probe(True), record=False)
        fig["secure_rest_p99_ms"] = self.p50_p99([x for r in steady if r for x in r])[1]
        fig["secure_rest_p99_ms_flooded"] = self.p50_p99([x for r in flooded if r for x in r])[1]

    # the client against redis-py ------------------------------------------------------------------
    def client_vs_redis_py(self) -> None:
        """freshroute.client against redis-py on the stack's Redis, side by side: the same process model and
        concurrency, values of the same size (Redis keys of the bench's own, removed afterwards)."""
        import redis

        from freshroute.client import Client
        from loadtest.clientbench import REDIS_PREFIX

        a, c, fig = self.a, self.c, self.fig
        with Client(redis_url=c.redis_url, namespace=c.namespace) as client:
            size = len(orjson.dumps(client.get(a.table, self.keys[0]).value))
        r = redis.Redis.from_url(c.redis_url)
        names = [f"{REDIS_PREFIX}{i}" for i in range(len(self.keys))]
        r.mset({k: b"x" * size for k in names})
        try:
            def side(name: str, measure: str, model: str = "async", concurrency: int | None = None) -> Callable[[], Any]:
                def run() -> dict[str, Any]:
                    cmd = [sys.executable, "-m", "loadtest.clientbench", "--side", name, "--measure", measure,
                           "--model", model, "--redis-url", c.redis_url, "--namespace", c.namespace,
                           "--table", a.table, "--key-prefix", a.key_prefix, "--keys", str(len(self.keys)),
                           "--concurrency", str(concurrency or a.client_concurrency), "--rate", str(a.latency_rate),
                           "--duration", str(a.latency_duration if measure == "latency" else a.duration)]
                    return orjson.loads(lc.run(cmd, a.duration + a.latency_duration + 60).strip().splitlines()[-1])
                return run

            def rates(label: str, xs: list[Any]) -> float | None:
                got = median_of([x["rate"] if x else None for x in xs])
                self.say(f"  {label}: {got or 0:,.0f}/s (runs {[x and x['rate'] for x in xs]})")
                return got

            def p50(label: str, xs: list[Any]) -> float | None:
                lat = [v for x in xs if x for v in x["latencies_ms"]]
                p50_, p99_ = self.p50_p99(lat)
                self.say(f"  {label}: p50 {p50_} ms  p99 {p99_} ms ({len(lat)} samples)")
                return p50_

            conc = a.client_concurrency
            self.say(f"  asyncio, one process per side, {conc} in flight:")
            cl, rd = self.paired("client_get", side("client", "rps"), "redis_py_get", side("redis", "rps"))
            fig["client_get_rps"], fig["redis_py_get_rps"] = rates("client get", cl), rates("redis-py GET", rd)
            cl, rd = self.paired("client_get_many", side("client", "many"), "redis_py_mget", side("redis", "many"))
            fig["client_get_many_keys_per_s"] = rates("client get_many (100 keys), keys", cl)
            fig["redis_py_mget_keys_per_s"] = rates("redis-py MGET (100 keys), keys", rd)
            cl, rd = self.paired("client_latency", side("client", "latency"), "redis_py_latency",
                                 side("redis", "latency"), record=False, at_once=True)
            fig["client_get_p50_ms"], fig["redis_py_get_p50_ms"] = p50("client get", cl), p50("redis-py GET", rd)
            self.say("  synchronous, one thread per side:")
            cl, rd = self.paired("client_sync_get", side("client", "rps", "sync", 1), "redis_py_sync_get",
                                 side("redis", "rps", "sync", 1))
            fig["client_sync_get_rps"], fig["redis_py_sync_get_rps"] = rates("client get", cl), rates("redis-py GET", rd)
            cl, rd = self.paired("client_sync_latency", side("client", "latency", "sync", 1), "redis_py_sync_latency",
                                 side("redis", "latency", "sync", 1), record=False, at_once=True)
            fig["client_sync_get_p50_ms"] = p50("client get", cl)
            fig["redis_py_sync_get_p50_ms"] = p50("redis-py GET", rd)
        finally:
            r.delete(*names)

    # freshness, restore, raw consume --------------------------------------------------------------
    def lookup_stages(self) -> None:
        """The routers' and the store nodes' CPU per lookup under wrk's saturation, by stage (loadtest.lookup_stages)."""
        from loadtest.footprint import stack_roots
        from loadtest.lookup_stages import measure, report

        st, a = self.stack, self.a
        pid = stack_roots(st)
        out = measure(st.config.rest_url, {n: pid[n] for n in st.router_names() if n in pid},
                      {n: pid[n] for n in st.store_node_names() if n in pid}, a.table, a.key_prefix, len(self.keys),
                      a.duration, a.concurrency, work=self.work / "stages")
        for role in ("router", "store_node"):
            self.fig[f"{role}_cpu_us_per_lookup"] = out[role]["cpu_us_per_lookup"]
            self.notes[f"{role}_stages_us_per_lookup"] = out[role]["stages_us"]
        self.say("  " + report(out).replace("\n", "\n  "))

    def footprint(self) -> None:
        """CPU of every process of the stack while it only keeps up with its input (no lookups)."""
        from loadtest.footprint import measure, stack_roots

        self.wait_warm()
        batches_before = self._pipeline_batches()
        fp = measure(stack_roots(self.stack), self.a.idle_seconds)
        batches = self._pipeline_batches() - batches_before
        self.fig["stack_idle_cpu_cores"] = round(fp.total_cores, 3)
        self.notes["stack_idle_cpu_cores_by_component"] = {n: round(c, 3) for n, c in fp.cores.items()}
        self.fig["broker_idle_cpu_cores"] = round(sum(c for n, c in fp.cores.items()
                                                      if n in self.stack.broker_names()), 3)
        self.fig["pipeline_idle_cpu_cores"] = round(fp.cores.get("pipeline", 0.0), 3)
        self.say(f"  stack: {fp.total_cores:.3f} cores ({fp.describe()})")
        if batches > 0 and self.stack.config.pipeline_mode == "microbatch":
            pipeline_ms = 1000.0 * fp.cores.get("pipeline", 0.0) * self.a.idle_seconds
            self.notes["pipeline_batch_cpu_ms"] = round(pipeline_ms / batches, 1)
            self.say(f"  {batches} micro-batches, {self.notes['pipeline_batch_cpu_ms']} ms of pipeline CPU each")

    def _pipeline_batches(self) -> int:
        """Micro-batches the pipeline's queries have run so far: the sum over queries of their last batch id (the
        tables of a shared query report the same batches)."""
        from prometheus_client.parser import text_string_to_metric_families

        from pipeline.checkpoints import query_checkpoint_of

        url = self.stack.components["pipeline"].addresses["metrics"]
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        checkpoints = self.c.home / "pipeline" / "checkpoints"
        by_query: dict[str, float] = {}
        for f in text_string_to_metric_families(text):
            for s in f.samples:
                if s.name == "freshroute_pipeline_batch_id":
                    query = query_checkpoint_of(checkpoints, s.labels["table"]).name
                    by_query[query] = max(by_query.get(query, 0.0), s.value)
        return int(sum(by_query.values()))

    def restart_cold(self) -> None:
        """Stop the stack and start it again as ``local up`` does: the cold figure's probes start when it returns."""
        from tools.local.stack import Stack

        self.say("  stopping the local stack and starting it again (--no-cold keeps it running)")
        self.stack.down()
        self.stack = Stack(self.stack.config, lambda m: self.say(f"    {m}"))
        started = time.monotonic()
        self.stack.up()
        self.fig["local_up_s"] = round(time.monotonic() - started, 1)
        self.say(f"  local up: ready for lookups in {self.fig['local_up_s']} s")
        self.fig["freshness_p99_ms_cold"] = self._freshness("cold", "from the moment `local up` returned")[1]

    def _age_s(self, component: str) -> float | None:
        """Seconds since the stack's ``component`` started; None when it is not running."""
        from freshroute.proc import process_age_s

        c = self.stack.components[component]
        return process_age_s(c.pid) if c.pid else None

    def wait_warm(self) -> None:
        """Until the pipeline has run ``WARM_AFTER_S``: the warm figures are a stack's usual, not its first minutes'."""
        age = self._age_s("pipeline")
        wait = WARM_AFTER_S - age if age is not None else 0.0
        if wait > 0:
            self.say(f"  the pipeline started {WARM_AFTER_S - wait:.0f}s ago: waiting {wait:.0f}s for a warm stack")
            time.sleep(wait)

    def freshness(self) -> tuple[float | None, float | None]:
        """Event → visible on a warm stack, the probes spread evenly over one checkpoint interval: a run shorter
        than that met a checkpoint's pause or not by chance, and its p99 with it."""
        self.wait_warm()
        span_s = checkpoint_interval_s()
        return self._freshness("warm", f"probes over {span_s:.0f}s", spacing_s=span_s / self.a.freshness_probes)

    def freshness_windows(self) -> None:
        """Event → visible in its window: a reading for a new key, until the windowed table serves its window; the
        probes over one checkpoint interval, as the warm figure's."""
        span_s = checkpoint_interval_s()
        self.fig["freshness_p99_ms_windows"] = self._freshness(
            "windows", f"a reading → its window, probes over {span_s:.0f}s", self.a.window_table,
            spacing_s=span_s / self.a.freshness_probes)[1]

    def freshness_checkpoint(self) -> None:
        """Event → visible with probes spread over more than one checkpoint interval of the Real-time pipeline (or,
        in micro-batches, over as long), so that some of them meet a checkpoint's pause."""
        span_s = 1.2 * checkpoint_interval_s()
        url = self.stack.components["pipeline"].addresses.get("metrics")
        with CheckpointPauses(url) as pauses:
            self.fig["freshness_p99_ms_checkpoint"] = self._freshness(
                "checkpoint", f"probes over {span_s:.0f}s", spacing_s=span_s / self.a.freshness_probes)[1]
        self.fig["freshness_max_ms_checkpoint"] = self.notes["freshness_checkpoint"]["freshness_max_ms"]
        self.notes["checkpoint_pauses_ms"] = pauses.seen
        if pauses.seen:
            self.say("    the checkpoints meanwhile stopped processing for " + ", ".join(
                f"{table} {ms} ms" for table, ms in sorted(pauses.seen.items())))

    def _freshness(self, kind: str, detail: str = "", table: str | None = None,
                   spacing_s: float = 0.25) -> tuple[float | None, float | None]:
        from loadtest.freshness import measure

        windowed = table is not None and table != self.a.table
        # Where a probe's time goes, by hop, from the table's changelog (a windowed table's rows are its windows').
        changelog = None if windowed else f"{self.c.topic_prefix}{self.a.table}-changelog"
        out = self._observed(lambda: asyncio.run(measure(
            self.c.bootstrap, self.c.rest_url, f"{self.c.topic_prefix}readings", table or self.a.table,
            probes=self.a.freshness_probes, spacing_s=spacing_s, timeout_s=20, windows=windowed,
            changelog=changelog)))
        self._say_freshness(kind, detail, out)
        return out["freshness_p50_ms"], out["freshness_p99_ms"]

    def _observed(self, probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``probe()``'s summary with how long the stack had run and what each component used meanwhile:
        the embedded broker's fetches cost more the longer it runs, and its CPU is taken from the pipeline."""
        from loadtest.footprint import during, stack_roots

        age = self._age_s("broker")
        out, fp = during(stack_roots(self.stack), probe)
        return {**out, "stack_age_s": None if age is None else round(age),
                "cores_by_component": {n: round(c, 3) for n, c in fp.cores.items()}}

    def _say_freshness(self, kind: str, detail: str, out: dict[str, Any]) -> None:
        """Print one freshness figure and keep its probes' summary in the notes as ``freshness_<kind>``."""
        self.say(f"  freshness ({kind}{', ' + detail if detail else ''}): p50 {out['freshness_p50_ms']} ms  "
                 f"p99 {out['freshness_p99_ms']} ms  max {out.get('freshness_max_ms')} ms "
                 f"({out['visible']}/{out['probes']} probes visible)")
        if out.get("hops"):
            self.say("    by hop, p50/p99 ms: " + ", ".join(f"{name} {h['p50_ms']}/{h['p99_ms']}"
                                                           for name, h in out["hops"].items()))
        cores = out.get("cores_by_component") or {}
        if out.get("stack_age_s") is not None and cores:
            self.say(f"    the stack had run {out['stack_age_s'] / 60:.1f} min; meanwhile the pipeline used "
                     f"{cores.get('pipeline', 0):.2f} cores, the broker {cores.get('broker', 0):.2f}")
        key = f"freshness_{kind}"
        self.notes[key] = out
        if out["visible"] < out["probes"]:
            self.notes[f"{key}_problems"] = f"{out['probes'] - out['visible']} probes never became visible"

    def freshness_loaded(self) -> None:
        """Event → visible while the bench's own producer adds ``--loaded-rate`` readings/s to the input."""
        from loadtest.freshness import measure_loaded

        c = self.c
        out = self._observed(lambda: measure_loaded(
            c.bootstrap, c.rest_url, f"{c.topic_prefix}readings", self.a.table, self.a.loaded_rate,
            probes=self.a.freshness_probes, say=self.say))
        self._say_freshness("loaded", f"{self.a.loaded_rate:,.0f} readings/s", out)
        self.fig["freshness_p99_ms_loaded"] = out["freshness_p99_ms"]

    def pipeline_replay(self) -> None:
        """kill -9 of the pipeline at the demo rate and a new one started at once: seconds from the kill until every
        table has had its input's end again (``pipeline_replay_s``: Spark's start and the replay from the checkpoint).
        """
        import signal

        from loadtest.freshness import InputLag

        lag = InputLag(self.c.rest_url)
        try:
            tables = {t for t, n in lag.sample_all().items() if n is not None}
            if not tables:
                raise RuntimeError("no pipeline table reports where it is in its input")
            killed = time.monotonic()
            self.stack.signal("pipeline", signal.SIGKILL)
            # Answers say the killed pipeline is behind as soon as input arrives: a 0 after that is the new one's.
            while time.monotonic() - killed < 10:
                lags = lag.sample_all()
                if all(lags.get(t) for t in tables):
                    break
                time.sleep(0.1)
            self.stack.start("pipeline")
            waiting = set(tables)
            while waiting and time.monotonic() - killed < 600:
                lags = lag.sample_all()
                waiting -= {t for t in waiting if lags.get(t) == 0}
                time.sleep(0.05)
            if waiting:
                raise RuntimeError(f"{sorted(waiting)} not caught up 600 s after the pipeline's kill")
            self.fig["pipeline_replay_s"] = round(time.monotonic() - killed, 1)
            self.say(f"  every table caught up {self.fig['pipeline_replay_s']} s after kill -9 of the pipeline")
        finally:
            lag.close()

    def pipeline_burst(self) -> None:
        """100,000 demo readings written at once by one producer → every table caught up (``pipeline_burst_s``)."""
        from loadtest.burst import measure
        from loadtest.freshness import InputLag

        c = self.c
        with closing(InputLag(c.rest_url)) as lag:
            out = measure(c.bootstrap, lag, f"{c.topic_prefix}readings", say=self.say)
        self.fig["pipeline_burst_s"] = out["pipeline_burst_s"]
        self.notes["pipeline_burst"] = out

    def pipeline_max_rate(self) -> None:
        """The highest input rate at which every table keeps within two seconds of its input for 60 s."""
        from loadtest.freshness import InputLag
        from loadtest.pipeline_rate import measure

        c = self.c
        with closing(InputLag(c.rest_url)) as lag:
            out = measure(c.bootstrap, lag, f"{c.topic_prefix}readings", say=self.say)
        self.fig["pipeline_max_events_per_s"] = out["pipeline_max_events_per_s"]
        self.notes["pipeline_rate"] = out["steps"]

    def read_your_writes(self) -> None:
        """Produce-then-read cycles with a write token, beside the same lookup without one."""
        from loadtest.read_your_writes import measure

        c = self.c
        out = measure(c.bootstrap, c.rest_url, f"{c.topic_prefix}readings", say=self.say)
        for k in ("ryw_wait_p50_ms", "ryw_wait_p99_ms", "ryw_stale_reads", "ryw_not_yet_visible"):
            self.fig[k] = out[k]
        self.notes["read_your_writes"] = out

    def table_versions(self) -> None:
        """A table redefined under lookups, on a stack of its own (loadtest.table_versions)."""
        from loadtest.table_versions import measure

        a = self.a
        out = measure(self.work / "versions", a.version_records, 1_000, a.version_rate, self.say)
        self.notes["table_versions"] = out
        for k in VERSION_FIGURES:
            self.fig[k] = out.get(k)
        self.say(f"  lookups {out['version_lookups']:,} ({out['version_lookups_per_s']:,}/s, the slowest second "
                 f"{out['version_lookups_per_s_slowest']:,}): failed {out['version_lookups_failed']}, mixing versions "
                 f"{out['version_answers_mixed']}; first answer of the new version, per router, "
                 f"{out['version_switch_visible_ms_by_router']} ms after the switch, of the old one "
                 f"{out['version_rollback_ms_by_router']} ms after the rollback; build "
                 f"{out['version_build_s_per_million']} s "
                 f"and {out['version_build_cpu_s_per_million']} CPU s per million readings; disk (MB) "
                 f"{out['version_disk_mb']}")

    def restore_vs_raw(self) -> None:
        """Restore and raw consume of a changelog of ``--restore-records`` records, in alternating rounds.

        The changelog, its table spec (in a Redis namespace of its own) and the store node
        restoring it all belong to this step and are removed at its end: the stack's own tables,
        topics and nodes are not touched.
        """
        from loadtest.restore import ScratchChangelog

        a, c, say = self.a, self.c, self.say
        scratch = ScratchChangelog(c.bootstrap, c.redis_url, self.work, prefix=c.topic_prefix)
        try:
            keys = min(a.restore_keys, a.restore_records)
            say(f"  producing {a.restore_records:,} records over {keys:,} keys to {scratch.spec.topic} "
                f"({scratch.spec.partitions} partitions)")
            took = scratch.create(a.restore_records, keys,
                                  progress=lambda n: say(f"  … produced {n:,} of {a.restore_records:,}"))
            say(f"  produced in {took:.1f}s; table {scratch.spec.name} registered in namespace {scratch.namespace}")
            self.notes["restore_changelog"] = {"topic": scratch.spec.topic, "namespace": scratch.namespace,
                                               "records": a.restore_records, "keys": keys,
                                               "partitions": scratch.spec.partitions}
            runs: dict[str, list[dict[str, Any]]] = {"raw_consume": [], "restore": []}

            def raw() -> float | None:
                out = scratch.raw_consume()
                runs["raw_consume"].append(out)
                say(f"  raw consume: {out['raw_consume_rps']:,.0f} records/s ({out['records']:,} in {out['seconds']:.2f}s)")
                return out["raw_consume_rps"]

            def restore() -> float | None:
                say("  restore: a new store node, an empty data directory")
                out = scratch.restore(a.restore_timeout, progress=lambda replicas, applied, secs: say(
                    f"  … restore: {replicas} replicas, {applied:,} of {a.restore_records:,} records applied "
                    f"({secs:.0f}s)"))
                runs["restore"].append(out)
                lg = out["log"]
                say(f"  restore: {out['restore_rps']:,.0f} records/s ({lg['records']:,} offsets in {lg['seconds']:.2f}s "
                    f"from the first replica's start to the last catch-up; {out['from_listening_s']:.2f}s from "
                    f"listening to served)")
                return out["restore_rps"]

            raws, restores = self.paired("raw_consume", raw, "restore", restore)
            self.fig["raw_consume_rps"], self.fig["restore_rps"] = median_of(raws), median_of(restores)
            self.notes["restore_runs"] = runs
            # Runs side by side in the same round share the machine's load: their ratio is the steadiest.
            self.notes["restore_ratio_per_round"] = [round(r / w, 3) for r, w in zip(restores, raws) if r and w]
            # What each costs in CPU, whatever else runs: the restore's own limit on a busy machine.
            per_cpu = {k: median_of([r.get("records_per_cpu_s") for r in v]) for k, v in runs.items()}
            self.notes["records_per_cpu_s"] = per_cpu
            if per_cpu["raw_consume"] and per_cpu["restore"]:
                say(f"  records per CPU-second: restore {per_cpu['restore']:,.0f} (the node's process), raw consume "
                    f"{per_cpu['raw_consume']:,.0f}; per-round ratios {self.notes['restore_ratio_per_round']}")
        finally:
            say(f"  removing topic {scratch.spec.topic} and namespace {scratch.namespace}")
            scratch.remove()


def checkpoint_interval_s() -> float:
    """The Real-time pipeline's checkpoint interval by default, in seconds: the span the freshness probes cover."""
    from freshroute.windows import duration_ms
    from pipeline.settings import PipelineSettings

    interval = PipelineSettings.model_fields["realtime_checkpoint_interval"].default
    return duration_ms(interval, "realtime_checkpoint_interval") / 1000.0


class CheckpointPauses:
    """Each table's Real-time checkpoints while it is open: how long each stopped processing (ms), read from the
    pipeline's ``freshroute_pipeline_checkpoint_pause_ms`` every second (a query checkpoints once an interval)."""

    def __init__(self, metrics_url: str | None) -> None:
        self.url = metrics_url
        self.seen: dict[str, list[int]] = {}
        self._batches: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="checkpoint-pauses", daemon=True)

    def __enter__(self) -> "CheckpointPauses":
        if self.url:
            self._batches = self._scrape()[0]  # the checkpoints before: not this window's
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            batches, pauses = self._scrape()
            for table, batch in batches.items():
                if batch != self._batches.get(table) and table in pauses:
                    self.seen.setdefault(table, []).append(int(pauses[table]))
                self._batches[table] = batch

    def _scrape(self) -> tuple[dict[str, float], dict[str, float]]:
        """Each table's last batch id and checkpoint pause, from one scrape (none when the pipeline does not answer)."""
        import httpx

        try:
            text = httpx.get(self.url, timeout=2).text
        except httpx.HTTPError:
            return {}, {}
        return tuple({m[1]: float(m[2]) for m in re.finditer(rf'^freshroute_pipeline_{gauge}{{table="([^"]+)"}} (\S+)$',
                                                             text, re.M)}
                     for gauge in ("batch_id", "checkpoint_pause_ms"))  # type: ignore[return-value]


def _step(bench: Bench, n: int, total: int, what: str, fn: Callable[[], Any]) -> Any:
    bench.say(f"[{n}/{total}] {what}")
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - one failed measurement must not lose the others
        bench.say(f"  ! {what} failed: {type(e).__name__}: {e}")
        bench.notes.setdefault("errors", {})[what] = f"{type(e).__name__}: {e}"
        return None


def start_baseline(table: str, keys: int, work: Path) -> tuple[subprocess.Popen, int]:
    """The baseline gRPC server as a process of its own (like the router), and its port."""
    log = open(work / "baseline.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "loadtest.baseline_server", "--port", "0", "--table", table,
                             "--keys", str(keys), "--max-seconds", "900"], stdout=subprocess.PIPE, stderr=log,
                            stdin=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline() if proc.stdout else ""
        m = re.match(r"PORT (\d+)", line or "")
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
    proc.kill()
    proc.wait(5)
    log.seek(0)
    raise RuntimeError(f"the baseline gRPC server did not start: {log.read()[-500:]}")


def run_bench(stack: Any, a: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    """Every measurement in turn; returns {figures, targets, notes}."""
    b = Bench(stack, a, say)
    c = stack.config
    grpc_url = f"http://{c.grpc_address}/freshroute.v1.Router/Get"
    total = 24
    fig = b.fig
    baseline: subprocess.Popen | None = None
    restore_step = f"restore vs raw consume of a {a.restore_records:,}-record changelog, {a.rounds} round(s)"
    if a.restore_only:
        try:
            _step(b, 1, 1, restore_step, b.restore_vs_raw)
        finally:
            shutil.rmtree(b.work, ignore_errors=True)
        return {"figures": fig, "targets": evaluate_targets(fig), "notes": b.notes}
    try:
        if a.no_cold:
            say(f"[1/{total}] freshness right after `local up`: skipped (--no-cold)")
        else:
            _step(b, 1, total, "freshness right after `local up` (freshness_p99_ms_cold)", b.restart_cold)
        _step(b, 2, total, "keys the router serves", b.find_keys)
        if not b.keys:
            raise RuntimeError("no keys to benchmark with")
        _step(b, 3, total, f"idle footprint: every stack process's CPU over {a.idle_seconds:g}s, no lookups",
              b.footprint)
        fig["router_rest_p99_ms_busy"] = _step(
            b, 4, total, f"REST p99 at {BUSY_CONNECTIONS} connections while the pipeline runs (wrk), "
                         f"{a.rounds} round(s)", b.rest_p99_busy)
        body = b.grpc_body()
        router_ok = _step(b, 5, total, "router gRPC answer", lambda: b.ok_size(c.grpc_address, body))
        router_body = (body, router_ok) if router_ok else None
        store = _step(b, 6, total, "store node for direct reads", b.store_read)
        started = _step(b, 7, total, "baseline gRPC server", lambda: start_baseline(a.table, len(b.keys), b.work))
        if started:
            baseline = started[0]
            base_address = f"{c.host}:{started[1]}"
            base_ok = _step(b, 7, total, "baseline gRPC answer", lambda: b.ok_size(base_address, body))
        # Each target compares two figures: their runs alternate (see interleaved), so that the
        # load other processes put on a shared machine weighs on both alike; a throughput
        # figure is the median of its runs, a latency figure the percentile of all samples.
        say(f"throughput at {a.concurrency} requests in flight, {a.duration:g}s each, {a.rounds} round(s):")

        def rest_vs_redis() -> None:
            rest, redis_ = b.paired("router_rest", b.throughput_rest, "redis_get", b.throughput_redis)
            fig["router_rest_rps"], fig["redis_get_rps"] = median_of(rest), median_of(redis_)

        _step(b, 8, total, "router REST (wrk) and Redis GET (redis-benchmark) throughput", rest_vs_redis)
        _step(b, 8, total, f"window lookups ({WINDOW_COUNT} windows of {a.window_table}) against point gets (wrk)",
              b.windows_vs_points)
        _step(b, 8, total, "REST lookups with one console open against none (wrk)", b.console_open_vs_closed)
        _step(b, 8, total, "where a lookup's CPU goes: the routers' and store nodes' by stage (wrk, py-spy)",
              b.lookup_stages)
        if router_body and started:
            # The baseline answers the same request with a response of the same shape.
            base_url = f"http://{base_address}/freshroute.v1.Router/Get"

            def router_vs_baseline() -> None:
                routed, base = b.paired("router_grpc", lambda: b.throughput_grpc("router_grpc", grpc_url, *router_body),
                                        "baseline_grpc", lambda: b.throughput_grpc("baseline_grpc", base_url, body,
                                                                                   base_ok))
                fig["router_grpc_rps"], fig["baseline_grpc_rps"] = median_of(routed), median_of(base)

            _step(b, 9, total, "router and baseline gRPC throughput (h2load)", router_vs_baseline)
        elif router_body:
            fig["router_grpc_rps"] = _step(b, 9, total, "router gRPC throughput (h2load)",
                                           lambda: b.throughput_grpc("router_grpc", grpc_url, *router_body))
        if store:
            fig["direct_store_rps"] = _step(b, 10, total, "direct store node throughput (its read port)",
                                            lambda: b.throughput_store(*store))

        say(f"latency at a fixed {a.latency_rate:g} req/s, {a.latency_duration:g}s each:")

        def latencies() -> None:
            if router_body and store:
                routed, direct = b.paired(
                    "router_grpc_latency", lambda: b.latency_samples("router_grpc_latency", grpc_url, *router_body),
                    "direct_store_latency", lambda: b.latency_store(*store), record=False)
                fig["router_grpc_p50_ms"], fig["router_grpc_p99_ms"] = b.p50_p99([x for r in routed if r for x in r])
                fig["direct_store_p50_ms"], b.notes["direct_store_p99_ms"] = b.p50_p99(
                    [x for r in direct if r for x in r])
            elif router_body:
                fig["router_grpc_p50_ms"], fig["router_grpc_p99_ms"] = b.p50_p99(
                    b.latency_samples("router_grpc_latency", grpc_url, *router_body))
            uris = b.work / "rest_uris.txt"
            uris.write_text("".join(f"{c.rest_url}/v1/tables/{a.table}/keys/{k}\n" for k in b.keys))
            fig["router_rest_p50_ms"], fig["router_rest_p99_ms"] = b.p50_p99(
                b.latency_samples("router_rest_latency", "", None, None, http1=True, input_file=uris))

        _step(b, 11, total, "latencies (h2load --rps)", latencies)
        _step(b, 11, total, "lookups as of a time on a versioned table against its plain lookups (wrk, h2load --rps)",
              b.versioned_vs_points)
        if baseline is not None:
            baseline.terminate()
        if router_body:
            say("router/transports against uvicorn's httptools protocol and grpc.aio, a router process each:")
            _step(b, 12, total, "hand-written transports against the libraries (wrk, h2load)",
                  lambda: b.transports_vs_libraries(*router_body))
        say("the compiled lookup path against the Python front it took over from, a router process each:")
        _step(b, 12, total, "compiled path against the Python front (wrk, h2load, /proc)", b.compiled_vs_python)
        if router_body:
            say("TLS and a bearer token against the stack's plain routers, interleaved:")
            _step(b, 13, total, "secured REST and gRPC throughput, and a flood of bad tokens (wrk, h2load over TLS)",
                  lambda: b.secure_vs_plain(*router_body))
        say(f"the client against redis-py, {a.duration:g}s runs, latency at {a.latency_rate:g} req/s:")
        _step(b, 14, total, "freshroute.client against redis-py (loadtest.clientbench)", b.client_vs_redis_py)
        fr = _step(b, 15, total, f"freshness on a warm stack (event → visible), {a.freshness_probes} probes",
                   b.freshness)
        if fr:
            fig["freshness_p50_ms"], fig["freshness_p99_ms"] = fr
        # The loaded step comes after every figure of a stack at its usual pace: the backlog it leaves is drained
        # when it ends, but what follows a drain is its own (window probes right after one took over a second).
        _step(b, 16, total, f"freshness of a reading's window ({a.window_table}), {a.freshness_probes} probes",
              b.freshness_windows)
        _step(b, 17, total, "freshness over the pipeline's checkpoints", b.freshness_checkpoint)
        _step(b, 18, total, "read your writes: 1,000 produce-then-read cycles with a write token", b.read_your_writes)
        _step(b, 19, total, f"freshness with the input at {a.loaded_rate:,.0f} readings/s", b.freshness_loaded)
        _step(b, 20, total, "kill -9 of the pipeline and a new one caught up (pipeline_replay_s)", b.pipeline_replay)
        _step(b, 21, total, "100,000 readings written at once → every table caught up (pipeline_burst_s)",
              b.pipeline_burst)
        _step(b, 22, total, "the highest input rate the pipeline holds (pipeline_max_events_per_s)",
              b.pipeline_max_rate)
        if a.no_restore:
            say("restore and raw consume: skipped (--no-restore)")
        else:
            _step(b, 23, total, restore_step, b.restore_vs_raw)
        if a.no_versions:
            say("a table redefined under lookups: skipped (--no-versions)")
        else:
            _step(b, 24, total, f"a table redefined under {a.version_rate:,.0f} lookups/s on a stack of its own: "
                  f"built from {a.version_records:,} readings, switched to, rolled back, retired", b.table_versions)
    finally:
        if baseline is not None:
            lc.stop_process(baseline)
        shutil.rmtree(b.work, ignore_errors=True)
    return {"figures": fig, "targets": evaluate_targets(fig), "notes": b.notes}


def format_table(fig: dict[str, Any], targets: list[dict[str, Any]]) -> str:
    lines = ["", f"{'figure':<26} {'value':>12}  load client", "-" * 76]
    for k in FIGURES:
        v = fig.get(k)
        client = LOAD_CLIENTS.get(k) or (LOAD_CLIENTS["client"] if k.startswith(("client_", "redis_py_"))
                                         else LOAD_CLIENTS["version"] if k.startswith("version_")
                                         else LOAD_CLIENTS["latency"] if k.endswith("_ms") and "fresh" not in k
                                         else LOAD_CLIENTS["freshness"] if "fresh" in k else "")
        lines.append(f"{k:<26} {'n/a' if v is None else f'{v:,.2f}':>12}  {client}")
    lines += ["", "targets:"]
    for t in targets:
        mark = "MET " if t["met"] else ("n/a " if t["met"] is None else "MISS")
        lines.append(f"  [{mark}] {t['target']:<48} value {t['value']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``freshroute bench``: every figure against the local stack; the last line is one JSON object."""
    p = argparse.ArgumentParser(prog="freshroute bench", description=__doc__.splitlines()[0])
    p.add_argument("--home", default=".freshroute/local", help="the local stack's directory (holds state.json)")
    p.add_argument("--table", default="sensor_stats")
    p.add_argument("--window-table", default="sensor_windows", help="the windowed table of window_rps")
    p.add_argument("--keys", type=int, default=100, help="keyspace: {prefix}0 .. {prefix}{keys-1}")
    p.add_argument("--key-prefix", default="sensor-")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight for every throughput run")
    p.add_argument("--grpc-connections", type=int, default=4, help="h2load connections; streams = concurrency / this")
    p.add_argument("--duration", type=float, default=8.0, help="seconds per throughput run")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of each compared figure, interleaved with its counterpart's (median / pooled)")
    p.add_argument("--latency-rate", type=float, default=200.0, help="fixed total req/s of the latency runs")
    p.add_argument("--latency-clients", type=int, default=4)
    p.add_argument("--latency-duration", type=float, default=8.0)
    p.add_argument("--redis-requests", type=int, default=200_000)
    p.add_argument("--client-concurrency", type=int, default=32,
                   help="reads in flight in the client and redis-py runs (asyncio tasks in one process)")
    # A minute: a Real-time pipeline's checkpoint (once a minute by default) is part of its idle cost.
    p.add_argument("--idle-seconds", type=float, default=60.0,
                   help="window of the idle footprint (stack_idle_cpu_cores): every stack process's CPU, no lookups")
    p.add_argument("--pipeline-mode", choices=("realtime", "microbatch"),
                   help="run the stack's pipeline this way (the stack is started again in it if it runs the other); "
                        "default: as it runs")
    p.add_argument("--spark-jit", choices=("client", "tiered", "auto"),
                   help="run the stack's pipeline with this JIT (the stack is started again with it if it runs "
                        "another); default: as it runs")
    # 100: the p99 of 100 samples is the second highest, not just the maximum of one unlucky batch
    p.add_argument("--freshness-probes", type=int, default=100, help="probes of each freshness figure")
    p.add_argument("--loaded-rate", type=float, default=LOADED_RATE,
                   help="readings/s the bench's own producer adds to the input for freshness_p99_ms_loaded")
    p.add_argument("--no-cold", action="store_true",
                   help="keep the running stack: skip freshness_p99_ms_cold (which restarts the stack first)")
    # A million: a restore of 300,000 records took 0.76–1.08 s, so a scheduling hiccup or the
    # replicas' start moved a round's ratio between 0.40 and 0.59 in one run; a million take
    # 2.6–3.1 s (rounds 0.68–0.90 in the run after).
    p.add_argument("--restore-records", type=int, default=1_000_000,
                   help="records of the changelog the restore and raw consume read (a topic of the bench's own)")
    p.add_argument("--restore-keys", type=int, default=100_000, help="distinct keys among those records")
    p.add_argument("--restore-timeout", type=float, default=180.0, help="seconds one restore may take")
    p.add_argument("--no-restore", action="store_true", help="skip the restore and raw consume figures")
    p.add_argument("--no-versions", action="store_true", help="skip the table versions figures (a stack of their own)")
    p.add_argument("--version-records", type=int, default=200_000, help="input readings a new table version is "
                   "built from")
    p.add_argument("--version-rate", type=float, default=2_000.0, help="lookups/s while a table is redefined")
    p.add_argument("--restore-only", action="store_true", help="measure only the restore and raw consume figures")
    p.add_argument("--json-out", type=Path, help="also write {figures, targets, notes} here")
    a = p.parse_args(argv)
    if not (0 < a.duration <= 120 and 0 < a.latency_duration <= 120 and 1 <= a.concurrency <= 1024
            and 1 <= a.rounds <= 10 and 1_000 <= a.restore_records <= 5_000_000 and a.restore_keys >= 1
            and 1 <= a.freshness_probes <= 1000 and 0 < a.loaded_rate <= 100_000):
        p.error("durations must be within (0, 120] s, concurrency within [1, 1024], rounds within [1, 10], "
                "restore records within [1000, 5000000], freshness probes within [1, 1000], the loaded rate "
                "within (0, 100000] readings/s")
    if a.no_restore and a.restore_only:
        p.error("--no-restore and --restore-only exclude each other")
    from tools.local.stack import NoLocalStack, Stack

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        stack = Stack.load(Path(a.home), say)
    except NoLocalStack as e:
        print(e.message, file=sys.stderr)
        return 2
    if stack.config.kafka_config:
        # The bench's own Kafka clients (probes, load, restore) speak to the broker as the stack does.
        os.environ["FRESHROUTE_KAFKA_CONFIG"] = stack.config.kafka_config
    # The restore needs only the stack's broker and Redis; every other figure goes through the router.
    needed = ("broker", "redis") if a.restore_only else ("broker", "redis", "router")
    for name in needed:
        if not stack.components.get(name) or not stack.components[name].alive():
            print(f"the local stack's {name} is not running", file=sys.stderr)
            return 2
    wanted = {k: v for k, v in (("pipeline_mode", a.pipeline_mode), ("spark_jit", a.spark_jit))
              if v and v != getattr(stack.config, k)}
    if wanted:
        say(f"starting the local stack again with its pipeline's {', '.join(f'{k} {v}' for k, v in wanted.items())}")
        stack.down()
        stack = Stack(dataclasses.replace(stack.config, **wanted), say)
        stack.up()
    out = run_bench(stack, a, say)
    say(format_table(out["figures"], out["targets"]))
    if a.json_out:
        a.json_out.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    last = {**out["figures"], "pipeline_mode": stack.config.pipeline_mode, "spark_jit": stack.config.spark_jit,
            "targets": {t["target"]: t["met"] for t in out["targets"]},
            "load_clients": {"rest": "wrk", "grpc": "h2load", "redis": "redis-benchmark", "latency": "h2load --rps"}}
    print(orjson.dumps(last).decode(), flush=True)
    return 0 if all(out["figures"][k] is not None
                    for k in expected_figures(a.no_restore, a.restore_only, a.no_cold, a.no_versions)) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Native load clients the benchmark drives: wrk (REST), h2load (gRPC and fixed-rate HTTP), redis-benchmark.

They are C programs with one thread each, so that the load client does not eat the cores
the measured server needs (a Python client would cost more CPU than the router per request).
This module builds their command lines and parses what they print; running them is the
caller's business (``run`` with a hard timeout).

gRPC over h2load: h2load POSTs a file as each request's body, so the body is one gRPC
length-prefixed message (1 byte "compressed" flag = 0, 4 bytes big-endian length, the
serialized protobuf) sent with ``content-type: application/grpc`` and ``te: trailers``.
h2load only sees HTTP status 200 — a gRPC error travels in trailers — so the caller checks
the response bytes: an OK answer has a data frame of the expected size, an error has none.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

LUA_SCRIPT = Path(__file__).with_name("wrk_rotate_keys.lua")
GRPC_HEADERS = ("content-type: application/grpc", "te: trailers")


def grpc_frame(message: bytes, compressed: bool = False) -> bytes:
    """One gRPC length-prefixed message: flag byte, 4-byte big-endian length, payload."""
    if len(message) >= 1 << 32:
        raise ValueError("a gRPC message must be shorter than 4 GiB")
    return (b"\x01" if compressed else b"\x00") + len(message).to_bytes(4, "big") + message


def grpc_unframe(data: bytes) -> list[bytes]:
    """The messages of a length-prefixed gRPC stream (the inverse of :func:`grpc_frame`)."""
    out, i = [], 0
    while i < len(data):
        if len(data) - i < 5:
            raise ValueError("truncated gRPC frame header")
        n = int.from_bytes(data[i + 1 : i + 5], "big")
        if len(data) - i - 5 < n:
            raise ValueError("truncated gRPC message")
        out.append(data[i + 5 : i + 5 + n])
        i += 5 + n
    return out


def require(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise RuntimeError(f"{tool} is not installed (apt-get install {'nghttp2-client' if tool == 'h2load' else tool})")
    return path


def run(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Run a load client to completion (bounded by ``timeout_s``) and return its stdout+stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exited with {proc.returncode}: {out[-800:]}")
    return out


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a process this one started, by its pid: SIGTERM, then SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


# --- h2load -----------------------------------------------------------------------------------
def h2load_command(url: str, clients: int, streams: int, duration_s: float, body_file: Path | None = None,
                   headers: tuple[str, ...] = (), rps_per_client: float | None = None,
                   log_file: Path | None = None, http1: bool = False, warm_up_s: float = 0.0,
                   input_file: Path | None = None) -> list[str]:
    """h2load on one thread: ``clients`` connections × ``streams`` in flight each, for ``duration_s``."""
    cmd = [require("h2load"), "-t", "1", "-c", str(clients), "-m", str(streams), "-D", f"{duration_s:g}"]
    if warm_up_s:
        cmd += ["--warm-up-time", f"{warm_up_s:g}"]
    if body_file is not None:
        cmd += ["-d", str(body_file)]
    for h in headers:
        cmd += ["-H", h]
    if rps_per_client:
        cmd += ["--rps", f"{rps_per_client:g}"]
    if log_file is not None:
        cmd += ["--log-file", str(log_file)]
    if http1:
        cmd.append("--h1")
    if input_file is not None:
        cmd += ["-i", str(input_file)]
    else:
        cmd.append(url)
    return cmd


@dataclass(frozen=True)
class H2loadResult:
    seconds: float
    rps: float
    total: int
    done: int
    succeeded: int
    failed: int
    errored: int
    timeout: int
    status_2xx: int
    status_4xx: int
    status_5xx: int
    data_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _bytes(num: str, unit: str | None) -> int:
    return int(float(num) * {None: 1, "": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[unit])


def parse_h2load(output: str) -> H2loadResult:
    """Parse h2load's summary (``finished in``, ``requests:``, ``status codes:``, ``traffic:``)."""
    fin = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", output)
    req = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                    r"(\d+) errored, (\d+) timeout", output)
    st = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", output)
    traffic = re.search(r"traffic: .*?, ([\d.]+)([KMG]?B)? \(\d+\) data", output)
    if not (fin and req and st):
        raise ValueError(f"unexpected h2load output: {output[-600:]}")
    seconds = float(fin.group(1)) / (1000 if fin.group(2) == "ms" else 1)
    data = re.search(r"traffic: .*? \((\d+)\) data", output)
    data_bytes = int(data.group(1)) if data else (_bytes(traffic.group(1), traffic.group(2)) if traffic else 0)
    total, _started, done, ok, failed, errored, timeout = (int(x) for x in req.groups())
    return H2loadResult(seconds, float(fin.group(3)), total, done, ok, failed, errored, timeout,
                        int(st.group(1)), int(st.group(3)), int(st.group(4)), data_bytes)


def parse_h2load_log(path: Path) -> tuple[list[float], dict[int, int]]:
    """Latencies (ms) and status counts from h2load's ``--log-file`` (start µs, status, duration µs)."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            status = int(parts[1])
            statuses[status] = statuses.get(status, 0) + 1
            latencies.append(int(parts[2]) / 1000.0)
    return latencies, statuses


# --- wrk --------------------------------------------------------------------------------------
def wrk_command(url: str, connections: int, duration_s: float, threads: int = 1,
                headers: tuple[str, ...] = ()) -> list[str]:
    cmd = [require("wrk"), "-t", str(threads), "-c", str(connections), "-d", f"{duration_s:g}s",
           "--timeout", "5s", "-s", str(LUA_SCRIPT)]
    for h in headers:
        cmd += ["-H", h]
    return [*cmd, url]


def wrk_env(table: str, key_prefix: str, keys: int, query: str = "", suffix: str = "") -> dict[str, str]:
    import os

    return {**os.environ, "WRK_TABLE": table, "WRK_KEY_PREFIX": key_prefix, "WRK_KEYS": str(keys), "WRK_QUERY": query,
            "WRK_SUFFIX": suffix}


def parse_wrk(output: str) -> dict[str, Any]:
    """The JSON summary line the Lua script prints, plus ``rps`` and ``errors``."""
    m = re.search(r"^WRK_JSON (\{.*\})$", output, re.M)
    if not m:
        raise ValueError(f"no WRK_JSON line in wrk output: {output[-600:]}")
    doc = orjson.loads(m.group(1))
    doc["rps"] = doc["requests"] / (doc["duration_us"] / 1e6) if doc["duration_us"] else 0.0
    doc["errors"] = sum(doc[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts"))
    return doc


# --- redis-benchmark --------------------------------------------------------------------------
def redis_benchmark_command(host: str, port: int, clients: int, requests: int) -> list[str]:
    """GET only, no pipelining (-P 1), one thread, CSV output."""
    return [require("redis-benchmark"), "-h", host, "-p", str(port), "-c", str(clients), "-n", str(requests),
            "-P", "1", "-t", "get", "--csv"]


def parse_redis_benchmark(output: str) -> float:
    """Requests/s of the GET test from ``redis-benchmark --csv``."""
    for line in output.splitlines():
        cells = [c.strip().strip('"') for c in line.split(",")]
        if len(cells) >= 2 and cells[0].upper().startswith("GET"):
            return float(cells[1])
    raise ValueError(f"no GET line in redis-benchmark output: {output[-400:]}")

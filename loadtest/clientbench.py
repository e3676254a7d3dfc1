"""One side of the client benchmark, in a process of its own: freshroute's client or redis-py, the same way.

    python -m loadtest.clientbench --side client|redis --measure rps|many|latency --model async|sync ...

``rps``: gets for ``--duration`` seconds with ``--concurrency`` in flight (asyncio tasks in
one process, or that many threads for ``--model sync``); ``many``: 100-key batches the same
way (``get_many`` against ``MGET``); ``latency``: gets paced at ``--rate`` per second from
one caller, each one's latency. Prints one JSON object. The keys are the bench's: the
table's served keys for the client, and Redis keys holding values of the same size.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from operator import attrgetter
from typing import Any, Callable, Iterator

import orjson

REDIS_PREFIX = "freshroute-bench:"
_FOUND = attrgetter("found")


def _client_ops(a: argparse.Namespace) -> tuple[Any, Callable[[int], Any], Callable[[list[int]], Any]]:
    from freshroute.client import AsyncClient, Client

    keys = [f"{a.key_prefix}{i}" for i in range(a.keys)]
    if a.model == "sync":
        c = Client(redis_url=a.redis_url, namespace=a.namespace)
        return c, lambda i: c.get(a.table, keys[i]), lambda idx: c.get_many(a.table, [keys[i] for i in idx])
    c = AsyncClient(redis_url=a.redis_url, namespace=a.namespace)
    return c, lambda i: c.get(a.table, keys[i]), lambda idx: c.get_many(a.table, [keys[i] for i in idx])


def _redis_ops(a: argparse.Namespace) -> tuple[Any, Callable[[int], Any], Callable[[list[int]], Any]]:
    import redis
    import redis.asyncio as aioredis

    keys = [f"{REDIS_PREFIX}{i}" for i in range(a.keys)]
    if a.model == "sync":
        r = redis.Redis.from_url(a.redis_url, max_connections=max(a.concurrency, 10))
    else:
        r = aioredis.Redis.from_url(a.redis_url, max_connections=max(a.concurrency, 10))
    return r, lambda i: r.get(keys[i]), lambda idx: r.mget([keys[i] for i in idx])


def _check(side: str, value: Any) -> None:
    # A read that answers nothing must not count: every bench key exists on both sides. Checked at C speed on
    # both sides (map and attrgetter here, ``in`` for redis-py), so the check weighs on neither.
    if side == "client":
        items = value if isinstance(value, list) else [value]
        try:
            found = sum(map(_FOUND, items))
        except AttributeError:  # a key's error in place of its Lookup
            found = -1
        if found != len(items):
            raise RuntimeError(f"the client did not find every bench key: {items[:1]}")
    elif value is None or (isinstance(value, list) and None in value):
        raise RuntimeError("redis has not every bench key")


def run_sync(a: argparse.Namespace, get: Callable[[int], Any], many: Callable[[list[int]], Any]) -> dict[str, Any]:
    batch = a.batch
    if a.measure == "latency":
        return _paced(a, lambda i: _check(a.side, get(i)))
    op = (lambda i: _check(a.side, get(i))) if a.measure == "rps" else \
        (lambda i: _check(a.side, many([(i + k) % a.keys for k in range(batch)])))
    for i in range(200):
        op(i % a.keys)
    counts = [0] * a.concurrency
    stop_at = time.perf_counter() + a.duration

    def worker(w: int) -> None:
        n = 0
        while time.perf_counter() < stop_at:
            op((w * 7919 + n) % a.keys)
            n += 1
        counts[w] = n

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(a.concurrency)]
    t0, cpu0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _rate(a, sum(counts), time.perf_counter() - t0, time.process_time() - cpu0)


async def run_async(a: argparse.Namespace, get: Callable[[int], Any], many: Callable[[list[int]], Any]) -> dict[str, Any]:
    batch = a.batch

    async def op(i: int) -> None:
        if a.measure == "many":
            _check(a.side, await many([(i + k) % a.keys for k in range(batch)]))
        else:
            _check(a.side, await get(i))

    for i in range(200):
        await op(i % a.keys)
    if a.measure == "latency":
        lat = []
        for n, due in _schedule(a):
            t0 = time.perf_counter()
            await op(n % a.keys)
            lat.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        return {"latencies_ms": lat}
    counts = [0] * a.concurrency
    stop_at = time.perf_counter() + a.duration

    async def worker(w: int) -> None:
        n = 0
        while time.perf_counter() < stop_at:
            await op((w * 7919 + n) % a.keys)
            n += 1
        counts[w] = n

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(w) for w in range(a.concurrency)))
    return _rate(a, sum(counts), time.perf_counter() - t0, time.process_time() - cpu0)


def _schedule(a: argparse.Namespace) -> Iterator[tuple[int, float]]:
    """The paced run's ops: (op number, when the next one is due), ``--rate`` per second for ``--duration``."""
    period = 1.0 / a.rate
    start = time.perf_counter()
    for n in range(int(a.duration * a.rate)):
        yield n, start + (n + 1) * period


def _paced(a: argparse.Namespace, op: Callable[[int], None]) -> dict[str, Any]:
    for i in range(200):
        op(i % a.keys)
    lat = []
    for n, due in _schedule(a):
        t0 = time.perf_counter()
        op(n % a.keys)
        lat.append((time.perf_counter() - t0) * 1000)
        time.sleep(max(0.0, due - time.perf_counter()))
    return {"latencies_ms": lat}


def _rate(a: argparse.Namespace, ops: int, seconds: float, cpu_s: float) -> dict[str, Any]:
    """The run's rate (keys a second), and the side's own CPU per operation meanwhile (µs, every thread's)."""
    per_op = a.batch if a.measure == "many" else 1
    return {"ops": ops, "seconds": round(seconds, 3), "rate": round(ops * per_op / seconds, 1),
            "cpu_us_per_op": round(cpu_s / ops * 1e6, 1) if ops else None}


async def _main_async(a: argparse.Namespace) -> dict[str, Any]:
    if a.side == "client":
        c, get, many = _client_ops(a)
        await c.start()
        try:
            return await run_async(a, get, many)
        finally:
            await c.close()
    r, get, many = _redis_ops(a)
    try:
        return await run_async(a, get, many)
    finally:
        await r.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.clientbench", description=__doc__.splitlines()[0])
    p.add_argument("--side", choices=("client", "redis"), required=True)
    p.add_argument("--measure", choices=("rps", "many", "latency"), required=True)
    p.add_argument("--model", choices=("async", "sync"), default="async")
    p.add_argument("--redis-url", required=True)
    p.add_argument("--namespace", default="freshroute")
    p.add_argument("--table", default="sensor_stats")
    p.add_argument("--key-prefix", default="sensor-")
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--rate", type=float, default=200.0)
    a = p.parse_args(argv)
    if not (0 < a.duration <= 120 and 1 <= a.concurrency <= 256 and 0 < a.rate <= 10_000 and a.keys >= 1):
        p.error("duration within (0, 120] s, concurrency within [1, 256], rate within (0, 10000]")
    if a.model == "async":
        import uvloop

        out = uvloop.run(_main_async(a))
    elif a.side == "client":
        c, get, many = _client_ops(a)
        with c:
            out = run_sync(a, get, many)
    else:
        r, get, many = _redis_ops(a)
        out = run_sync(a, get, many)
        r.close()
    print(orjson.dumps(out).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

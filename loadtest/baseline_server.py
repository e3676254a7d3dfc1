"""The gRPC baseline: a minimal grpc.aio ``Router.Get`` answering from an in-memory dict.

It is what the router's gRPC throughput is compared with: the same wire contract, a
response of the same shape and size, and no routing, no store node, no RocksDB — the cost
of grpc.aio itself on this machine. Prints ``PORT <n>`` once it listens.

    .venv/bin/python -m loadtest.baseline_server --port 0 --keys 100
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import orjson

from freshroute.position import single
from freshroute.keys import partition_for, serialize_key


def demo_responses(table: str, keys: list[str], partitions: int = 8) -> dict[tuple[str, str], object]:
    """A ready ``GetResponse`` per key, shaped like the router's answer for the demo table."""
    from proto import router_pb2

    out = {}
    for i, key in enumerate(keys):
        p = partition_for(serialize_key(key), partitions)
        value = {"count": 41 + i, "sum": 2051.3, "avg": 50.03, "min": 38.2, "max": 61.9, "last": 47.1}
        out[(table, key)] = router_pb2.GetResponse(
            table=table, key=key, value_json=orjson.dumps(value).decode(), partition=p,
            served_by=router_pb2.ServedBy(node="node-1", role="active"), lag=router_pb2.Lag(offsets=0, ms=0),
            position=single(table, p, 1000 + i), found=True)
    return out


def create_server(responses: dict, host: str = "127.0.0.1", port: int = 0):
    """(server, bound port) of a grpc.aio server whose ``Router.Get`` answers from ``responses``."""
    import grpc

    from proto import router_pb2, router_pb2_grpc

    class DictRouter(router_pb2_grpc.RouterServicer):
        async def Get(self, request, context):  # noqa: N802 - gRPC method name
            resp = responses.get((request.table, request.key))
            return resp if resp is not None else router_pb2.GetResponse(table=request.table, key=request.key)

    server = grpc.aio.server()
    router_pb2_grpc.add_RouterServicer_to_server(DictRouter(), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    return server, bound


async def serve(table: str, keys: int, port: int, max_seconds: float) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    server, bound = create_server(demo_responses(table, [f"sensor-{i}" for i in range(keys)]), port=port)
    await server.start()
    print(f"PORT {bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        # Bounded lifetime: a benchmark that dies without stopping it leaves nothing running for long.
        await asyncio.wait_for(stop.wait(), timeout=max_seconds)
    except asyncio.TimeoutError:
        pass
    finally:
        await server.stop(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.baseline_server", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--table", default="sensor_stats")
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--max-seconds", type=float, default=600.0)
    a = p.parse_args(argv)
    asyncio.run(serve(a.table, a.keys, a.port, a.max_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The router fallback: a client that cannot read the store nodes (they accept connections and never answer, as a
node behind a partition does) answers through its router within one request timeout — the store nodes tried for half
of it, once, not once per client layer; the router given the rest — and counts the fallback. A fake router on
loopback describes the cluster and answers the read (or, for key ``slow``, does not in time)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from freshroute.client import AsyncClient, Client
from freshroute.errors import LookupTimeout
from freshroute.routing.policy import RoutingPolicy

POLICY = RoutingPolicy(request_timeout_ms=1000, attempt_timeout_ms=250)


@pytest.fixture
def black_holes():
    """Two listening sockets that never accept: connections complete in the kernel, requests are never read."""
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        socks.append(s)
    yield [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    for s in socks:
        s.close()


@pytest.fixture
def router(black_holes):
    """A router's REST API as the client reads it: one table, one partition, its replicas on the black holes."""
    replicas = [{"node": f"n{i}", "address": a, "table": "t", "partition": 0, "role": role, "state": state,
                 "applied_offset": 7, "end_offset": 7, "lag": {"offsets": 0, "ms": 0}, "alive": True}
                for i, (a, role, state) in enumerate(zip(black_holes, ("active", "standby"), ("ACTIVE", "STANDBY")))]
    docs = {
        "/v1/tables": {"tables": [{"name": "t", "topic": "t-changelog", "partitions": 1, "key_column": "k"}]},
        "/v1/cluster": {"nodes": [{"node": r["node"], "address": r["address"], "read_address": r["address"],
                                   "alive": True, "heartbeat_age_ms": 0, "replicas": [r]} for r in replicas]},
        "/v1/tables/t/keys/k": {"table": "t", "key": "k", "value": {"v": 1}, "partition": 0,
                                "served_by": {"node": "n0", "role": "active"}, "lag": {"offsets": 0, "ms": 0}},
    }
    reads: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?")[0]
            if path.startswith("/v1/tables/t/keys/"):
                reads.append(time.monotonic())
                if path.endswith("/slow"):
                    time.sleep(1.3)  # past the client's request timeout (1 s)
                    path = "/v1/tables/t/keys/k"
            body = json.dumps(docs[path]).encode()
            try:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up first (the slow key)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", reads
    server.shutdown()
    server.server_close()


def test_the_sync_client_tries_the_store_nodes_once_then_answers_through_the_router(router):
    from prometheus_client import CollectorRegistry

    url, reads = router
    registry = CollectorRegistry()
    with Client(router=url, policy=POLICY, metrics=registry) as client:
        t0 = time.monotonic()
        got = client.get("t", "k")
        took = time.monotonic() - t0
    print(f"sync: answered through the router after {took:.3f}s")
    assert got.found and got.value == {"v": 1} and got.node == "n0"
    assert len(reads) == 1
    # The direct read gives up at half the request timeout; the router is asked once, right after.
    assert POLICY.request_timeout_ms / 2000 <= took < POLICY.request_timeout_ms / 1000, took
    assert registry.get_sample_value("freshroute_client_router_fallbacks_total", {"operation": "get"}) == 1
    assert registry.get_sample_value("freshroute_client_lookups_total", {"outcome": "timeout", "role": "none"}) \
        or registry.get_sample_value("freshroute_client_lookups_total", {"outcome": "unavailable", "role": "none"})


def test_the_async_client_does_the_same(router):
    url, reads = router

    async def read() -> tuple[float, object]:
        async with AsyncClient(router=url, policy=POLICY) as client:
            t0 = time.monotonic()
            got = await client.get("t", "k")
            return time.monotonic() - t0, got

    took, got = asyncio.run(read())
    print(f"async: answered through the router after {took:.3f}s")
    assert got.found and len(reads) == 1
    assert POLICY.request_timeout_ms / 2000 <= took < POLICY.request_timeout_ms / 1000, took


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_router_that_does_not_answer_in_time_is_a_timeout_at_the_request_timeout(router, kind):
    url, reads = router

    async def read_async() -> None:
        async with AsyncClient(router=url, policy=POLICY) as client:
            await client.get("t", "slow")

    def read() -> None:
        if kind == "async":
            asyncio.run(read_async())
        else:
            with Client(router=url, policy=POLICY) as client:
                client.get("t", "slow")

    t0 = time.monotonic()
    with pytest.raises(LookupTimeout) as e:
        read()
    took = time.monotonic() - t0
    assert e.value.code == "TIMEOUT" and "no answer within the request timeout" in e.value.message
    # Not before the request timeout, and not a later one's (the upper slack is a loaded machine's scheduling).
    assert len(reads) == 1 and POLICY.request_timeout_ms / 1000 <= took < POLICY.request_timeout_ms / 1000 + 1.0, took

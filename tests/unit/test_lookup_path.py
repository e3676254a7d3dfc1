"""The project files a REST point lookup runs code in, from socket to RocksDB and back (docs/architecture.md).

One lookup on a kept-alive connection, traced with a profiler, through the real pieces in one process on loopback:
the HTTP/1.1 protocol, the router, its store client, a store node's read port, a replica and its RocksDB store — as
production runs it: a caller's token checked against an auth file, and a freshness bound.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import orjson
import pytest
import uvicorn

from freshroute.lag import now_ms
from freshroute.keys import partition_for, serialize_key
from freshroute.metadata.roles import Role
from freshroute.metadata.tables import TableSpec
from freshroute.routing.fake import InMemoryStoreClient, fake_snapshot
from freshroute.routing.snapshot import FixedSnapshot
from freshroute.routing.store import StoreNodeClient
from router.auth import Guard, token_hash
from router.rest.app import create_app
from router.rest.routes import KeyHandlers
from router.routing import Router
from router.settings import RouterSettings
from router.transports.http1 import key_lookup_protocol
from store_node.read_port import ReadPort
from store_node.read_port_front import start_read_port
from store_node.replica import Replica
from store_node.replica_store import ReplicaStore

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"freshroute", "router", "store_node", "pipeline", "proto", "tools", "loadtest"}
SPEC = TableSpec("users", "users-changelog", 4, "id")
KEY = "alice"
TOKEN = "reader-token"
# The path's layers, each with the rooms a lookup may pass in it: the REST front (admission by the auth file, the
# router's parse of the bound), the routing core (selection, the attempt plan and its driver, the snapshot, the
# results), the store client, the wire both ends speak, the node's read port, replica and store, and the vocabulary
# they all speak (the clock, the bound, the lag, the position, the input lag; a key's bytes and partition). A lookup must cross every layer and run code nowhere
# else; how many rooms a layer has is its own business.
LAYERS = {
    "front": {"router/transports/http1.py", "router/rest/routes.py", "router/auth.py", "router/routing.py"},
    "routing": {"freshroute/routing/core.py", "freshroute/routing/selection.py", "freshroute/routing/attempts.py",
                "freshroute/routing/drivers.py", "freshroute/routing/snapshot.py", "freshroute/routing/results.py",
                "freshroute/routing/counts.py", "freshroute/routing/answers.py"},
    "store client": {"freshroute/routing/store.py"},
    "wire": {"freshroute/wire.py"},
    "store node": {"store_node/read_port_front.py", "store_node/read_port.py", "store_node/replica.py",
                   "store_node/replica_store.py"},
    "vocabulary": {"freshroute/bound.py", "freshroute/lag.py", "freshroute/position.py",
                   "freshroute/metadata/progress.py", "freshroute/formats.py", "freshroute/metadata/table_versions.py"},
}


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, bytes]:
    writer.write(f"GET /v1/tables/users/keys/{KEY}?max_lag=5&max_staleness_ms=60000 HTTP/1.1\r\nHost: router\r\n"
                 f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
    status = int((await asyncio.wait_for(reader.readline(), 5)).split()[1])
    length = 0
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def test_a_rest_point_lookup_crosses_every_layer_and_runs_code_in_no_other(tmp_path):
    partition = partition_for(serialize_key(KEY), SPEC.partitions)
    store = ReplicaStore.open(tmp_path / "users" / str(partition))
    store.apply([(KEY.encode(), b'{"age":31}')], 10)
    # The broker is heard from once; a wide window keeps that evidence fresh however slowly a busy machine starts.
    replica = Replica(SPEC, partition, Role.ACTIVE, store, now_ms, evidence_window_ms=120_000, caught_up_threshold=0)
    replica.lag.observe_end(10, now_ms())
    node = SimpleNamespace(node_id="n1", serving=MappingProxyType({("users", partition): replica}), draining=False)
    # The event loop's front: the compiled one answers on a thread of its own, which this thread's profiler misses.
    read_door = await start_read_port(ReadPort(node), "127.0.0.1", 0, front="python")
    read_port = read_door.port

    nodes = InMemoryStoreClient()  # only the heartbeat the router's snapshot is built from
    heartbeat = nodes.add_node("n1")
    heartbeat.host("users", partition, role=Role.ACTIVE, applied=10, end=10)
    heartbeat.read_address = f"127.0.0.1:{read_port}"
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"principals:\n  - name: readers\n    token_sha256: {token_hash(TOKEN)}\n    tables: [users]\n")
    settings = RouterSettings(hedge=False, auth_file=auth)
    metadata = FixedSnapshot(fake_snapshot(nodes, [SPEC], now_ms()))
    router = Router(settings, metadata, StoreNodeClient())
    router.on_snapshot(metadata.current)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    guard = Guard(auth)
    server = uvicorn.Server(uvicorn.Config(create_app(settings, router, guard=guard),
                                           http=key_lookup_protocol(KeyHandlers(router, guard)),
                                           lifespan="off", log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    files: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in PACKAGES:
                files.add(path.relative_to(ROOT).as_posix())

    try:
        for _ in range(200):
            if server.started:
                break
            assert not serving.done(), serving
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        for _ in range(2):  # connected, the store client's stream open, the key's partition located
            assert (await get(reader, writer))[0] == 200
        sys.setprofile(profile)
        try:
            status, body = await get(reader, writer)
        finally:
            sys.setprofile(None)
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        sock.close()
        read_door.close()
        replica.close()

    assert status == 200 and orjson.loads(body)["value"] == {"age": 31}
    assert {layer for layer, rooms in LAYERS.items() if not rooms & files} == set(), files
    assert files - set().union(*LAYERS.values()) == set()

"""The REST port's own protocol: key lookups answered on the connection, everything else handed to uvicorn."""

import asyncio
import socket

import orjson
import pytest
import uvicorn

from router.transports.http1 import AnswerWriter, answer_writer, key_lookup_protocol
from router.rest.routes import KeyHandlers
from router.rest.app import create_app

from .routing_support import TABLE, Cluster, part

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def served():
    """(cluster, port) of a uvicorn server on loopback whose HTTP protocol is the key lookup protocol."""
    cluster = Cluster()
    app = create_app(cluster.settings, cluster.router)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, http=key_lookup_protocol(KeyHandlers(cluster.router)), lifespan="off",
                                           log_level="warning", timeout_keep_alive=1))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield cluster, sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def exchange(port: int, raw: bytes, responses: int) -> list[tuple[int, dict, bytes]]:
    """Send ``raw`` on one connection; read ``responses`` answers as (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        out = []
        for _ in range(responses):
            status_line = await asyncio.wait_for(reader.readline(), 5)
            headers = {}
            while (line := await reader.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers["content-length"]))
            out.append((int(status_line.split()[1]), headers, body))
        return out
    finally:
        writer.close()


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: router\r\n{extra}\r\n".encode()


async def test_lookup_answered_in_one_response_with_the_app_body(served):
    cluster, port = served
    [(status, headers, body)] = await exchange(port, get(f"/v1/tables/{TABLE}/keys/sensor-3"), 1)
    assert status == 200 and headers["content-type"] == "application/json" and "date" in headers
    doc = orjson.loads(body)
    assert doc["key"] == "sensor-3" and doc["value"] == {"count": 3, "avg": 1.5} and doc["partition"] == part("sensor-3")
    [(status, _, body)] = await exchange(port, get(f"/v1/tables/{TABLE}/keys/nope?max_lag=5"), 1)
    assert status == 404 and orjson.loads(body)["error"]["code"] == "KEY_NOT_FOUND"
    [(status, _, body)] = await exchange(port, get(f"/v1/tables/{TABLE}/keys/sensor-3?max_lag=x"), 1)
    assert status == 400 and orjson.loads(body)["error"]["field"] == "max_lag"
    [(status, _, body)] = await exchange(port, get(f"/v1/tables/{TABLE}/keys/sensor-3/metadata"), 1)
    assert status == 200 and orjson.loads(body)["partition"] == part("sensor-3")


class _Transport:
    def __init__(self, log: list, closing: bool = False) -> None:
        self.log, self.closing = log, closing

    def write(self, data: bytes) -> None:
        self.log.append((self, data))

    def is_closing(self) -> bool:
        return self.closing


async def test_answer_writer_writes_the_answers_of_a_turn_together_after_it():
    loop = asyncio.get_running_loop()
    writer = AnswerWriter(loop)
    log: list = []
    a, b, gone = _Transport(log), _Transport(log), _Transport(log, closing=True)
    writer.write(a, b"1")
    writer.write(gone, b"x")
    writer.write(b, b"2")
    writer.write(a, b"3")
    assert log == []  # nothing leaves during the turn that worked the answers out
    await asyncio.sleep(0)
    assert log == [(a, b"1"), (b, b"2"), (a, b"3")]  # in order; a closed connection's answer is dropped
    writer.write(b, b"4")
    writer.flush()  # a close or hand-over flushes first: nothing is left for the next turn
    await asyncio.sleep(0)
    assert log[3:] == [(b, b"4")]
    assert answer_writer(loop) is answer_writer(loop)


async def test_concurrent_lookups_on_many_connections_each_get_their_own_answer(served):
    _, port = served
    keys = [f"sensor-{i % 6}" if i % 5 else "nope" for i in range(40)]
    answers = await asyncio.gather(*(exchange(port, get(f"/v1/tables/{TABLE}/keys/{k}"), 1) for k in keys))
    assert [a[0][0] for a in answers] == [404 if k == "nope" else 200 for k in keys]
    assert [orjson.loads(a[0][2]).get("key") or orjson.loads(a[0][2])["error"]["key"] for a in answers] == keys


async def test_keep_alive_and_pipelined_requests_answered_in_order(served):
    _, port = served
    keys = ["sensor-1", "nope", "sensor-2", "sensor-5"]
    answers = await exchange(port, b"".join(get(f"/v1/tables/{TABLE}/keys/{k}") for k in keys), len(keys))
    assert [s for s, _, _ in answers] == [200, 404, 200, 200]
    assert [orjson.loads(b).get("key") or orjson.loads(b)["error"]["key"] for _, _, b in answers] == keys


async def test_other_requests_hand_the_connection_to_uvicorn_after_the_answers_owed(served):
    _, port = served
    body = orjson.dumps({"keys": ["sensor-1", "sensor-2"]})
    raw = (get(f"/v1/tables/{TABLE}/keys/sensor-1") + get("/healthz")
           + f"POST /v1/tables/{TABLE}/keys:batchGet HTTP/1.1\r\nHost: router\r\ncontent-type: application/json\r\n"
             f"content-length: {len(body)}\r\n\r\n".encode() + body
           + get(f"/v1/tables/{TABLE}/keys/sensor-2"))
    (s1, _, b1), (s2, _, b2), (s3, _, b3), (s4, _, b4) = await exchange(port, raw, 4)
    assert (s1, orjson.loads(b1)["key"]) == (200, "sensor-1")
    assert (s2, orjson.loads(b2)) == (200, {"status": "ok"})
    assert s3 == 200 and [r["key"] for r in orjson.loads(b3)["results"]] == ["sensor-1", "sensor-2"]
    assert (s4, orjson.loads(b4)["key"]) == (200, "sensor-2")
    # A first request that is not a lookup goes to uvicorn at once; so do HEAD and unknown paths.
    [(status, _, b)] = await exchange(port, get("/v1/tables"), 1)
    assert status == 200 and orjson.loads(b)["tables"][0]["name"] == TABLE
    [(status, _, _)] = await exchange(port, get("/nope"), 1)
    assert status == 404


async def test_encoded_keys_and_connection_close(served):
    cluster, port = served
    key = "a/b c"
    cluster.n1.replicas[(TABLE, part(key))].data[key.encode()] = b'{"x":1}'
    cluster.n2.replicas[(TABLE, part(key))].data[key.encode()] = b'{"x":1}'
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(get(f"/v1/tables/{TABLE}/keys/a%2Fb%20c", "Connection: close\r\n"))
        raw = await asyncio.wait_for(reader.read(), 5)  # the server closes after its answer
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head
    assert orjson.loads(body)["key"] == key


async def test_malformed_request_is_a_400_and_closes(served):
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /v1/tables/x/keys/y HTTP/1.1\r\nHost router\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    assert raw.startswith(b"HTTP/1.1 400")


async def test_idle_connection_closed_after_the_keep_alive_timeout(served):
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(get(f"/v1/tables/{TABLE}/keys/sensor-1"))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.startswith(b"content-length")))
        await reader.readexactly(length)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed once idle for timeout_keep_alive (1 s)
        assert 0.5 < loop.time() - t0 < 4
    finally:
        writer.close()


async def test_graceful_shutdown_answers_the_lookup_in_flight_then_closes():
    cluster = Cluster()
    for node in (cluster.n1, cluster.n2):
        node.delay_s = 0.3
    app = create_app(cluster.settings, cluster.router)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    server = uvicorn.Server(uvicorn.Config(app, http=key_lookup_protocol(KeyHandlers(cluster.router)), lifespan="off",
                                           log_level="warning", timeout_graceful_shutdown=5))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        writer.write(get(f"/v1/tables/{TABLE}/keys/sensor-1"))
        await writer.drain()
        await asyncio.sleep(0.1)
        server.should_exit = True  # while the lookup waits for its slow replica
        raw = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head
        assert orjson.loads(body)["key"] == "sensor-1"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()

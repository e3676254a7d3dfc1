"""loadtest.http_load: answers parsed from the bytes however they arrive, the socket's holder found in /proc, and the
rate held over keep-alive connections to a fake server, one that closes its connections too."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time

import pytest

from loadtest.http_load import NO_ANSWER, Connection, RateLoad, Response, holder, socket_inode

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"a\": 1234}"
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True


def connection() -> tuple[Connection, Transport]:
    conn, transport = Connection("127.0.0.1"), Transport()
    conn.connection_made(transport)
    return conn, transport


def test_answers_in_pieces_and_two_in_one_chunk_each_go_to_their_request():
    async def go():
        conn, transport = connection()
        first = asyncio.ensure_future(conn.get(b"/v1/tables/t/keys/k1", 5))
        await asyncio.sleep(0)
        assert transport.written == [b"GET /v1/tables/t/keys/k1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"]
        for i in range(0, len(OK), 7):  # a byte stream cut anywhere: in the status line, a header, the body
            conn.data_received(OK[i:i + 7])
        assert await first == Response(200, b'{"a": 1234}', True)
        second = asyncio.ensure_future(conn.get(b"/k2", 5))
        await asyncio.sleep(0)
        conn.data_received(NOT_FOUND)
        assert await second == Response(404, b"{}", False)  # the server closes it: the load opens another

    asyncio.run(go())


def test_a_lost_connection_a_garbled_answer_and_no_answer_in_time_are_errors():
    async def go():
        conn, _ = connection()
        pending = asyncio.ensure_future(conn.get(b"/k", 5))
        await asyncio.sleep(0)
        conn.connection_lost(None)
        with pytest.raises(ConnectionError, match="closed before the answer"):
            await pending
        with pytest.raises(ConnectionError, match="closed"):
            await conn.get(b"/k", 5)

        conn, transport = connection()
        pending = asyncio.ensure_future(conn.get(b"/k", 5))
        await asyncio.sleep(0)
        conn.data_received(b"SMTP ready\r\n\r\n")
        with pytest.raises(ConnectionError, match="not an HTTP/1.1 answer"):
            await pending
        assert transport.closed

        conn, _ = connection()
        with pytest.raises(TimeoutError):
            await conn.get(b"/k", 0.01)

    asyncio.run(go())


def test_the_socket_of_a_connection_and_the_process_holding_it(tmp_path):
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n"
        "   1: 0100007F:1F90 0200007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 222 1\n"
        "   2: 0200007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 333 1\n"
        "   3: 0100007F:1F90 0200007F:D432 01 00000000:00000000 00:00000000 00000000     0        0 0 1\n")
    if sys.byteorder != "little":
        pytest.skip("the table above is a little-endian machine's")
    assert socket_inode(("127.0.0.1", 8080), ("127.0.0.2", 54321), str(table)) == 222
    assert socket_inode(("127.0.0.2", 54321), ("127.0.0.1", 8080), str(table)) == 333
    assert socket_inode(("127.0.0.1", 8080), ("127.0.0.2", 54322), str(table)) is None  # queued: no file yet
    assert socket_inode(("127.0.0.1", 8081), ("127.0.0.2", 54321), str(table)) is None

    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    try:
        inode = socket_inode(served.getsockname(), served.getpeername())
        assert inode == os.stat(f"/proc/self/fd/{served.fileno()}").st_ino
        assert holder(inode, {"gone": 2 ** 22 + 1, "this": os.getpid()}) == "this"
        assert holder(inode, {"init": 1}) is None
    finally:
        for s in (served, client, listener):
            s.close()


async def serve(close_every: int) -> tuple[asyncio.Server, list[bytes]]:
    """A fake router: 200 to every GET, and connection: close to each ``close_every``th request of a connection."""
    targets: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        except asyncio.IncompleteReadError:
            writer.close()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        while head := await reader.readuntil(b"\r\n\r\n"):  # the load closes its connections as it ends
            n += 1
            targets.append(head.split(b" ")[1])
            close = n % close_every == 0
            writer.write(OK.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n") if close else OK)
            await writer.drain()
            if close:
                writer.close()
                return

    return await asyncio.start_server(handle, "127.0.0.1", 0), targets


def test_the_rate_is_held_over_every_connection_and_a_closed_one_is_opened_again():
    answers: list[tuple[str, int, bytes]] = []

    async def go() -> RateLoad:
        server, targets = await serve(close_every=10)
        port = server.sockets[0].getsockname()[1]
        until = time.monotonic() + 1.0
        load = RateLoad("127.0.0.1", port, 400, 8, lambda rng: b"/k%d" % rng.randrange(3),
                        lambda *a: answers.append(a), lambda: time.monotonic() > until,
                        routers={"this": os.getpid()})  # the fake server is this process: every connection lands
        await load.run()
        server.close()
        assert set(targets) == {b"/k0", b"/k1", b"/k2"}
        return load

    load = asyncio.run(go())
    # 400/s for a second, each connection's first request staggered; never over the rate. A reconnect's time is not
    # made up (no burst after it): 40 of them on 2 busy cores cost up to a quarter of the second.
    assert 300 <= len(answers) <= 420, len(answers)
    assert set(answers) == {("this", 200, b'{"a": 1234}')}
    assert NO_ANSWER not in {status for _, status, _ in answers}
    assert load.reconnects >= 30  # every 10th answer closed its connection


def test_a_router_refusing_connections_fails_each_lookup_due_and_the_load_goes_on():
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    answers: list[tuple[str, int, bytes]] = []
    until = time.monotonic() + 0.5
    load = RateLoad("127.0.0.1", port, 100, 2, lambda rng: b"/k", lambda *a: answers.append(a),
                    lambda: time.monotonic() > until)
    asyncio.run(load.run())
    assert 35 <= len(answers) <= 55, len(answers)  # 100/s for half a second, each a failure
    assert set(answers) == {(f"127.0.0.1:{port}", NO_ANSWER, b"")}

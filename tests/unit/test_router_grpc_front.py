"""The gRPC front's HTTP/2, frame by frame: what real clients rarely do, and what a broken peer does.

What gRPC clients see of the public surface is covered, against both ways of serving it,
in test_router_grpc.py; here a bare HTTP/2 client checks flow control, header blocks,
pings, refusals and shutdown.
"""

import asyncio
import json
import struct

import hpack
import pytest

from proto import router_pb2
from router.grpc_server import PublicGrpc
from router.transports.http2 import frames as h2
from router.transports.http2.state import STREAM_WINDOW
from router.settings import RouterSettings

from .routing_support import KEYS, TABLE, Cluster, part

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("one_event_loop")]


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


class Peer:
    """A bare HTTP/2 client: frames out as asked, frames in one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()

    @classmethod
    async def connect(cls, port: int, settings: dict[int, int] | None = None, preface: bytes = h2.PREFACE) -> "Peer":
        peer = cls(*await asyncio.open_connection("127.0.0.1", port))
        payload = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
        peer.writer.write(preface + h2.frame(h2.SETTINGS, 0, 0, payload))
        return peer

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))

    def request_block(self, path: str, content_type: str = "application/grpc") -> bytes:
        return self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                    (":authority", "router"), ("content-type", content_type), ("te", "trailers")])

    def call(self, stream_id: int, path: str, message: bytes) -> None:
        self.send(h2.frame(h2.HEADERS, h2.END_HEADERS, stream_id, self.request_block(path)),
                  h2.frame(h2.DATA, h2.END_STREAM, stream_id, struct.pack(">BI", 0, len(message)) + message))

    async def frame(self, timeout: float = 5.0) -> tuple[int, int, int, bytes]:
        head = await asyncio.wait_for(self.reader.readexactly(9), timeout)
        hi, lo, kind, flags, stream_id = struct.unpack(">BHBBI", head)
        payload = await asyncio.wait_for(self.reader.readexactly((hi << 16) | lo), timeout)
        return kind, flags, stream_id, payload

    async def until(self, kind: int, stream_id: int | None = None) -> tuple[int, int, int, bytes]:
        while True:
            f = await self.frame()
            if f[0] == kind and (stream_id is None or f[2] == stream_id):
                return f

    async def answer(self, stream_id: int) -> tuple[dict[str, str], bytes, dict[str, str]]:
        """(response headers, DATA, trailers) of one call, acknowledging nothing."""
        headers: dict[str, str] = {}
        data = b""
        while True:
            kind, flags, sid, payload = await self.frame()
            if sid != stream_id:
                continue
            if kind == h2.HEADERS:
                block = dict((k.decode(), v.decode()) for k, v in self.decoder.decode(payload, raw=True))
                if flags & h2.END_STREAM:
                    return headers, data, block
                headers = block
            elif kind == h2.DATA:
                data += payload
                if flags & h2.END_STREAM:
                    return headers, data, {}

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


@pytest.fixture
async def front():
    cluster = Cluster(RouterSettings(grpc_port=0, request_timeout_ms=2000, attempt_timeout_ms=1500, hedge=False))
    server = PublicGrpc(cluster.settings, cluster.router)
    port = await server.start()
    try:
        yield cluster, server, port
    finally:
        await server.stop(None)


def get_request(key: str) -> bytes:
    return router_pb2.GetRequest(table=TABLE, key=key).SerializeToString()


def messages(data: bytes) -> list[bytes]:
    out = []
    while data:
        flag, length = struct.unpack_from(">BI", data)
        assert flag == 0
        out.append(data[5:5 + length])
        data = data[5 + length:]
    return out


async def test_server_settings_first_and_pings_answered(front):
    _, _, port = front
    peer = await Peer.connect(port)
    kind, flags, sid, payload = await peer.frame()
    assert (kind, flags, sid) == (h2.SETTINGS, 0, 0)
    settings = dict(struct.unpack_from(">HI", payload, i) for i in range(0, len(payload), 6))
    assert settings[h2.INITIAL_WINDOW_SIZE] == STREAM_WINDOW and settings[h2.MAX_CONCURRENT_STREAMS] == 1000
    await peer.until(h2.SETTINGS)  # the acknowledgement of ours
    peer.send(h2.frame(h2.PING, 0, 0, b"12345678"))
    kind, flags, sid, payload = await peer.until(h2.PING)
    assert (flags, payload) == (h2.ACK, b"12345678")
    await peer.close()


async def test_get_answered_in_place(front):
    _, _, port = front
    peer = await Peer.connect(port)
    peer.call(1, "/freshroute.v1.Router/Get", get_request("sensor-3"))
    headers, data, trailers = await peer.answer(1)
    assert headers[":status"] == "200" and headers["content-type"] == "application/grpc"
    assert trailers == {"grpc-status": "0"}
    (msg,) = messages(data)
    r = router_pb2.GetResponse.FromString(msg)
    assert r.found and r.key == "sensor-3" and r.partition == part("sensor-3")
    assert json.loads(r.value_json) == {"count": 3, "avg": 1.5}
    await peer.close()


async def test_the_answer_waits_for_the_clients_window(front):
    _, _, port = front
    peer = await Peer.connect(port, {h2.INITIAL_WINDOW_SIZE: 10})
    peer.call(1, "/freshroute.v1.Router/Get", get_request("sensor-3"))
    await peer.until(h2.HEADERS, 1)
    kind, flags, _, first = await peer.until(h2.DATA, 1)
    assert len(first) == 10 and not flags & h2.END_STREAM
    with pytest.raises(asyncio.TimeoutError):  # nothing more until the window opens
        await peer.frame(timeout=0.3)
    peer.send(h2.frame(h2.WINDOW_UPDATE, 0, 1, struct.pack(">I", 10_000)))
    headers, rest, trailers = await peer.answer(1)
    assert trailers == {"grpc-status": "0"}
    (msg,) = messages(first + rest)
    assert router_pb2.GetResponse.FromString(msg).key == "sensor-3"
    await peer.close()


async def test_a_relayed_stream_waits_for_the_clients_window_too(front):
    _, _, port = front
    peer = await Peer.connect(port, {h2.INITIAL_WINDOW_SIZE: 40})
    peer.call(1, "/freshroute.v1.Router/Scan", router_pb2.ScanRequest(table=TABLE, prefix="sensor-").SerializeToString())
    received = b""
    while len(received) < 40:
        received += (await peer.until(h2.DATA, 1))[3]
    assert len(received) == 40
    with pytest.raises(asyncio.TimeoutError):
        await peer.frame(timeout=0.3)
    peer.send(h2.frame(h2.WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20)))
    _, rest, trailers = await peer.answer(1)
    assert trailers.get("grpc-status") == "0"
    *items, last = [router_pb2.ScanItem.FromString(m) for m in messages(received + rest)]
    assert [i.key for i in items] == sorted(KEYS) and len(last.summary.partitions) == 4
    await peer.close()


async def test_a_header_block_over_continuation_frames(front):
    _, _, port = front
    peer = await Peer.connect(port)
    block = peer.request_block("/freshroute.v1.Router/Get")
    message = get_request("sensor-2")
    peer.send(h2.frame(h2.HEADERS, 0, 1, block[:5]), h2.frame(h2.CONTINUATION, 0, 1, block[5:9]),
              h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, block[9:]),
              # the message in two DATA frames, the second padded
              h2.frame(h2.DATA, 0, 1, struct.pack(">BI", 0, len(message)) + message[:3]),
              h2.frame(h2.DATA, h2.END_STREAM | h2.PADDED, 1, bytes([4]) + message[3:] + b"\0" * 4))
    _, data, trailers = await peer.answer(1)
    assert trailers == {"grpc-status": "0"}
    assert router_pb2.GetResponse.FromString(messages(data)[0]).key == "sensor-2"
    await peer.close()


@pytest.mark.parametrize("body,expected", [
    (b"", "carried none"),
    (struct.pack(">BI", 0, 3) + b"\xff\xff\xff", "not a GetRequest"),
    (struct.pack(">BI", 0, 1) + b"\x08\x01", "exactly one"),
])
async def test_a_malformed_request_is_invalid_argument(front, body, expected):
    _, _, port = front
    peer = await Peer.connect(port)
    peer.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, peer.request_block("/freshroute.v1.Router/Get")),
              h2.frame(h2.DATA, h2.END_STREAM, 1, body))
    headers, data, trailers = await peer.answer(1)
    assert data == b"" and trailers[":status"] == "200"  # trailers-only
    assert trailers["grpc-status"] == "3" and expected in trailers["grpc-message"]
    assert json.loads(trailers["freshroute-error"])["error"]["code"] == "INVALID_ARGUMENT"
    await peer.close()


async def test_a_compressed_message_is_unimplemented(front):
    _, _, port = front
    peer = await Peer.connect(port)
    message = get_request("sensor-1")
    peer.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, peer.request_block("/freshroute.v1.Router/Get")),
              h2.frame(h2.DATA, h2.END_STREAM, 1, struct.pack(">BI", 1, len(message)) + message))
    _, _, trailers = await peer.answer(1)
    assert trailers["grpc-status"] == "12"
    await peer.close()


async def test_not_grpc_gets_415_once_its_request_ends_and_the_connection_lives_on(front):
    _, _, port = front
    peer = await Peer.connect(port)
    peer.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1,
                       peer.request_block("/freshroute.v1.Router/Get", content_type="application/json")))
    peer.send(h2.frame(h2.DATA, 0, 1, b'{"key": '))
    await asyncio.sleep(0.05)
    peer.send(h2.frame(h2.DATA, h2.END_STREAM, 1, b'"sensor-1"}'))
    kind, flags, _, payload = await peer.until(h2.HEADERS, 1)
    headers = dict(peer.decoder.decode(payload))
    assert not flags & h2.END_STREAM
    assert headers[":status"] == "415" and headers["content-type"].startswith("text/plain")
    kind, flags, _, body = await peer.until(h2.DATA, 1)
    assert flags & h2.END_STREAM and b"application/grpc" in body
    peer.call(3, "/freshroute.v1.Router/Get", get_request("sensor-1"))
    _, _, trailers = await peer.answer(3)
    assert trailers == {"grpc-status": "0"}
    await peer.close()


async def test_an_unknown_method_is_unimplemented(front):
    _, _, port = front
    peer = await Peer.connect(port)
    peer.call(1, "/freshroute.v1.Router/Nope", b"")
    _, _, trailers = await peer.answer(1)
    assert trailers["grpc-status"] == "12"
    await peer.close()


@pytest.mark.parametrize("garbage,code", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", h2.PROTOCOL_ERROR),
    (h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0) + h2.frame(h2.DATA, 0, 7, b"x"), h2.PROTOCOL_ERROR),
    (h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0) + h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\xff\xff\xff\xff"),
     h2.COMPRESSION_ERROR),
    (h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0) + struct.pack(">BHBBI", 0, 20_000, h2.DATA, 0, 1), h2.FRAME_SIZE_ERROR),
])
async def test_a_broken_peer_gets_goaway_and_is_disconnected(front, garbage, code):
    _, server, port = front
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(garbage)
    peer = Peer(reader, writer)
    kind, _, _, payload = await peer.until(h2.GOAWAY)
    assert struct.unpack_from(">II", payload)[1] == code
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
    await asyncio.sleep(0.05)
    assert not server.connections
    writer.close()


async def test_a_reset_call_is_cancelled(front):
    cluster, _, port = front
    cluster.n1.delay_s = cluster.n2.delay_s = 1.0
    peer = await Peer.connect(port)
    peer.call(1, "/freshroute.v1.Router/Get", get_request("sensor-1"))
    await asyncio.sleep(0.2)
    peer.send(h2.frame(h2.RST_STREAM, 0, 1, struct.pack(">I", 0x8)))
    cluster.n1.delay_s = cluster.n2.delay_s = 0.0
    peer.call(3, "/freshroute.v1.Router/Get", get_request("sensor-2"))
    _, _, trailers = await peer.answer(3)
    assert trailers == {"grpc-status": "0"}
    with pytest.raises(asyncio.TimeoutError):  # stream 1 is never answered
        await asyncio.wait_for(peer.until(h2.HEADERS, 1), 1.5)
    await peer.close()


async def test_stop_lets_calls_in_flight_finish_and_refuses_new_ones(front):
    cluster, server, port = front
    cluster.n1.delay_s = cluster.n2.delay_s = 0.3
    peer = await Peer.connect(port)
    peer.call(1, "/freshroute.v1.Router/Get", get_request("sensor-1"))
    await asyncio.sleep(0.1)
    stopping = asyncio.create_task(server.stop(5))
    kind, _, _, payload = await peer.until(h2.GOAWAY)
    assert struct.unpack_from(">II", payload) == (1, h2.NO_ERROR)  # stream 1 will still be answered
    peer.call(3, "/freshroute.v1.Router/Get", get_request("sensor-2"))
    kind, _, sid, payload = await peer.until(h2.RST_STREAM)
    assert sid == 3 and struct.unpack(">I", payload)[0] == h2.REFUSED_STREAM
    _, data, trailers = await peer.answer(1)
    assert trailers == {"grpc-status": "0"} and router_pb2.GetResponse.FromString(messages(data)[0]).found
    await asyncio.wait_for(stopping, 5)
    assert await asyncio.wait_for(peer.reader.read(), 5) == b""
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def relays_running() -> list[str]:
    await asyncio.sleep(0.2)
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("grpc-relay-")]


async def test_a_relayed_call_reset_by_the_client_ends_its_relay(front):
    _, _, port = front
    peer = await Peer.connect(port)
    # Health.Watch answers once and then streams until the client goes away.
    peer.call(1, "/grpc.health.v1.Health/Watch", b"")
    await peer.until(h2.DATA, 1)
    assert await relays_running() == ["grpc-relay-1"]
    peer.send(h2.frame(h2.RST_STREAM, 0, 1, struct.pack(">I", 0x8)))
    assert await relays_running() == []
    await peer.close()


async def test_a_relayed_call_failed_before_the_client_ended_it_is_reset_and_its_relay_ends(front):
    _, _, port = front
    peer = await Peer.connect(port)
    message = router_pb2.ListTablesRequest().SerializeToString()
    peer.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, peer.request_block("/freshroute.v1.Router/ListTables")),
              h2.frame(h2.DATA, 0, 1, struct.pack(">BI", 1, len(message)) + message))  # compressed, no END_STREAM
    _, _, trailers = await peer.answer(1)
    assert trailers["grpc-status"] == "12"
    kind, _, sid, payload = await peer.until(h2.RST_STREAM)
    assert sid == 1 and struct.unpack(">I", payload)[0] == h2.NO_ERROR
    assert await relays_running() == []
    await peer.close()

"""The router's hand-written transports held to their protocols by independent peers, on a real router process.

HTTP/2 (the gRPC port): frames built and parsed by the h2 project's own framing and HPACK
(``hyperframe``, ``hpack``), covering what RFC 9113 requires of a server — each case twice:
over a socket to the router process (its compiled path's gRPC port: the h2 crate, behind
``native/dataplane/src/peer_frames.rs``), and as byte strings fed straight to the Python front's protocol machine
(:class:`router.transports.http2.connection.H2Connection`), whose answers to Get a stand-in writes here.
gRPC: grpcio's client for every method. HTTP/1.1 (the REST port): raw sockets. Every case
asserts its defined answer (GOAWAY code, RST_STREAM code, gRPC status, HTTP status) and that
the router still answers lookups afterwards; the router's memory is compared before and after
the suite.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple
from xml.etree import ElementTree

import grpc
import hpack
import httpx
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hyperframe.frame import (ContinuationFrame, DataFrame, Frame, GoAwayFrame, HeadersFrame, PingFrame,
                              PriorityFrame, RstStreamFrame, SettingsFrame, WindowUpdateFrame)

from freshroute import proc
from proto import router_pb2, router_pb2_grpc
from router.transports.http2.connection import H2Connection
from router.transports.http2.events import DataReceived, RequestEnded, RequestStarted

from .router_deployment import KEYS, PARTITIONS, TABLE, WATERMARK_MS, WINDOW_STARTS, WINDOWED, Deployment, Procs, value_of

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no Spark, no shared stack: runs beside the others

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GET = "/freshroute.v1.Router/Get"
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED = 0x0, 0x1, 0x3, 0x5
FRAME_SIZE_ERROR, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x6, 0x9, 0xb


class Router(NamedTuple):
    deployment: Deployment
    pid: int
    rss_before: int  # KiB, once it has answered lookups of both kinds


@pytest.fixture(scope="module")
def router(tmp_path_factory, broker, redis_service):
    """A router process (gRPC front on) over real Redis and three real store nodes."""
    d = Deployment(Procs(tmp_path_factory.mktemp("conformance")), broker, redis_service.address,
                   f"t{uuid.uuid4().hex[:10]}")
    try:
        d.up()
        lookups_answered(d)
        pid = d.procs.procs["router"].pid
        yield Router(d, pid, rss_kib(pid))
    finally:
        d.procs.stop_all()


def rss_kib(pid: int) -> int:
    kib = proc.rss_kib(pid)
    assert kib is not None, "no VmRSS"
    return kib


def lookups_answered(d: Deployment) -> None:
    """A REST and a gRPC lookup, each on a new connection, answer the right value."""
    r = httpx.get(f"{d.rest}/v1/tables/{TABLE}/keys/sensor-7", timeout=5)
    assert r.status_code == 200 and r.json()["value"] == value_of(7)
    with grpc.insecure_channel(f"127.0.0.1:{d.grpc_port}") as channel:
        got = router_pb2_grpc.RouterStub(channel).Get(router_pb2.GetRequest(table=TABLE, key="sensor-8"), timeout=5)
    assert orjson.loads(got.value_json) == value_of(8)


# ---- a raw HTTP/2 peer ------------------------------------------------------------------------

class Peer:
    """A client connection that sends whatever frames it is given and reads the server's frame by frame."""

    def __init__(self, preface: bytes = PREFACE) -> None:
        self.encoder = hpack.Encoder()
        self.buffer = b""
        self._write(preface + SettingsFrame(0).serialize())

    def _write(self, data: bytes) -> None:
        raise NotImplementedError

    def _read(self) -> bytes:
        """More of what the server sent; empty once it has closed the connection."""
        raise NotImplementedError

    def send(self, *frames: Frame | bytes) -> None:
        self._write(b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames))

    def headers(self, stream_id: int, path: str = GET, end_stream: bool = False, fields=None) -> HeadersFrame:
        fields = fields if fields is not None else request_fields(path)
        flags = ["END_HEADERS"] + (["END_STREAM"] if end_stream else [])
        return HeadersFrame(stream_id, self.encoder.encode(fields), flags=flags)

    def call(self, stream_id: int, key: str = "sensor-3") -> None:
        """A well-formed Router.Get on ``stream_id``."""
        body = router_pb2.GetRequest(table=TABLE, key=key).SerializeToString()
        self.send(self.headers(stream_id), DataFrame(stream_id, struct.pack(">BI", 0, len(body)) + body,
                                                    flags=["END_STREAM"]))

    def frame(self) -> Frame | None:
        """The next frame, or None once the server has closed the connection."""
        while True:
            if len(self.buffer) >= 9:
                f, length = Frame.parse_frame_header(memoryview(self.buffer[:9]))
                if len(self.buffer) >= 9 + length:
                    f.parse_body(memoryview(self.buffer[9:9 + length]))
                    self.buffer = self.buffer[9 + length:]
                    return f
            data = self._read()
            if not data:
                return None
            self.buffer += data

    def until(self, kind: type | tuple[type, ...], stream_id: int | None = None) -> Frame:
        while (f := self.frame()) is not None:
            if isinstance(f, kind) and (stream_id is None or f.stream_id == stream_id):
                return f
        raise AssertionError(f"the connection closed before a {kind}")

    def goaway(self) -> int:
        """The error code of the server's GOAWAY; the server must then close the connection."""
        code = self.until(GoAwayFrame).error_code
        while self.frame() is not None:
            pass
        return code

    def answer(self, stream_id: int) -> tuple[dict[str, str], bytes]:
        """(trailers, DATA) of one call; answers of other streams are skipped."""
        decoder, data = hpack.Decoder(), b""
        while (f := self.frame()) is not None:
            if f.stream_id != stream_id:
                if isinstance(f, HeadersFrame):
                    decoder.decode(f.data)  # keep the decoder's table in step
                continue
            if isinstance(f, HeadersFrame):
                fields = dict(decoder.decode(f.data))
                if "END_STREAM" in f.flags:
                    return fields, data
            elif isinstance(f, DataFrame):
                data += f.data
            elif isinstance(f, RstStreamFrame):
                raise AssertionError(f"stream {stream_id} reset with {f.error_code}")
        raise AssertionError("the connection closed before the answer")

    def close(self) -> None:
        pass


class SocketPeer(Peer):
    """The peer over a socket to the router process."""

    def __init__(self, port: int, preface: bytes = PREFACE) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        super().__init__(preface)

    def _write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self) -> bytes:
        try:
            return self.sock.recv(65536)
        except ConnectionResetError:
            return b""

    def close(self) -> None:
        self.sock.close()


class MachinePeer(Peer):
    """The peer's bytes fed straight to the HTTP/2 machine in this process; each Get is answered as the test
    deployment would (its value), through the machine's own interface, with an encoder of the h2 project's."""

    def __init__(self, preface: bytes = PREFACE) -> None:
        self.machine = H2Connection()
        self.machine.initiate()
        self.server_encoder = hpack.Encoder()
        self.requests: dict[int, bytes] = {}
        super().__init__(preface)

    def _write(self, data: bytes) -> None:
        for event in self.machine.receive(data):
            if isinstance(event, RequestStarted):
                self.requests[event.stream_id] = b""
            elif isinstance(event, DataReceived):
                self.requests[event.stream_id] += event.data
                self.machine.consumed(event.stream_id, event.size)
            elif isinstance(event, RequestEnded):
                self._answer(event.stream_id, self.requests.pop(event.stream_id))

    def _answer(self, stream_id: int, body: bytes) -> None:
        key = router_pb2.GetRequest.FromString(body[5:]).key
        reply = router_pb2.GetResponse(table=TABLE, key=key, value_json=orjson.dumps(
            value_of(int(key.rpartition("-")[2]))).decode()).SerializeToString()
        self.machine.send_headers(stream_id, self.server_encoder.encode(
            [(":status", "200"), ("content-type", "application/grpc")]))
        self.machine.send_data(stream_id, struct.pack(">BI", 0, len(reply)) + reply)
        self.machine.send_trailers(stream_id, self.server_encoder.encode([("grpc-status", "0")]))

    def _read(self) -> bytes:
        return self.machine.data_to_send()

    def goaway(self) -> int:
        code = super().goaway()
        assert self.machine.state.closed  # the server's side: the connection is to be closed
        return code


@pytest.fixture(params=["socket", "bytes"])
def open_peer(request, router):
    """Opens a peer on the router process's gRPC port, or on a protocol machine of its own."""
    if request.param == "socket":
        return lambda preface=PREFACE: SocketPeer(router.deployment.grpc_port, preface)
    return MachinePeer


def request_fields(path: str = GET) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "router"),
            ("content-type", "application/grpc"), ("te", "trailers")]


def assert_get_answered(peer: Peer, stream_id: int) -> None:
    """The same connection still answers a lookup."""
    peer.call(stream_id)
    trailers, data = peer.answer(stream_id)
    assert trailers["grpc-status"] == "0"
    assert orjson.loads(router_pb2.GetResponse.FromString(data[5:]).value_json) == value_of(3)


def connection_error(open_peer, *frames: Frame | bytes, preface: bytes = PREFACE) -> int:
    peer = open_peer(preface)
    try:
        peer.send(*frames)
        return peer.goaway()
    finally:
        peer.close()


# ---- HTTP/2: connection errors ----------------------------------------------------------------

def test_a_bad_preface_is_a_protocol_error(open_peer, router):
    assert connection_error(open_peer, preface=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == PROTOCOL_ERROR
    lookups_answered(router.deployment)


def test_a_frame_larger_than_the_advertised_maximum_is_a_frame_size_error(open_peer, router):
    oversized = struct.pack(">BHBBI", 0, 16_385, 0x0, 0, 1) + b"\0" * 16_385
    assert connection_error(open_peer, oversized) == FRAME_SIZE_ERROR
    lookups_answered(router.deployment)


def test_continuation_without_headers_is_a_protocol_error(open_peer):
    assert connection_error(open_peer, ContinuationFrame(1, b"\x82", flags=["END_HEADERS"])) == PROTOCOL_ERROR


def test_a_header_block_interrupted_by_another_frame_is_a_protocol_error(open_peer):
    peer = open_peer()
    block = peer.encoder.encode(request_fields())
    peer.send(HeadersFrame(1, block[:5]), PingFrame(0, b"12345678"))
    assert peer.goaway() == PROTOCOL_ERROR


def test_a_header_block_larger_than_advertised_is_a_compression_error(open_peer):
    peer = open_peer()
    chunk = b"\0" * 16_000
    frames = [HeadersFrame(1, chunk)] + [ContinuationFrame(1, chunk) for _ in range(4)]
    peer.send(*frames)
    assert peer.goaway() == COMPRESSION_ERROR


@pytest.mark.parametrize("frame, code", [
    (WindowUpdateFrame(0, window_increment=2**31 - 1), FLOW_CONTROL_ERROR),
    (WindowUpdateFrame(0, window_increment=0), PROTOCOL_ERROR),
    (DataFrame(5, b"x"), PROTOCOL_ERROR),  # DATA on an idle stream
    (RstStreamFrame(5, error_code=0), PROTOCOL_ERROR),  # RST_STREAM on an idle stream
    (WindowUpdateFrame(5, window_increment=10), PROTOCOL_ERROR),  # WINDOW_UPDATE on an idle stream
    (HeadersFrame(2, b"", flags=["END_HEADERS"]), PROTOCOL_ERROR),  # a stream id a client may not open
    (struct.pack(">BHBBI", 0, 4, 0x6, 0, 0) + b"1234", FRAME_SIZE_ERROR),  # a PING of 4 bytes
    (struct.pack(">BHBBI", 0, 8, 0x6, 0, 1) + b"12345678", PROTOCOL_ERROR),  # PING on a stream
    (struct.pack(">BHBBI", 0, 6, 0x4, 0x1, 0) + b"\0" * 6, FRAME_SIZE_ERROR),  # a SETTINGS ack with a payload
    (struct.pack(">BHBBI", 0, 6, 0x4, 0, 1) + struct.pack(">HI", 3, 1), PROTOCOL_ERROR),  # SETTINGS on a stream
    (SettingsFrame(0, settings={0x2: 2}), PROTOCOL_ERROR),  # ENABLE_PUSH neither 0 nor 1
    (SettingsFrame(0, settings={0x4: 2**31}), FLOW_CONTROL_ERROR),  # initial window above 2^31-1
    (SettingsFrame(0, settings={0x5: 100}), PROTOCOL_ERROR),  # max frame size below 16,384
    (struct.pack(">BHBBI", 0, 8, 0x1, 0x4, 0) + b"\x82" * 8, PROTOCOL_ERROR),  # HEADERS on stream 0
    (struct.pack(">BHBBI", 0, 1, 0x0, 0, 0) + b"x", PROTOCOL_ERROR),  # DATA on stream 0
    (struct.pack(">BHBBI", 0, 4, 0x5, 0x4, 1) + b"\0\0\0\1", PROTOCOL_ERROR),  # PUSH_PROMISE from a client
], ids=["window-overflow", "window-update-0", "data-idle", "rst-idle", "window-update-idle", "even-stream",
        "ping-size", "ping-on-stream", "settings-ack-payload", "settings-on-stream", "enable-push",
        "initial-window", "max-frame-size", "headers-stream-0", "data-stream-0", "push-promise"])
def test_connection_errors(open_peer, frame, code):
    assert connection_error(open_peer, frame) == code


def test_headers_reusing_a_closed_stream_id_is_a_protocol_error(open_peer):
    peer = open_peer()
    assert_get_answered(peer, 1)
    peer.send(peer.headers(1, end_stream=True))
    assert peer.goaway() == PROTOCOL_ERROR


# ---- HTTP/2: stream errors, after which the connection serves on ------------------------------

def stream_error(open_peer, send) -> int:
    """Open stream 1 as ``send(peer)`` does; the RST_STREAM code it gets, and stream 3 answered after it.

    The router process's port (the compiled path, HTTP/2 by the h2 crate) ends the connection with a GOAWAY of the
    same code instead for some of them, as RFC 9113 §5.4.2 lets a server treat a stream error: that code, then.
    """
    peer = open_peer()
    try:
        send(peer)
        frame = peer.until((RstStreamFrame, GoAwayFrame))
        if isinstance(frame, GoAwayFrame):
            assert isinstance(peer, SocketPeer), "the Python front's machine ends only the stream"
            assert peer.frame() is None, "the connection closes after its GOAWAY"
            return frame.error_code
        assert frame.stream_id == 1
        assert_get_answered(peer, 3)
        return frame.error_code
    finally:
        peer.close()


@pytest.mark.parametrize("fields", [
    [(":method", "POST"), (":scheme", "http"), ("content-type", "application/grpc")],  # no :path
    [(":method", "POST"), (":path", GET), ("content-type", "application/grpc")],  # no :scheme
    request_fields() + [(":foo", "bar")],  # an unknown pseudo-header (after regular ones, too)
    [(":foo", "bar")] + request_fields(),  # an unknown pseudo-header
    [(":status", "200")] + request_fields(),  # a response pseudo-header
    request_fields()[:2] + [(":path", GET), (":path", GET)] + request_fields()[3:],  # :path twice
    [("content-type", "application/grpc"), (":method", "POST"), (":scheme", "http"), (":path", GET)],
    request_fields() + [("Content-Length", "5")],  # an uppercase name
    request_fields() + [("connection", "keep-alive")],  # connection-specific
    request_fields()[:-1] + [("te", "gzip")],  # te other than trailers
    [(":method", "POST"), (":scheme", "http"), (":path", ""), ("content-type", "application/grpc")],
], ids=["no-path", "no-scheme", "pseudo-after-regular", "unknown-pseudo", "response-pseudo", "path-twice",
        "regular-first", "uppercase", "connection", "te", "empty-path"])
def test_a_malformed_request_is_reset_with_protocol_error(open_peer, fields):
    def send(peer: Peer) -> None:
        peer.send(HeadersFrame(1, peer.encoder.encode(fields), flags=["END_HEADERS", "END_STREAM"]))
    assert stream_error(open_peer, send) == PROTOCOL_ERROR


def test_a_stream_window_overflow_is_a_flow_control_error(open_peer):
    def send(peer: Peer) -> None:
        peer.send(peer.headers(1), WindowUpdateFrame(1, window_increment=2**31 - 1))
    assert stream_error(open_peer, send) == FLOW_CONTROL_ERROR


def test_a_stream_window_update_of_0_is_a_protocol_error(open_peer):
    def send(peer: Peer) -> None:
        peer.send(peer.headers(1), WindowUpdateFrame(1, window_increment=0))
    assert stream_error(open_peer, send) == PROTOCOL_ERROR


def test_a_priority_frame_of_the_wrong_size_is_a_frame_size_error(open_peer):
    def send(peer: Peer) -> None:
        peer.send(peer.headers(1), struct.pack(">BHBBI", 0, 4, 0x2, 0, 1) + b"\0" * 4)
    assert stream_error(open_peer, send) == FRAME_SIZE_ERROR


def test_trailers_that_do_not_end_the_request_are_a_protocol_error(open_peer):
    def send(peer: Peer) -> None:
        peer.send(peer.headers(1), HeadersFrame(1, peer.encoder.encode([("x-trailer", "1")]), flags=["END_HEADERS"]))
    assert stream_error(open_peer, send) == PROTOCOL_ERROR


def test_data_on_a_stream_the_client_reset_is_stream_closed(open_peer):
    def send(peer: Peer) -> None:
        peer.send(peer.headers(1), RstStreamFrame(1, error_code=0x8), DataFrame(1, b"\0\0\0\0\0"))
    assert stream_error(open_peer, send) == STREAM_CLOSED


def test_priority_and_unknown_frames_are_ignored(open_peer):
    peer = open_peer()
    try:
        peer.send(PriorityFrame(1, depends_on=0, stream_weight=16),
                  struct.pack(">BHBBI", 0, 3, 0xfa, 0, 0) + b"abc")  # a frame type of no meaning
        assert_get_answered(peer, 1)
    finally:
        peer.close()


# ---- HTTP/2: floods -----------------------------------------------------------------------------

def answered_meanwhile(d: Deployment, during) -> None:
    """``during()`` runs while another connection's lookups keep being answered, none slower than 2 s."""
    stop, slowest, failures = threading.Event(), [0.0], []

    def lookups() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{d.grpc_port}") as channel:
            stub = router_pb2_grpc.RouterStub(channel)
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    stub.Get(router_pb2.GetRequest(table=TABLE, key="sensor-5"), timeout=5)
                except grpc.RpcError as e:
                    failures.append(e.code())
                slowest[0] = max(slowest[0], time.monotonic() - t0)
                time.sleep(0.01)

    t = threading.Thread(target=lookups)
    t.start()
    try:
        during()
    finally:
        stop.set()
        t.join(10)
    assert failures == [] and slowest[0] < 2.0


def test_rapid_reset_is_told_to_calm_down(router):
    d = router.deployment
    codes = []

    def flood() -> None:
        peer = SocketPeer(d.grpc_port)
        try:
            frames = []
            for n in range(2_000):
                sid = 2 * n + 1
                frames += [peer.headers(sid), RstStreamFrame(sid, error_code=0x8)]
            peer.send(*frames)
            codes.append(peer.goaway())
        finally:
            peer.close()

    answered_meanwhile(d, flood)
    assert codes == [ENHANCE_YOUR_CALM]


@pytest.mark.parametrize("flood", [PingFrame(0, b"12345678"), SettingsFrame(0, settings={0x3: 100})],
                         ids=["ping", "settings"])
def test_control_frame_floods_are_told_to_calm_down(router, flood):
    d = router.deployment
    codes = []

    def send() -> None:
        peer = SocketPeer(d.grpc_port)
        try:
            peer.send(*([flood] * 5_000))
            codes.append(peer.goaway())
        finally:
            peer.close()

    answered_meanwhile(d, send)
    assert codes == [ENHANCE_YOUR_CALM]


@pytest.mark.parametrize("flood", ["rapid-reset", "ping", "settings"])
def test_floods_fed_to_the_machine_are_told_to_calm_down(flood):
    peer = MachinePeer()
    if flood == "rapid-reset":
        frames = [f for n in range(2_000) for f in (peer.headers(2 * n + 1), RstStreamFrame(2 * n + 1, error_code=0x8))]
    else:
        frames = [PingFrame(0, b"12345678") if flood == "ping" else SettingsFrame(0, settings={0x3: 100})] * 5_000
    peer.send(*frames)
    assert peer.goaway() == ENHANCE_YOUR_CALM


def test_a_peer_that_does_not_read_stalls_only_itself(router):
    d = router.deployment
    peer = SocketPeer(d.grpc_port)
    try:
        def flood() -> None:
            frames = []
            for n in range(500):
                body = router_pb2.GetRequest(table=TABLE, key="sensor-3").SerializeToString()
                sid = 2 * n + 1
                frames += [peer.headers(sid), DataFrame(sid, struct.pack(">BI", 0, len(body)) + body,
                                                        flags=["END_STREAM"])]
            peer.send(*frames)
            time.sleep(1.0)  # the answers pile up unread for a while

        answered_meanwhile(d, flood)
        answered = 0
        while answered < 500 and (f := peer.frame()) is not None:
            if isinstance(f, HeadersFrame) and "END_STREAM" in f.flags:
                answered += 1
        assert answered == 500
    finally:
        peer.close()


# ---- gRPC: every method, through grpcio's client ------------------------------------------------

def test_every_method_through_grpcio(router):
    d = router.deployment
    with grpc.insecure_channel(f"127.0.0.1:{d.grpc_port}",
                               options=[("grpc.max_send_message_length", -1)]) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        got = stub.Get(router_pb2.GetRequest(table=TABLE, key="sensor-1"), timeout=5)
        assert orjson.loads(got.value_json) == value_of(1)
        with pytest.raises(grpc.RpcError) as e:
            stub.Get(router_pb2.GetRequest(table=TABLE, key="no-such-key"), timeout=5)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        batch = stub.BatchGet(router_pb2.BatchGetRequest(table=TABLE, keys=["sensor-1", "sensor-2", "nope"]),
                              timeout=5)
        assert [(r.key, r.found) for r in batch.results] == [("sensor-1", True), ("sensor-2", True), ("nope", False)]
        *items, last = stub.Scan(router_pb2.ScanRequest(table=TABLE), timeout=10)
        assert sorted(i.key for i in items) == sorted(f"sensor-{i}" for i in range(KEYS))
        assert [p.partition for p in last.summary.partitions] == list(range(PARTITIONS))
        meta = stub.KeyMetadata(router_pb2.KeyMetadataRequest(table=TABLE, key="sensor-1"), timeout=5)
        assert meta.partition < PARTITIONS and meta.active.node and len(meta.standbys) == 1
        windows = stub.GetWindows(router_pb2.WindowsRequest(table=WINDOWED, key="sensor-3", from_ms=0, to_ms=30_000),
                                  timeout=5)
        assert [(w.start_ms, w.final, orjson.loads(w.value_json)) for w in windows.windows] == \
            [(s, s + 10_000 <= WATERMARK_MS, {"count": 3}) for s in WINDOW_STARTS]
        *items, last = stub.ScanWindows(router_pb2.ScanWindowsRequest(table=WINDOWED, from_ms=10_000, to_ms=20_000),
                                        timeout=10)
        assert sorted(i.key for i in items) == sorted(f"sensor-{i}" for i in range(KEYS))
        assert {i.window.start_ms for i in items} == {10_000} and last.HasField("summary")
        tables = stub.ListTables(router_pb2.ListTablesRequest(), timeout=5).tables
        assert [(t.name, t.window.size_ms) for t in tables] == [(TABLE, 0), (WINDOWED, 10_000)]
        view = stub.Cluster(router_pb2.ClusterRequest(), timeout=5)
        assert {n.node for n in view.nodes} == {"n1", "n2", "n3"} and not any(n.draining for n in view.nodes)
        assert sorted((a.table, a.partition, len(a.nodes)) for a in view.assignment) == \
            [(t, p, 2) for t in (TABLE, WINDOWED) for p in range(PARTITIONS)]
        assert view.metadata.loaded and view.metadata.redis_ok and view.metadata.HasField("age_ms")
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflected = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        assert "freshroute.v1.Router" in {s.name for r in reflected for s in r.list_services_response.service}
        # A message larger than the advertised maximum (4 MiB).
        with pytest.raises(grpc.RpcError) as e:
            stub.Get(router_pb2.GetRequest(table=TABLE, key="k" * (5 << 20)), timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        got = stub.Get(router_pb2.GetRequest(table=TABLE, key="sensor-1"), timeout=5)
        assert orjson.loads(got.value_json) == value_of(1)


# ---- HTTP/1.1 -----------------------------------------------------------------------------------

def exchange(port: int, raw: bytes, answers: int = 1, timeout: float = 10) -> tuple[list[tuple[int, dict, bytes]], bool]:
    """Send ``raw``; read ``answers`` answers as (status, headers, body), and whether the server then closed
    (waiting for that only after an answer that says ``connection: close``)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.sendall(raw)
        f = sock.makefile("rb")
        out = []
        for _ in range(answers):
            status = int(f.readline().split()[1])
            headers = {}
            while (line := f.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            out.append((status, headers, f.read(int(headers["content-length"]))))
        return out, out[-1][1].get("connection") == "close" and f.read(1) == b""
    finally:
        sock.close()


def key_get(key: str, extra: str = "") -> bytes:
    return f"GET /v1/tables/{TABLE}/keys/{key} HTTP/1.1\r\nHost: router\r\n{extra}\r\n".encode()


def test_pipelined_lookups_are_answered_in_order(router):
    d = router.deployment
    answers, _ = exchange(d.rest_port, key_get("sensor-1") + key_get("nope") + key_get("sensor-2", "Connection: close\r\n"), 3)
    assert [a[0] for a in answers] == [200, 404, 200]
    assert [orjson.loads(answers[i][2])["value"] for i in (0, 2)] == [value_of(1), value_of(2)]
    assert orjson.loads(answers[1][2])["error"]["code"] == "KEY_NOT_FOUND"


@pytest.mark.parametrize("raw, status", [
    (f"GET /v1/tables/{TABLE}/keys/{'k' * 9000} HTTP/1.1\r\nHost: r\r\n\r\n".encode(), 414),
    (f"GET /v1/tables/{TABLE}/keys/sensor-1 HTTP/1.1\r\nHost: r\r\nX-Big: {'v' * 40_000}\r\n\r\n".encode(), 431),
    (b"GET /v1/tables/x/keys/y HTTP/9.9\r\nHost: r\r\n\r\n", 400),
    (b"NOT A REQUEST\r\n\r\n", 400),
], ids=["request-line", "headers", "version", "garbage"])
def test_requests_refused_and_closed(router, raw, status):
    d = router.deployment
    answers, closed = exchange(d.rest_port, raw)
    assert answers[0][0] == status and closed
    lookups_answered(d)


@pytest.mark.parametrize("key, status, code", [
    ("sensor%2D1", 200, None), ("%ZZ", 400, "INVALID_ARGUMENT"), ("bad%", 400, "INVALID_ARGUMENT"),
    ("%FF%FE", 400, "INVALID_ARGUMENT"),
], ids=["encoded", "not-hex", "truncated", "not-utf8"])
def test_percent_encoding(router, key, status, code):
    d = router.deployment
    answers, closed = exchange(d.rest_port, key_get(key))
    assert answers[0][0] == status and not closed
    if code:
        assert orjson.loads(answers[0][2])["error"]["code"] == code
    else:
        assert orjson.loads(answers[0][2])["value"] == value_of(1)


def test_a_head_trickling_in_is_refused_with_408(router):
    d = router.deployment
    sock = socket.create_connection(("127.0.0.1", d.rest_port), timeout=30)
    try:
        start = time.monotonic()
        head = key_get("sensor-1")[:-2] + b"X-Slow: " + b"y" * 40
        sent = 0
        while time.monotonic() - start < 25:
            try:
                sock.sendall(head[sent:sent + 1] if sent < len(head) else b"y")
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            sock.settimeout(0.5)
            try:
                data = sock.recv(4096)
            except socket.timeout:
                continue
            assert data.startswith(b"HTTP/1.1 408 "), data
            break
        else:
            raise AssertionError("a head trickling in for 25 s was never refused")
        assert 9 < time.monotonic() - start < 20
    finally:
        sock.close()
    lookups_answered(d)


def test_a_client_that_does_not_read_stalls_only_itself(router):
    d = router.deployment
    sock = socket.create_connection(("127.0.0.1", d.rest_port), timeout=10)
    try:
        answered_meanwhile(d, lambda: (sock.sendall(key_get("sensor-1") * 2_000), time.sleep(1.0)))
        f, n = sock.makefile("rb"), 0
        while n < 2_000:
            line = f.readline()
            assert line.startswith(b"HTTP/1.1 200 ")
            length = 0
            while (h := f.readline()) != b"\r\n":
                if h.lower().startswith(b"content-length:"):
                    length = int(h.split(b":")[1])
            f.read(length)
            n += 1
    finally:
        sock.close()


# ---- h2spec: the independent HTTP/2 conformance suite ------------------------------------------

H2SPEC = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "h2spec"


def test_h2spec_passes_every_case_it_runs(router, tmp_path):
    """h2spec (built by ./dev test from tests/h2spec/go.mod) against the router's gRPC port: every case, strict ones too."""
    assert H2SPEC.is_file(), f"{H2SPEC} is missing: ./dev test builds it (tests/h2spec)"
    report = tmp_path / "h2spec.xml"
    done = subprocess.run([str(H2SPEC), "--strict", "-h", "127.0.0.1", "-p", str(router.deployment.grpc_port),
                           "-o", "3", "-j", str(report)], capture_output=True, text=True, timeout=300)
    cases = ElementTree.parse(report).getroot().iter("testcase")
    failed, skipped, passed = [], set(), 0
    for case in cases:
        name = f"{case.get('package')} {case.get('classname')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        elif case.find("skipped") is not None:
            skipped.add(name)
        else:
            passed += 1
    assert not failed, f"h2spec failed {len(failed)}: {failed}\n{done.stdout[-4000:]}"
    assert not skipped, f"h2spec skipped {sorted(skipped)}"
    assert passed >= 146 and done.returncode == 0, done.stdout[-2000:]
    lookups_answered(router.deployment)


# ---- and nothing was kept ------------------------------------------------------------------------

def test_the_router_did_not_grow(router):
    lookups_answered(router.deployment)
    grown = rss_kib(router.pid) - router.rss_before
    assert grown < 32 * 1024, f"the router grew by {grown} KiB over the suite"

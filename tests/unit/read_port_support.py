"""Fake store nodes' read ports on loopback: each node's answers served as frames on a TCP port of its own (a thread),
the way a store node's read port serves them, for the unit tests of the blocking drivers; a node can be told to
misbehave."""

import socketserver
import threading

from freshroute.bound import NO_BOUND, Bound
from freshroute.cluster_access import NodeAccess
from freshroute.metadata.roles import Role
from freshroute.wire import FrameReader, frame
from freshroute.tls import ClientTLS, ServerTLS
from proto import store_pb2
from tools.local.certs import issue, make_ca


def _status(s):
    return store_pb2.ReplicaStatus(node=s.node, role=store_pb2.ACTIVE if s.role is Role.ACTIVE else store_pb2.STANDBY,
                                   applied_offset=s.applied, end_offset=s.end, lag_offsets=s.lag_offsets,
                                   staleness_ms=s.staleness_ms)


def answer(node, batch):
    """What a store node answers: the fake node's data, on the wire."""
    out = store_pb2.ResultBatch()
    for r in batch.reads:
        got = node.answer(r.table, r.partition, r.key, NO_BOUND)
        out.results.add(id=r.id, status=int(got.status), value=got.value, replica=_status(got.replica))
    for g in batch.groups:
        bound = Bound(max_lag=g.bound.max_lag) if g.bound.HasField("max_lag") else NO_BOUND
        why = node.refusal(g.table, g.partition, bound)
        status = _status(node.status(g.table, g.partition))
        if why is not None:
            out.groups.add(id=g.id, status=store_pb2.TOO_STALE, replica=status, message=why)
            continue
        data = node.replicas[(g.table, g.partition)].data
        out.groups.add(id=g.id, status=store_pb2.OK, replica=status, values=[data.get(k, b"") for k in g.keys])
    for r in batch.ranges:
        from freshroute.windows import WATERMARK_KEY, live_starts, parse_watermark

        data = node.replicas[(r.table, r.partition)].data
        watermark = parse_watermark(data.get(WATERMARK_KEY))
        keep = live_starts(r.window.from_ms, r.window.to_ms, r.window.life_ms, watermark)
        rows = [(k, v) for k, v in sorted(data.items()) if r.start <= k < r.end and keep(k)][:r.limit]
        out.ranges.add(id=r.id, status=store_pb2.OK, replica=_status(node.status(r.table, r.partition)),
                       watermark_ms=-1 if watermark is None else watermark,
                       entries=[store_pb2.ScanEntry(key=k, value=v) for k, v in rows])
    return out


def tls_pair(directory):
    """(a read port's server SSLContext, a peer's NodeAccess trusting it): a throwaway CA in ``directory``."""
    ca = make_ca(directory)
    node = issue(ca, directory, "node", "127.0.0.1")
    return ServerTLS(node.cert, node.key).context, NodeAccess("", ClientTLS(ca=ca.cert))


class ReadPort:
    """A thread serving one fake node's read port; ``mode`` is how it answers: ok, garbage, close or silent. With
    ``tls`` (a server's SSLContext) it speaks TLS, as a secure node's does: TLS 1.3 sends session tickets after the
    handshake, bytes that hold no data."""

    def __init__(self, node, mode="ok", tls=None):
        self.node, self.mode, self.requests = node, mode, 0
        port_self = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                frames = FrameReader()
                sock = self.request if tls is None else tls.wrap_socket(self.request, server_side=True)
                while data := sock.recv(65536):
                    for payload in frames.feed(data):
                        port_self.requests += 1
                        if port_self.mode == "garbage":
                            sock.sendall(frame(b"\xff\xff\xff"))
                        elif port_self.mode == "close":
                            return
                        elif port_self.mode == "ok":
                            batch = store_pb2.ReadBatch.FromString(payload)
                            sock.sendall(frame(answer(port_self.node, batch).SerializeToString()))

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        node.read_address = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()

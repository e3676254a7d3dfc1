"""Blocking reads on store nodes' read ports, for the synchronous client: the attempt engine driven with select().

A thread keeps its own connections (one idle socket per node, more while attempts overlap).
Each attempt sends one ``ReadBatch`` frame — a get's one read, a batch's group of one
partition's keys, or a windows lookup's key range — on a connection of its own and reads one ``ResultBatch`` frame back; an
attempt given up on closes its connection, so no late answer can be taken for another read's.
A connection's first frame also carries the cluster secret, and it speaks TLS, as the
client's :class:`NodeAccess` says.
"""

from __future__ import annotations

import itertools
import select
import socket
import time
from typing import Generic, TypeVar, cast

from google.protobuf.message import DecodeError

from freshroute.client import nonblocking
from freshroute.cluster_access import NodeAccess
from freshroute.errors import FreshrouteError, ReplicaUnavailable
from freshroute.bound import Bound
from freshroute.routing.attempts import AttemptPlan, launch_due
from freshroute.routing.selection import Candidate
from freshroute.routing.snapshot import SnapshotSource
from freshroute.wire import (FrameError, FrameReader, GroupResult, RangeResult, ReadResult, WindowFilter, checked,
                             frame, group_read, group_result, key_read, range_read, range_result, results)
from proto import store_pb2

_ids = itertools.count(1)

# What a request's answer is: a get's, a group's or a range's.
R = TypeVar("R", ReadResult, GroupResult, RangeResult)


class _Connection:
    """One TCP connection to a read port, carrying one attempt at a time."""

    __slots__ = ("node", "sock", "frames", "request", "hello", "write_timeout_s")

    def __init__(self, node: str, sock: socket.socket, write_timeout_s: float, hello: bytes = b"") -> None:
        self.node = node
        self.sock = nonblocking.connected(sock)
        self.write_timeout_s = write_timeout_s
        self.frames = FrameReader()
        self.request: AnyRequest | None = None
        self.hello = hello  # merged into the first frame: serialized messages concatenate as a merge

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, request: AnyRequest) -> None:
        self.request = request
        if self.hello:
            nonblocking.send(self.sock, frame(request.payload + self.hello), self.write_timeout_s)
            self.hello = b""
        else:
            nonblocking.send(self.sock, request.frame, self.write_timeout_s)

    def receive(self) -> ReadResult | GroupResult | RangeResult | None:
        """The answer, once all of it has arrived (None: not yet).

        Raises OSError, FrameError, DecodeError, or ReplicaUnavailable for an answer that does not fit the request."""
        data = nonblocking.receive(self.sock)
        if data is None:
            return None
        if not data:
            raise ConnectionResetError("connection closed by the node")
        payloads = self.frames.feed(data)
        if not payloads:
            return None
        if len(payloads) > 1:
            raise FrameError("more than one answer to one request")
        assert self.request is not None
        return self.request.answer(store_pb2.ResultBatch.FromString(payloads[0]), self.node)


class Request(Generic[R]):
    """What every attempt of one job sends (framed once, the same to every replica) and how it reads the answer
    (``R``: the answer's type, as the constructor that made it says)."""

    __slots__ = ("payload", "frame", "keys")

    _RANGE = -1

    def __init__(self, batch: store_pb2.ReadBatch, keys: int | None) -> None:
        self.payload = batch.SerializeToString()
        self.frame = frame(self.payload)
        self.keys = keys  # None: a get (one read); _RANGE: a key range; else a group of this many keys

    @staticmethod
    def get(table: str, partition: int, key: bytes, bound: Bound) -> "Request[ReadResult]":
        return Request(store_pb2.ReadBatch(reads=[key_read(next(_ids), table, partition, key, bound)]), None)

    @staticmethod
    def group(table: str, partition: int, keys: list[bytes], bound: Bound) -> "Request[GroupResult]":
        return Request(store_pb2.ReadBatch(groups=[group_read(next(_ids), table, partition, keys, bound)]), len(keys))

    @staticmethod
    def range(table: str, partition: int, start: bytes, end: bytes, limit: int, window: WindowFilter | None,
              bound: Bound) -> "Request[RangeResult]":
        return Request(store_pb2.ReadBatch(ranges=[range_read(next(_ids), table, partition, start, end, limit, window,
                                                              bound)]), Request._RANGE)

    def answer(self, batch: store_pb2.ResultBatch, node: str) -> ReadResult | GroupResult | RangeResult:
        if batch.refused:
            raise ReplicaUnavailable(f"store node {node}: the node refused this peer: {batch.refused}", address=node)
        if self.keys == self._RANGE:
            if len(batch.ranges) != 1 or batch.results or batch.groups:
                raise FrameError(f"{len(batch.ranges)} answers to one range read")
            return range_result(batch.ranges[0])
        if self.keys is None:
            if len(batch.results) != 1 or batch.groups:
                raise FrameError(f"{len(batch.results)} answers to one read")
            return next(results(batch))[1]
        if len(batch.groups) != 1 or batch.results:
            raise FrameError(f"{len(batch.groups)} answers to one group")
        return checked(group_result(batch.groups[0]), self.keys, node)


AnyRequest = Request[ReadResult] | Request[GroupResult] | Request[RangeResult]


class BlockingStore:
    """One thread's connections to store nodes' read ports."""

    def __init__(self, metadata: SnapshotSource, access: NodeAccess = NodeAccess(),
                 connect_timeout_s: float = 2.0) -> None:
        self._metadata = metadata
        self._access = access
        self._hello = store_pb2.ReadBatch(cluster_secret=access.secret).SerializeToString() if access.secret else b""
        self._connect_timeout_s = connect_timeout_s
        self._idle: dict[str, list[_Connection]] = {}

    def send(self, node: str, request: AnyRequest, deadline: float) -> _Connection:
        """A connection to ``node`` carrying ``request``; any failure is :class:`ReplicaUnavailable`."""
        idle = self._idle.get(node)
        conn = idle.pop() if idle else None
        try:
            if conn is None:
                conn = _Connection(node, self._connect(node, deadline), self._connect_timeout_s, self._hello)
            conn.send(request)
            return conn
        except OSError as e:
            if conn is not None:
                conn.sock.close()
            raise ReplicaUnavailable(f"store node {node}: {type(e).__name__}: {e}", address=node) from None

    def _connect(self, node: str, deadline: float) -> socket.socket:
        view = self._metadata.current.nodes.get(node)
        if view is None or not view.read_address:
            raise ConnectionRefusedError("the node offers no read port")
        host, port = view.read_address.rsplit(":", 1)
        timeout = max(0.01, min(self._connect_timeout_s, deadline - time.monotonic()))
        host = host.strip("[]")
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._access.ssl_context is not None:
            try:
                sock = self._access.ssl_context.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        return sock

    def release(self, conn: _Connection) -> None:
        """A connection whose answer was read in full: kept for the next read of its node."""
        self._idle.setdefault(conn.node, []).append(conn)

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.sock.close()
        self._idle.clear()


Job = tuple[AttemptPlan, Request[R]]


def run_blocking(store: BlockingStore, jobs: list[Job[R]]) -> list[tuple[Candidate, R] | FreshrouteError]:
    """Drive each job's plan to an answer or its error, all at once on this thread."""
    out: list[tuple[Candidate, R] | FreshrouteError | None] = [None] * len(jobs)
    inflight: dict[_Connection, tuple[int, Candidate, float]] = {}
    plans = [plan for plan, _ in jobs]
    now = time.monotonic()

    def send(i: int, cand: Candidate) -> None:
        plan, request = jobs[i]
        try:
            inflight[store.send(cand.replica.node, request, plan.deadline)] = (i, cand, now)
        except ReplicaUnavailable as e:
            plan.settle(cand, e, 0.0)

    try:
        # Bounded: each pass launches, settles, or waits until the next plan's wake-up.
        for _ in range(sum(plan.passes for plan in plans)):
            now = time.monotonic()
            wake = launch_due(plans, out, now, send, lambda i: _abandon(inflight, plans[i], i))
            if wake is None:
                break
            ready, _, _ = select.select(list(inflight), [], [], max(0.0, wake - time.monotonic()))
            for conn in ready:
                if conn not in inflight:
                    continue  # its read was answered by another replica in this pass
                i, cand, t0 = inflight[conn]
                plan = jobs[i][0]
                try:
                    answer = conn.receive()
                except (OSError, FrameError, DecodeError, ReplicaUnavailable) as e:
                    del inflight[conn]
                    conn.sock.close()
                    if not isinstance(e, ReplicaUnavailable):
                        e = ReplicaUnavailable(f"store node {conn.node}: {type(e).__name__}: {e}", address=conn.node)
                    plan.settle(cand, e, 0.0)
                    continue
                if answer is None:
                    continue
                del inflight[conn]
                store.release(conn)
                got = plan.settle(cand, answer, (time.monotonic() - t0) * 1000)
                if got is not None:
                    out[i] = (cand, cast(R, got))  # the answer of jobs[i]'s request: an R
                    _abandon(inflight, plan, i)
    finally:
        for conn, (i, cand, _) in inflight.items():
            conn.sock.close()
            jobs[i][0].abandon(cand)
    return [r if r is not None else jobs[i][0].error(time.monotonic()) for i, r in enumerate(out)]


def _abandon(inflight: dict[_Connection, tuple[int, Candidate, float]], plan: AttemptPlan, job: int) -> None:
    for conn in [c for c, (i, _, _) in inflight.items() if i == job]:
        _, cand, _ = inflight.pop(conn)
        conn.sock.close()
        plan.abandon(cand)

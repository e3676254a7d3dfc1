"""The read port's protocol, shared by both its ends: frames on a plain TCP connection, the read and result messages
(``proto/store.proto``), and the values they carry.

A store node's read port (:mod:`store_node.read_port`) and its clients (:mod:`freshroute.routing.store`,
:mod:`freshroute.client.blocking`) exchange ``ReadBatch`` / ``ResultBatch`` messages, each as a 4-byte big-endian
length followed by the serialized message; one frame in is answered by one frame out, in order. Frames rather than a
gRPC stream because every read takes this path: a message on a grpc.aio stream costs ~150–300 µs of CPU on each side
and passes several threads, a frame on an asyncio transport a few µs.
"""

from __future__ import annotations

import functools
import operator
import struct
from enum import IntEnum
from typing import Any, Callable, Iterator, NamedTuple

from freshroute.bound import REPLICA_LIMITS, Bound
from freshroute.errors import ReplicaUnavailable
from freshroute.position import Position
from freshroute.metadata.roles import ReplicaState, Role
from proto import store_pb2


# ---- values ------------------------------------------------------------------------------------------------

class ReadStatus(IntEnum):
    """Outcome of one read on one replica (mirrors ``store.proto``)."""

    OK = 0
    NOT_FOUND = 1
    TOO_STALE = 2
    NOT_HOSTED = 3
    ERROR = 4
    NOT_YET_VISIBLE = 5  # within the bound, but the events the read must reflect are not in it yet


class ReplicaStatus(NamedTuple):
    """Lag and position of the replica that answered, as of the answer."""

    node: str
    role: Role
    state: ReplicaState | None
    applied: int
    end: int | None  # None: the replica has not learnt its partition's end offset yet
    lag_offsets: int | None
    staleness_ms: int


class ReadResult(NamedTuple):
    """One read's answer. Value objects built per read are tuples: far cheaper to make than frozen dataclasses."""

    status: ReadStatus
    value: bytes = b""  # the changelog value, JSON bytes, passed through untouched
    replica: ReplicaStatus | None = None
    message: str = ""
    version: "Version | None" = None  # a read as of a time: the version valid then (a delete's value is None)


class GroupResult(NamedTuple):
    """Several keys of one partition read from one replica, judged as one: every value, or why none.

    ``values`` holds one entry per key, in order, when ``status`` is OK — the changelog
    value, or empty bytes when there is no such key; otherwise it is empty and the group
    is tried elsewhere as a whole.
    """

    status: ReadStatus
    values: list[bytes]
    replica: ReplicaStatus | None = None
    message: str = ""


class Version(NamedTuple):
    """One version of a versioned table's key: its value (None: the key was absent) over ``[valid_from_ms,
    valid_to_ms)``."""

    valid_from_ms: int
    valid_to_ms: int | None  # None: it is the latest
    value: bytes | None


class RangeResult(NamedTuple):
    """A key range of one partition read from one replica: its rows (a windowed table's windows; a key's versions,
    newest first), or why none."""

    status: ReadStatus
    entries: list[tuple[bytes, bytes]]  # (changelog key, value), ascending
    replica: ReplicaStatus | None = None
    message: str = ""
    watermark_ms: int | None = None  # the partition's watermark as of the answer (windowed reads)
    versions: tuple[Version, ...] = ()  # a versions read's (VersionFilter), or each entry's version (RowsAsOf)


class WindowFilter(NamedTuple):
    """Windows starting in ``[from_ms, to_ms)``, not expired (``life_ms``: window size + retention)."""

    from_ms: int
    to_ms: int
    life_ms: int


class VersionFilter(NamedTuple):
    """A key's versions valid at some time in ``[from_ms, to_ms)``, newest first."""

    from_ms: int
    to_ms: int


class RowsAsOf(NamedTuple):
    """A versioned table's rows as of a time: each key's version valid at ``at_ms`` (keys absent then left out)."""

    at_ms: int


# ---- frames ------------------------------------------------------------------------------------------------


# Far above any batch the router sends (a few hundred reads) or a node answers; a length
# beyond it means the peer does not speak this protocol, and the connection is dropped.
MAX_FRAME = 64 << 20

_LENGTH = struct.Struct(">I")
HEADER = _LENGTH.size


class FrameError(Exception):
    """The byte stream is not a sequence of frames (e.g. a client speaking another protocol)."""


def frame(payload: bytes) -> bytes:
    """``payload`` with its length in front."""
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Splits received bytes into payloads; keeps an incomplete frame until the rest arrives."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads completed by ``data``, in order. Raises :class:`FrameError` on an oversized length."""
        buf = self._buffer
        if not buf and len(data) >= HEADER and _LENGTH.unpack_from(data)[0] == len(data) - HEADER:
            return [data[HEADER:]]  # the usual case: exactly one whole frame, nothing buffered
        buf += data
        payloads = []
        start = 0
        end = len(buf)
        while end - start >= HEADER:
            (size,) = _LENGTH.unpack_from(buf, start)
            if size > MAX_FRAME:
                raise FrameError(f"frame of {size} bytes announced; the limit is {MAX_FRAME}")
            if end - start - HEADER < size:
                break
            start += HEADER
            payloads.append(bytes(buf[start:start + size]))
            start += size
        del buf[:start]
        return payloads


# ---- statuses, reads and results as messages, both ways ---------------------------------------------------



_ROLE_OF = {store_pb2.ACTIVE: Role.ACTIVE, store_pb2.STANDBY: Role.STANDBY}
_STATE_OF = {store_pb2.RESTORING: ReplicaState.RESTORING, store_pb2.SERVING_ACTIVE: ReplicaState.ACTIVE,
           store_pb2.SERVING_STANDBY: ReplicaState.STANDBY}
_STATUSES = {int(s): s for s in ReadStatus}
_ROLE_MESSAGE = {role: message for message, role in _ROLE_OF.items()}
_STATE_MESSAGE = {ReplicaState.RESTORING: store_pb2.RESTORING, ReplicaState.ACTIVE: store_pb2.SERVING_ACTIVE,
          ReplicaState.STANDBY: store_pb2.SERVING_STANDBY, ReplicaState.FAILED: store_pb2.FAILED}


def replica_status(msg: store_pb2.ReplicaStatus) -> ReplicaStatus:
    state = _STATE_OF.get(msg.state)
    role = _ROLE_OF.get(msg.role) or (Role.ACTIVE if state is ReplicaState.ACTIVE else Role.STANDBY)
    if not msg.HasField("end_offset"):
        return ReplicaStatus(msg.node, role, state, msg.applied_offset, None, None, max(0, msg.staleness_ms))
    return ReplicaStatus(msg.node, role, state, msg.applied_offset, msg.end_offset,
                         max(0, msg.lag_offsets), max(0, msg.staleness_ms))


def replica_status_message(node: str, role: Role, state: ReplicaState, applied: int, end: int | None,
                           staleness_ms: int, failure: str | None) -> store_pb2.ReplicaStatus:
    """A replica's status as a read reports it (the node's side of :func:`replica_status`); an end offset not learnt
    yet leaves the end and the offset lag unset."""
    if end is not None:
        end = max(end, applied)
    return store_pb2.ReplicaStatus(node=node, role=_ROLE_MESSAGE[role], state=_STATE_MESSAGE[state], applied_offset=applied,
                                   end_offset=end, lag_offsets=None if end is None else end - applied,
                                   staleness_ms=staleness_ms, failure=failure or "")


# ---- the bound as a replica judges it ---------------------------------------------------------------------
# A read carries its bound's replica limits under their own names, its position narrowed to the partition read
# (``min_offset``) and its write token narrowed to the table (``after_input``, ``after_offset``).

_REPLICA_LIMITS = tuple((Bound._fields.index(name), name) for name in REPLICA_LIMITS)
# The replica limits' values, as a key of what a replica judges (of one limit, its value alone: a key all the same).
_replica_limits: Callable[[Bound], object] = operator.itemgetter(*(i for i, _ in _REPLICA_LIMITS))


def read_bound(bound: Bound, partition: int) -> store_pb2.ReadBound:
    """``bound`` as the replica of ``partition`` that answers judges it."""
    msg = store_pb2.ReadBound(min_offset=bound.min_offset(partition))
    for i, name in _REPLICA_LIMITS:
        value = bound[i]
        if value is not None:
            setattr(msg, name, value)
    after = bound.read_after
    if after is not None:
        msg.after_input.update(after.offsets)
        msg.after_offset = after.after_offset(partition)
    return msg


def judged_alike(bound: Bound, partition: int) -> tuple[object, ...] | None:
    """What the replica of ``partition`` judges of ``bound`` (:func:`read_bound`), as a key: bounds with equal keys
    are judged alike; None for no bound. A write token counts by identity (one request's groups share it)."""
    if bound.unbounded:
        return None
    return bound.min_offset(partition), id(bound.read_after), _replica_limits(bound)


def limits_only_position(msg: store_pb2.ReadBound) -> bool:
    """Whether a read's bound limits nothing but its position and events: the common bounded read, judged by one
    comparison of offsets. The limits asked for are the definition's replica limits, by name (a field of the message
    that is none of them fails the test that every limit a read carries is judged)."""
    has = msg.HasField
    for name in REPLICA_LIMITS:  # HasField by name: a third of the cost of ListFields on every bounded read
        if has(name):
            return False
    return True


def bound_of_read(table: str, partition: int, msg: store_pb2.ReadBound) -> Bound:
    """The bound a read carries, as :meth:`Bound.refusal` judges it: the replica limits by name, the position of the
    one partition read. (The events it must reflect the store node checks against its rows.)"""
    has = msg.HasField
    bound = _limited(tuple([getattr(msg, name) if has(name) else None for name in REPLICA_LIMITS]))
    return bound._replace(min_position=Position(table, {partition: msg.min_offset})) if msg.min_offset else bound


@functools.lru_cache(maxsize=256)
def _limited(values: tuple[int | None, ...]) -> Bound:
    """The bound of these replica limits: reads mostly carry a few, and building one costs a bounded read a third."""
    limits: dict[str, Any] = {name: value for name, value in zip(REPLICA_LIMITS, values) if value is not None}
    return Bound(**limits)


def key_read(read_id: int, table: str, partition: int, key: bytes, bound: Bound,
             as_of_ms: int | None = None) -> store_pb2.KeyRead:
    """One read as it travels (``as_of_ms``: of the version valid then); an absent bound reads as "no limit" at the
    node and costs nothing to build."""
    if bound.unbounded:
        msg = store_pb2.KeyRead(id=read_id, table=table, partition=partition, key=key)
    else:
        msg = store_pb2.KeyRead(id=read_id, table=table, partition=partition, key=key, bound=read_bound(bound, partition))
    if as_of_ms is not None:
        msg.as_of_ms = as_of_ms
    return msg


def group_read(read_id: int, table: str, partition: int, keys: list[bytes], bound: Bound) -> store_pb2.GroupRead:
    if bound.unbounded:
        return store_pb2.GroupRead(id=read_id, table=table, partition=partition, keys=keys)
    return store_pb2.GroupRead(id=read_id, table=table, partition=partition, keys=keys,
                               bound=read_bound(bound, partition))


def range_read(read_id: int, table: str, partition: int, start: bytes, end: bytes, limit: int,
               window: WindowFilter | VersionFilter | RowsAsOf | None, bound: Bound) -> store_pb2.RangeRead:
    """A range of rows (``window``: of a windowed table's windows; :class:`RowsAsOf`: a versioned table's rows as of a
    time), or of a key's versions (a :class:`VersionFilter`: ``start`` is the key)."""
    msg = store_pb2.RangeRead(id=read_id, table=table, partition=partition, start=start, end=end, limit=limit)
    if isinstance(window, VersionFilter):
        msg.versions.from_ms, msg.versions.to_ms = window
    elif isinstance(window, RowsAsOf):
        msg.as_of_ms = window.at_ms
    elif window is not None:
        msg.window.from_ms, msg.window.to_ms, msg.window.life_ms = window
    if not bound.unbounded:
        msg.bound.CopyFrom(read_bound(bound, partition))
    return msg


def range_result(msg: store_pb2.RangeResult) -> RangeResult:
    status = _STATUSES.get(msg.status, ReadStatus.ERROR)
    replica = replica_status(msg.replica) if msg.HasField("replica") else None
    watermark = msg.watermark_ms if msg.watermark_ms >= 0 else None
    entries = [(e.key, e.value) for e in msg.entries] if status is ReadStatus.OK else []
    if entries and msg.entries[0].HasField("valid_from_ms"):
        versions = tuple(Version(e.valid_from_ms, e.valid_to_ms if e.HasField("valid_to_ms") else None,
                                 None if e.deleted else e.value) for e in msg.entries)
        return RangeResult(status, entries, replica, msg.message, watermark, versions)
    return RangeResult(status, entries, replica, msg.message, watermark)


def group_result(msg: store_pb2.GroupResult) -> GroupResult:
    status = _STATUSES.get(msg.status, ReadStatus.ERROR)
    replica = replica_status(msg.replica) if msg.HasField("replica") else None
    return GroupResult(status, list(msg.values) if status is ReadStatus.OK else [], replica, msg.message)


def checked(answer: GroupResult, keys: int, node: str) -> GroupResult:
    """``answer``, if it answers every key; a node that answers fewer is broken for this read."""
    if answer.status is ReadStatus.OK and len(answer.values) != keys:
        raise ReplicaUnavailable(f"store node {node}: answered {len(answer.values)} of {keys} keys",
                                 address=node)
    return answer


def results(batch: store_pb2.ResultBatch) -> Iterator[tuple[int, ReadResult]]:
    """(read id, result) of every answer in a batch."""
    last: store_pb2.ReplicaStatus | None = None
    status: ReplicaStatus | None = None
    for msg in batch.results:
        if msg.HasField("replica"):
            # Answers from one replica in one batch carry the same status: convert it once.
            rep = msg.replica
            if rep != last:
                last, status = rep, replica_status(rep)
            if msg.HasField("valid_from_ms"):
                yield msg.id, ReadResult(_STATUSES.get(msg.status, ReadStatus.ERROR), msg.value, status, msg.message,
                                         _version(msg))
                continue
            yield msg.id, ReadResult(_STATUSES.get(msg.status, ReadStatus.ERROR), msg.value, status, msg.message)
        else:
            yield msg.id, ReadResult(_STATUSES.get(msg.status, ReadStatus.ERROR), msg.value, None, msg.message)


def _version(msg: store_pb2.KeyResult) -> Version:
    """The version a read as of a time answered with (a delete's value None)."""
    return Version(msg.valid_from_ms, msg.valid_to_ms if msg.HasField("valid_to_ms") else None,
                   msg.value if msg.status == store_pb2.OK else None)

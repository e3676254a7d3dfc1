"""The store node's read door: every read — keys, groups of keys, key ranges — arrives here as a batch.

Routers and clients send ``ReadBatch`` messages on long-lived connections as length-prefixed frames
(:mod:`freshroute.wire`); each frame is answered, in order, by one ``ResultBatch`` frame. Every answer carries the
answering replica's status (role, state, position, lag); a read the replica cannot answer within the caller's bound is
refused with TOO_STALE, never answered out of bound. Each replica's status is computed once per batch and nothing is
logged on success; RocksDB point reads take microseconds, so batches are answered synchronously, as the port's front
hands them over (store_node/read_port_front.py). A peer that sends something other than frames is disconnected; on a
node with a cluster secret, so is one whose first batch does not carry it, answered only by a batch that says why.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from google.protobuf.message import DecodeError

from freshroute import input_position
from freshroute.errors import StoreCorrupt
from freshroute.lag import now_ms
from freshroute.windows import WATERMARK_KEY, live_starts, parse_watermark
from freshroute.wire import bound_of_read, frame, limits_only_position, replica_status_message
from proto import store_pb2
from store_node.access import REFUSAL, ClusterSecret

if TYPE_CHECKING:
    from store_node.replica import Replica

log = logging.getLogger(__name__)

_OK, _NOT_FOUND, _TOO_STALE, _NOT_HOSTED, _ERROR, _NOT_YET_VISIBLE = (
    store_pb2.OK, store_pb2.NOT_FOUND, store_pb2.TOO_STALE, store_pb2.NOT_HOSTED, store_pb2.ERROR,
    store_pb2.NOT_YET_VISIBLE)


_CONSISTENT_TRIES = 3


class _Reader:
    """Answers reads against one snapshot of the hosted replicas, taking each table-partition's status once.

    ``statuses`` keeps each replica's last status message while its figures stay the same:
    between two applied batches every read reports the same status, and building it is a
    good part of a read's cost.
    """

    __slots__ = ("node_id", "serving", "now", "statuses", "cache")

    def __init__(self, node_id: str, serving, now: int, statuses: dict) -> None:
        self.node_id = node_id
        self.serving = serving
        self.now = now
        self.statuses = statuses
        self.cache: dict = {}

    def _replica(self, key: tuple[str, int]) -> tuple:
        rep = self.serving.get(key)
        if rep is None:
            return None, None, None, None, 0
        # Take the store before the lag: the store can only be newer than the lag says. The replica's write count
        # first: a read that sees it moved (or odd, a commit under way) may hold rows newer than these figures.
        writes = rep.writes
        store = rep.store
        figures = rep.lag.figures(self.now)
        seen = (rep, rep.role, rep.restoring, rep.failure, figures)
        kept = self.statuses.get(key)
        if kept is not None and kept[0] == seen:
            return rep, store, figures, kept[1], writes
        # From its lag's figures (LagTracker.figures): applied, end, staleness.
        status = replica_status_message(self.node_id, rep.role, rep.state, *figures, rep.failure)
        self.statuses[key] = (seen, status)
        return rep, store, figures, status, writes

    def admit(self, read: store_pb2.KeyRead | store_pb2.GroupRead | store_pb2.RangeRead,
              out: store_pb2.KeyResult | store_pb2.GroupResult | store_pb2.RangeResult) -> tuple | None:
        """Fill ``out``'s replica status; (replica, store, its write count then) when the read may be answered, else
        None with ``out`` saying why (not hosted, being rebuilt, or outside the caller's bound)."""
        table, partition = read.table, read.partition
        key = (table, partition)
        cached = self.cache.get(key)
        if cached is None:
            cached = self.cache[key] = self._replica(key)
        rep, store, figures, status, writes = cached
        if rep is None:
            out.status = _NOT_HOSTED
            out.message = f"{table}/{partition} is not hosted by {self.node_id}"
            return None
        out.replica.CopyFrom(status)
        why = None
        if rep.failure is not None:
            why = f"replica failed: {rep.failure}"
        elif store is None:
            why = "replica is being rebuilt from its changelog"
        elif store.bulk_load:
            why = "replica is loading its changelog into an empty store; it is read once it has caught up"
        elif read.HasField("bound"):
            bound = read.bound
            # A position the replica has reached, and no other limit, refuses nothing: the common bounded read.
            if bound.min_offset > figures[0] or not limits_only_position(bound):
                why = bound_of_read(table, partition, bound).refusal(partition, *figures)
            if why is None and bound.after_input:
                try:
                    unseen = _not_yet_visible(store, read, bound, figures[0])
                except StoreCorrupt as e:
                    out.status, out.message = self._failed(rep, store, e)
                    return None
                if unseen is not None:
                    out.status = _NOT_YET_VISIBLE
                    out.message = unseen
                    return None
        if why is not None:
            out.status = _TOO_STALE
            out.message = why
            return None
        return rep, store, writes

    def answer(self, read: store_pb2.KeyRead | store_pb2.GroupRead | store_pb2.RangeRead,
               out: store_pb2.KeyResult | store_pb2.GroupResult | store_pb2.RangeResult,
               fill: Callable[[Any, Any, Any], None]) -> None:
        """Answer ``read`` into ``out`` (an empty result, usually added to a batch's results in place): admitted, then
        filled from the replica's store by ``fill``; a store that fails the read fails the replica, not the node."""
        for attempt in range(_CONSISTENT_TRIES):
            out.id = read.id
            admitted = self.admit(read, out)
            if admitted is None:
                return
            rep, store, writes = admitted
            try:
                fill(store, read, out)
            except StoreCorrupt as e:
                out.status, out.message = self._failed(rep, store, e)
                return
            if rep.writes == writes and not writes & 1:
                return
            # A commit ran while this read did: its rows may be newer than the position the answer reports. Read
            # again with the replica's status taken anew (the last try keeps an answer whose position is older than
            # its rows at worst, never newer).
            if attempt < _CONSISTENT_TRIES - 1:
                del self.cache[(read.table, read.partition)]
                out.Clear()

    def results(self, batch: store_pb2.ReadBatch) -> store_pb2.ResultBatch:
        """One result per read, per group and per range, in order."""
        answer = store_pb2.ResultBatch()
        # Filling results added in place: building KeyResults and passing them to
        # ResultBatch would copy every one (and its replica status) a second time.
        add = answer.results.add
        for read in batch.reads:
            self.answer(read, add(), _key_as_of if read.HasField("as_of_ms") else _key)
        if batch.groups:
            add = answer.groups.add
            for group in batch.groups:
                self.answer(group, add(), _group)
        if batch.ranges:
            add = answer.ranges.add
            for r in batch.ranges:
                self.answer(r, add(), _range)
        return answer

    def _failed(self, rep: "Replica", store, e: StoreCorrupt) -> tuple[int, str]:
        if rep.store is not store:
            # Closed under us: moved away or being rebuilt. Not a failure of the data.
            hosted = self.serving.get(rep.key) is rep
            return (_TOO_STALE, "replica is being rebuilt") if hosted else (_NOT_HOSTED, "replica moved away")
        rep.mark_corrupt(e.message)
        log.error("replica %s/%d: read failed, it will be rebuilt: %s", rep.table, rep.partition, e.message)
        return _ERROR, "replica store failed a read"


def _not_yet_visible(store: Any, read: store_pb2.KeyRead | store_pb2.GroupRead | store_pb2.RangeRead,
                     bound: store_pb2.ReadBound, applied: int) -> str | None:
    """Why the replica cannot answer ``read`` with every input event its bound names in it yet, or None if it can:
    it has applied the changelog to where every key reflects them, or each key's row reflects them itself (a range
    of rows has only the first way: its rows are of many keys, and of windows an event never touched)."""
    if bound.after_offset and applied >= bound.after_offset:
        return None
    after = bound.after_input
    held = None
    if isinstance(read, store_pb2.RangeRead):
        keys: list[bytes] = []
    else:
        keys = [read.key] if isinstance(read, store_pb2.KeyRead) else list(read.keys)
        missing = [(k, raw) for k, raw in zip(keys, store.positions_of(keys))
                   if not input_position.reflects(raw, after)]
        if not missing:
            return None
        keys = [k for k, _ in missing]
        held = input_position.decode(missing[0][1])
    needs = ", ".join(f"partition {p} offset {o}" for p, o in sorted(after.items()))
    where = (f"applied offset {applied} is below {bound.after_offset}, from which every row reflects them"
             if bound.after_offset else "no offset yet is known from which every row reflects them")
    whose = ""
    if keys:
        more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
        # How far the row is: per named partition, the latest input offset it reflects.
        at = ", ".join(f"partition {p} to {_offset_in(held, p)}" for p in sorted(after))
        whose = f"the row of key {keys[0][:64]!r}{more} reflects its input {at}, and "
    return f"the input events named ({needs}) are not yet visible: {whose}{where}"


def _offset_in(position: "input_position.InputPosition | None", partition: int) -> str:
    held = position[partition] if position is not None and partition < len(position) else None
    return "none" if held is None else str(held)


def _key(store: Any, read: store_pb2.KeyRead, out: store_pb2.KeyResult) -> None:
    value = store.get(read.key)
    if value is None:
        out.status = _NOT_FOUND
    else:
        out.status = _OK
        out.value = value


def _key_as_of(store: Any, read: store_pb2.KeyRead, out: store_pb2.KeyResult) -> None:
    """A versioned table's key as of a time: the version valid then, and when it was."""
    version = store.history.at(read.key, read.as_of_ms)
    if version is None:
        out.status = _NOT_FOUND
        return
    valid_from, valid_to, value = version
    out.valid_from_ms = valid_from
    if valid_to is not None:
        out.valid_to_ms = valid_to
    if value is None:
        out.status = _NOT_FOUND
    else:
        out.status = _OK
        out.value = value


def _group(store: Any, read: store_pb2.GroupRead, out: store_pb2.GroupResult) -> None:
    """Every value of a group of keys (empty bytes for a missing key), or one refusal for all of them."""
    values = store.get_many(list(read.keys))
    out.status = _OK
    out.values.extend([b"" if v is None else v for v in values])


def _range(store: Any, read: store_pb2.RangeRead, out: store_pb2.RangeResult) -> None:
    """A key range: a windowed table's windows with the partition's watermark, a key's versions, or plain rows."""
    if read.HasField("versions"):
        _versions(store, read, out)
        return
    if read.HasField("as_of_ms"):
        _rows_as_of(store, read, out)
        return
    keep = None
    if read.HasField("window"):
        # Read before the rows: the rows can only be as new as the watermark, or newer.
        watermark = parse_watermark(store.get(WATERMARK_KEY))
        out.watermark_ms = -1 if watermark is None else watermark
        w = read.window
        keep = live_starts(w.from_ms, w.to_ms, w.life_ms, watermark)
    rows = store.scan(read.start, read.end or None, read.limit, keep)  # an empty end is unbounded
    out.status = _OK
    add = out.entries.add
    for k, v in rows:
        add(key=k, value=v)


def _versions(store: Any, read: store_pb2.RangeRead, out: store_pb2.RangeResult) -> None:
    """A versioned table's versions of the key ``read.start`` (newest first)."""
    out.status = _OK
    add = out.entries.add
    for valid_from, valid_to, value in store.history.versions(read.start, read.versions.from_ms, read.versions.to_ms,
                                                     read.limit):
        add(key=read.start, value=value or b"", valid_from_ms=valid_from, valid_to_ms=valid_to,
            deleted=value is None)


def _rows_as_of(store: Any, read: store_pb2.RangeRead, out: store_pb2.RangeResult) -> None:
    """A versioned table's keys in ``[start, end)`` as of a time, each with its version's interval."""
    out.status = _OK
    add = out.entries.add
    for key, (valid_from, valid_to, value) in store.history.rows_at(read.start, read.end or None, read.as_of_ms,
                                                                    read.limit):
        add(key=key, value=value, valid_from_ms=valid_from, valid_to_ms=valid_to)


class HostedReplicas(Protocol):
    """What the read door reads of its node: its id and the replicas it serves at this moment."""

    node_id: str

    @property
    def serving(self) -> Mapping[tuple[str, int], "Replica"]: ...


class ReadPort:
    """The read door of a node: readers over the replicas it hosts at each moment, sharing their kept statuses."""

    def __init__(self, node: HostedReplicas, clock: Callable[[], int] = now_ms) -> None:
        self.node = node
        self.clock = clock
        self._node_id = node.node_id
        self._statuses: dict = {}  # (table, partition) -> (figures, status): touched by the port's front alone

    def reader(self) -> _Reader:
        """A reader over the replicas hosted now, with the clock read once."""
        return _Reader(self._node_id, self.node.serving, self.clock(), self._statuses)


class Answers:
    """A connection's frames answered in order: what either front of the port (store_node/read_port_front.py) asks of
    the node, with the bytes it read split into frames."""

    def __init__(self, reads: ReadPort, secret: ClusterSecret) -> None:
        self._reads = reads
        self._secret = secret

    def answer(self, peer: str, payloads: list[bytes], admitted: bool) -> tuple[bytes, bool]:
        """The frames answering ``payloads`` and whether the connection stays open (``admitted``: its peer was, by an
        earlier batch). A first batch without the cluster secret the node requires is answered by a refusal, nothing
        read, and the connection closed; so is one that is not a ``ReadBatch``, after the answers to those before."""
        out = []
        for payload in payloads:
            try:
                batch = store_pb2.ReadBatch.FromString(payload)
            except DecodeError as e:
                self.refuse(peer, str(e))
                return b"".join(out), False
            if not admitted:
                if self._secret.required and not self._secret.admits(batch.cluster_secret):
                    log.warning("read port: refused %s: %s", peer, REFUSAL)
                    out.append(_REFUSED)
                    return b"".join(out), False
                admitted = True
            out.append(frame(self._reads.reader().results(batch).SerializeToString()))
        return out[0] if len(out) == 1 else b"".join(out), True

    def refuse(self, peer: str, why: str) -> None:
        """A peer that does not speak the port's frames: said here, its connection dropped by the front."""
        log.warning("read port: dropping %s: %s", peer, why)


_REFUSED = frame(store_pb2.ResultBatch(refused=REFUSAL).SerializeToString())

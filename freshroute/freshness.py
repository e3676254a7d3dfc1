"""Freshness: how far behind a replica or a table is, the position an answer reflects, and the bound a caller sets.

Every role speaks this one vocabulary. A replica's **lag** is offsets behind its changelog's end and milliseconds
of staleness; a table's **input lag** is how far its changelog is behind the pipeline's input. An answer carries
the **position** it reflects (table, partition → next offset to apply), and a caller's **bound** limits all three:
the router and the client parse it, the selector skips replicas it knows cannot meet it, and the store node
refuses a read it cannot answer within it — so a stale routing view can never produce an out-of-bound answer.
Passing a position back as ``min_position`` gives monotonic reads and read-your-writes across replicas
(cf. Kafka Streams IQv2 ``Position``); its tokens are opaque to clients: a version tag plus base64url JSON.
"""

from __future__ import annotations

import base64
import binascii
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import orjson

from freshroute.errors import InvalidArgument, NoReplicaWithinBound
from proto import router_pb2, store_pb2



# ---- lag ---------------------------------------------------------------------------------------------------


def now_ms() -> int:
    """Milliseconds since the epoch: the clock of every lag and heartbeat."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class ReplicaLag:
    """Applied offset (next offset to apply) against the partition's end offset; lag never negative.

    ``end`` None: the replica has not learnt its partition's end offset yet, so its offset lag is unknown.
    """

    applied: int
    end: int | None
    staleness_ms: int = 0

    @property
    def offsets(self) -> int | None:
        return lag_offsets(self.applied, self.end)


def lag_offsets(applied: int, end: int | None) -> int | None:
    """Offsets a replica at ``applied`` is behind ``end``: never negative, None while the end is unknown."""
    return None if end is None else max(0, end - applied)


UNKNOWN_LAG_RANK = 1 << 62  # an unknown offset lag sorts behind every known one: never preferred for it


def rank_lag(offsets: int | None) -> int:
    """An offset lag as a sort key, freshest first, unknown last."""
    return UNKNOWN_LAG_RANK if offsets is None else offsets


# A replica never caught up reports its staleness counted from the epoch, more than any replica that ever was caught
# up, so that routing ranks it last; an answer says its lag in ms is unknown (null), not decades.
NEVER_CAUGHT_UP_MS = 20 * 365 * 86_400_000


def known_staleness(staleness_ms: int | None) -> int | None:
    """A replica's staleness as answers show it: None (unknown) when it has never been caught up."""
    return None if staleness_ms is None or staleness_ms >= NEVER_CAUGHT_UP_MS else staleness_ms


def rank_staleness(staleness_ms: int | None) -> int:
    """A shown staleness as a sort key, freshest first, unknown last."""
    return NEVER_CAUGHT_UP_MS if staleness_ms is None else staleness_ms


@dataclass(frozen=True)
class InputLag:
    """Where the pipeline is in a table's input, as the pipeline publishes it after each micro-batch and once a
    second besides: the input offsets its last batch read to, and when a batch last had read everything there
    was. With where the input ends (:class:`InputEnds`, read from the broker by a store node) it gives how far the
    table's changelog is behind its input at any moment — also when the pipeline has stopped: see :func:`input_lag_at`.
    """

    records: int  # input records beyond the last micro-batch's end, as that batch saw it
    caught_up_ms: int  # the start of the last micro-batch that read everything there was to read
    at_ms: int  # when the last micro-batch was seen
    offsets: dict[int, int] = field(default_factory=dict)  # input partition → the offset the last batch read to
    alive_ms: int = 0  # when the pipeline last said it is running the table's query (once a second)

    def ms(self, now: int) -> int:
        """Milliseconds the table's changelog is behind its input at ``now`` by the pipeline's own account."""
        return max(0, now - self.caught_up_ms) if self.records else 0

    def alive(self, now: int) -> bool:
        """Whether the pipeline is running the table's query: it has spoken within :data:`PIPELINE_EXPIRY_MS`."""
        return now - self.alive_ms <= PIPELINE_EXPIRY_MS

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_NON_STR_KEYS)

    @classmethod
    def from_json(cls, raw: bytes | str) -> "InputLag":
        d = orjson.loads(raw)
        return cls(int(d["records"]), int(d["caught_up_ms"]), int(d["at_ms"]),
                   {int(p): int(o) for p, o in (d.get("offsets") or {}).items()}, int(d.get("alive_ms", d["at_ms"])))


@dataclass(frozen=True)
class InputEnds:
    """Where an input topic ends (partition → the offset its next record will get), read from the broker."""

    ends: dict[int, int]
    at_ms: int

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_NON_STR_KEYS)

    @classmethod
    def from_json(cls, raw: bytes | str) -> "InputEnds":
        d = orjson.loads(raw)
        return cls({int(p): int(o) for p, o in d["ends"].items()}, int(d["at_ms"]))


# A pipeline silent this long (it speaks once a second) is not running; input ends older than this are not trusted.
PIPELINE_EXPIRY_MS = 3000
INPUT_ENDS_TRUST_MS = 3000


def input_lag_at(lag: "InputLag | None", ends: "InputEnds | None", now: int) -> tuple[int, int]:
    """(records, ms) a table's changelog is behind its input at ``now``.

    Records: the input's ends (fresh) beyond the offsets the pipeline's last batch read to; without them, what the
    pipeline said. Milliseconds: 0 when no record is behind, else since the last batch that had read everything.
    So when the pipeline stops or dies while its input grows, both grow: nothing waits for the pipeline to say so.
    A silent pipeline whose input's ends are not known is counted as behind since its last catch-up, never fresh.
    """
    if lag is None:
        return (0, 0)
    if ends is not None and lag.offsets and now - ends.at_ms <= INPUT_ENDS_TRUST_MS:
        records = sum(max(0, end - lag.offsets.get(p, 0)) for p, end in ends.ends.items())
    elif lag.alive(now):
        return (lag.records, lag.ms(now))
    else:
        return (lag.records, max(0, now - lag.caught_up_ms))
    return (records, max(0, now - lag.caught_up_ms)) if records else (0, 0)


NO_INPUT_LAG = InputLag(0, 0, 0)


# ---- what the changelog reflects ---------------------------------------------------------------------------


@dataclass(frozen=True)
class InputMark:
    """Where a table's changelog ended once its query had processed its input up to ``input`` (partition → next
    offset): published by the pipeline after each micro-batch, and after each checkpoint of a Real-time query, once
    the batch's rows are in Kafka. A replica of changelog partition ``c`` that has applied ``changelog[c]`` reflects
    every input record before ``input``, whichever keys they touched."""

    input: dict[int, int]
    changelog: dict[int, int]
    at_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {"i": self.input, "c": self.changelog, "t": self.at_ms}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "InputMark":
        return cls({int(p): int(o) for p, o in d["i"].items()}, {int(p): int(o) for p, o in d["c"].items()},
                   int(d["t"]))


MARKS_KEPT = 64  # a table's latest marks kept in the metadata store: a token older than all of them is long in


def marks_to_json(marks: Sequence[InputMark]) -> bytes:
    return orjson.dumps([m.to_dict() for m in marks], option=orjson.OPT_NON_STR_KEYS)


def marks_from_json(raw: bytes | str) -> tuple[InputMark, ...]:
    return tuple(InputMark.from_dict(d) for d in orjson.loads(raw))


def reflected_at(marks: Sequence[InputMark], offsets: Mapping[int, int]) -> dict[int, int] | None:
    """The changelog offsets from which every input record up to ``offsets`` (partition → offset, inclusive) is
    reflected: the first mark past all of them; None while no mark is."""
    for mark in marks:  # oldest first
        if all(mark.input.get(p, 0) > o for p, o in offsets.items()):
            return mark.changelog
    return None


REJECTIONS_KEPT = 256  # per input partition: the latest records the pipeline rejected, with their reason


def rejections_to_json(rejected: Mapping[int, Sequence[tuple[int, str]]]) -> bytes:
    return orjson.dumps({str(p): [list(r) for r in rs] for p, rs in rejected.items()})


def rejections_from_json(raw: bytes | str) -> dict[int, dict[int, str]]:
    """Input partition → offset → why the pipeline rejected that record."""
    return {int(p): {int(o): str(why) for o, why in rs} for p, rs in orjson.loads(raw).items()}


@dataclass(frozen=True)
class ReadAfter:
    """A write token narrowed to one table: the events of its input topic it names, and how a replica shows it
    reflects them — its key's row reflects them (the row's input position, written by a Real-time query, is at
    or past each: :func:`freshroute.input_position.reflects`), or the replica has applied the changelog up to
    where a mark (:class:`InputMark`) says the input was processed past them (``reflected``; empty while none
    is)."""

    topic: str
    offsets: Mapping[int, int]  # input partition → offset of the latest event written there
    reflected: Mapping[int, int]  # changelog partition → applied offset from which every event named is in
    # Why the pipeline rejected one of the named events, if it did (read from the latest routing metadata).
    rejection: Callable[[], str | None] = field(default=lambda: None, compare=False, repr=False)

    def after_offset(self, partition: int) -> int:
        """The applied offset of ``partition`` from which the replica reflects every event named (0: unknown)."""
        return self.reflected.get(partition, 0)

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "offsets": {str(p): o for p, o in self.offsets.items()}}


# ---- position ----------------------------------------------------------------------------------------------

_PREFIX = "p1."
MAX_TOKEN_LENGTH = 8192


@dataclass(frozen=True)
class Position:
    """Per-partition applied offsets (next offset to apply) of one table."""

    table: str
    offsets: dict[int, int] = field(default_factory=dict)

    def offset_for(self, partition: int) -> int:
        return self.offsets.get(partition, 0)

    def merge(self, other: "Position") -> "Position":
        """The later of two positions, partition by partition (for sessions spanning keys)."""
        if other.table != self.table:
            raise InvalidArgument("positions of different tables cannot be merged", tables=[self.table, other.table])
        merged = dict(self.offsets)
        for p, o in other.offsets.items():
            merged[p] = max(merged.get(p, 0), o)
        return Position(self.table, merged)

    def encode(self) -> str:
        raw = orjson.dumps({"t": self.table, "o": {str(p): o for p, o in self.offsets.items()}})
        return _PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    @classmethod
    def decode(cls, token: str) -> "Position":
        """Parse a token; anything malformed is an :class:`InvalidArgument`."""
        if not isinstance(token, str) or not token.startswith(_PREFIX) or len(token) > MAX_TOKEN_LENGTH:
            raise InvalidArgument("min_position is not a position token", field="min_position")
        body = token[len(_PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            doc = orjson.loads(raw)
            table = doc["t"]
            offsets = {int(p): int(o) for p, o in doc["o"].items()}
        except (binascii.Error, ValueError, KeyError, TypeError, AttributeError, orjson.JSONDecodeError):
            raise InvalidArgument("min_position is not a position token", field="min_position") from None
        if not isinstance(table, str) or any(p < 0 or o < 0 for p, o in offsets.items()):
            raise InvalidArgument("min_position is not a position token", field="min_position")
        return cls(table, offsets)


def single(table: str, partition: int, offset: int) -> str:
    """Token for one partition's position, as a lookup response reports it."""
    return Position(table, {partition: offset}).encode()


# ---- write tokens ------------------------------------------------------------------------------------------
# What a writer holds once its input event is in Kafka (:mod:`freshroute.write_token` makes one from a delivery
# report): per input topic and partition the offset of the latest event written, per table the changelog position
# of what the session last read. ``w1.`` + base64url(JSON) + ``.`` + the CRC-32 of the JSON: opaque to its holder,
# and one cut or altered in transit is refused rather than read as another.

WRITE_TOKEN_PREFIX = "w1."
MAX_OFFSET = (1 << 63) - 1


@dataclass(frozen=True)
class WriteToken:
    """Input events written (topic → partition → offset of the latest) and changelog positions read (table →
    partition → applied offset), and when the latest event was written (its producer's timestamp, ms)."""

    inputs: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    reads: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    written_ms: int = 0

    def combine(self, other: "WriteToken") -> "WriteToken":
        """Both tokens' events and reads: the later offset per partition."""
        return WriteToken(_later(self.inputs, other.inputs), _later(self.reads, other.reads),
                          max(self.written_ms, other.written_ms))

    def read_position(self, table: str) -> Position | None:
        """What the token says was read of ``table``, as a ``min_position``; None if nothing."""
        offsets = self.reads.get(table)
        return Position(table, dict(offsets)) if offsets else None

    def encode(self) -> str:
        raw = orjson.dumps({"i": {t: {str(p): o for p, o in parts.items()} for t, parts in self.inputs.items()},
                            "r": {t: {str(p): o for p, o in parts.items()} for t, parts in self.reads.items()},
                            "t": self.written_ms})
        body = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
        return f"{WRITE_TOKEN_PREFIX}{body}.{zlib.crc32(raw):08x}"

    @classmethod
    def decode(cls, token: str, name: str = "after") -> "WriteToken":
        """Parse a token; anything malformed, cut or altered is an :class:`InvalidArgument` naming ``name``."""
        if not isinstance(token, str) or not token.startswith(WRITE_TOKEN_PREFIX) or len(token) > MAX_TOKEN_LENGTH:
            raise InvalidArgument(f"{name} is not a write token (freshroute.client.write_token makes one)", field=name)
        body, _, crc = token[len(WRITE_TOKEN_PREFIX):].rpartition(".")
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"{name} is not a write token", field=name) from None
        if len(crc) != 8 or f"{zlib.crc32(raw):08x}" != crc:
            raise InvalidArgument(f"{name} is not a write token as it was made: its checksum does not match "
                                  f"(cut or altered)", field=name)
        try:
            doc = orjson.loads(raw)
            token_ = cls(_offsets(doc["i"]), _offsets(doc["r"]), int(doc["t"]))
        except (KeyError, TypeError, ValueError, AttributeError, orjson.JSONDecodeError):
            raise InvalidArgument(f"{name} is not a write token", field=name) from None
        if not token_.inputs and not token_.reads:
            raise InvalidArgument(f"{name} names no write and no read", field=name)
        return token_


def _offsets(doc: Any) -> dict[str, dict[int, int]]:
    out = {}
    for name, parts in doc.items():
        if not isinstance(name, str) or not name:
            raise ValueError("a topic or table name")
        offsets = {int(p): o for p, o in parts.items()}
        if any(type(o) is not int or not 0 <= o <= MAX_OFFSET or p < 0 for p, o in offsets.items()):
            raise ValueError("an offset")
        out[name] = offsets
    return out


def _later(a: Mapping[str, Mapping[int, int]], b: Mapping[str, Mapping[int, int]]) -> dict[str, dict[int, int]]:
    out = {name: dict(parts) for name, parts in a.items()}
    for name, parts in b.items():
        mine = out.setdefault(name, {})
        for p, o in parts.items():
            mine[p] = max(mine.get(p, -1), o)
    return out


def parse_after(raw: "str | WriteToken | None") -> "WriteToken | None":
    """An ``after`` value (a token string, or a token) as a :class:`WriteToken`; None when absent."""
    if raw is None or raw == "":
        return None
    return raw if isinstance(raw, WriteToken) else WriteToken.decode(raw)


# ---- bound -------------------------------------------------------------------------------------------------

MAX_LIMIT = (1 << 63) - 1  # a bound or limit is an int64, as on the gRPC wire


class Bound(NamedTuple):
    """How fresh an answer must be; ``None`` means no limit. A tuple: one is made for nearly every read, and a tuple
    costs a fraction of a frozen dataclass to make."""

    max_lag: int | None = None
    max_staleness_ms: int | None = None
    min_position: Position | None = None
    # How far the table's changelog may be behind its input (the pipeline's lag, not a replica's): checked once per
    # read against the table's input lag, before any replica is asked.
    max_input_lag_ms: int | None = None
    # Events the answer must include (the caller's write token), how long to wait for a replica that has them, and
    # the token narrowed to the table read (filled in by the router, who knows the table's input and its marks).
    after: WriteToken | None = None
    wait_ms: int | None = None
    read_after: ReadAfter | None = None

    @property
    def unbounded(self) -> bool:
        return (self.max_lag is None and self.max_staleness_ms is None and self.min_position is None
                and self.max_input_lag_ms is None and self.after is None)

    def min_offset(self, partition: int) -> int:
        """The applied offset a replica of ``partition`` must have reached (0 = any)."""
        return self.min_position.offset_for(partition) if self.min_position is not None else 0

    def refusal(self, partition: int, applied: int, end: int | None, staleness_ms: int) -> str | None:
        """Why a replica of ``partition`` at this lag must not answer under this bound, or None if it may.

        ``end`` None: the replica does not know its partition's end offset yet.
        """
        min_offset = self.min_offset(partition)
        if min_offset > applied:
            return f"applied offset {applied} is below the requested position {min_offset}"
        if self.max_lag is not None:
            if end is None:
                return "the partition's end offset is not known yet"
            behind = end - applied
            if behind > self.max_lag:
                return f"replica is {behind} offsets behind, bound is {self.max_lag}"
        if self.max_staleness_ms is not None and staleness_ms > self.max_staleness_ms:
            return f"replica is {staleness_ms} ms stale, bound is {self.max_staleness_ms} ms"
        return None

    def behind_position_only(self, partition: int, applied: int, end: int | None, staleness_ms: int) -> bool:
        """Whether a replica of ``partition`` at this lag is refused for the position alone: below it, and within
        every other limit (one tailing its changelog gets there)."""
        return (self.min_offset(partition) > applied
                and Bound(self.max_lag, self.max_staleness_ms).refusal(partition, applied, end, staleness_ms) is None)

    def with_defaults(self, max_lag: int | None, max_staleness_ms: int | None) -> "Bound":
        """Fill unset limits from the table's defaults."""
        if (self.max_lag is not None or max_lag is None) and (self.max_staleness_ms is not None or max_staleness_ms is None):
            return self
        return self._replace(max_lag=self.max_lag if self.max_lag is not None else max_lag,
                             max_staleness_ms=self.max_staleness_ms if self.max_staleness_ms is not None
                             else max_staleness_ms)

    def to_dict(self) -> dict[str, Any]:
        """The bound as error details show it."""
        out: dict[str, Any] = {"max_lag": self.max_lag, "max_staleness_ms": self.max_staleness_ms}
        if self.min_position is not None:
            out["min_position"] = self.min_position.encode()
        if self.max_input_lag_ms is not None:
            out["max_input_lag_ms"] = self.max_input_lag_ms
        if self.after is not None:
            out["after"] = self.after.encode()
        return out

    def input_lag_refusal(self, table: str, input_lag: tuple[int, int]) -> "NoReplicaWithinBound | None":
        """The refusal of a read of ``table`` whose changelog is ``input_lag`` (records, ms) behind its input, or None."""
        if self.max_input_lag_ms is None or input_lag[1] <= self.max_input_lag_ms:
            return None
        return NoReplicaWithinBound(
            f"table {table!r} is {input_lag[1]} ms behind its input ({input_lag[0]} records not yet processed by "
            f"the pipeline), bound is {self.max_input_lag_ms} ms", table=table, bound=self.to_dict(),
            input_lag={"records": input_lag[0], "ms": input_lag[1]})

    # ---- the wire ----------------------------------------------------------------------

    def to_store(self, partition: int) -> store_pb2.ReadBound:
        """The bound as a store node checks it: the position narrowed to ``partition``."""
        after = self.read_after
        if after is None:
            return store_pb2.ReadBound(max_lag=self.max_lag, max_staleness_ms=self.max_staleness_ms,
                                       min_offset=self.min_offset(partition))
        return store_pb2.ReadBound(max_lag=self.max_lag, max_staleness_ms=self.max_staleness_ms,
                                   min_offset=self.min_offset(partition), after_input=after.offsets,
                                   after_offset=after.after_offset(partition))

    @classmethod
    def from_store(cls, table: str, partition: int, msg: store_pb2.ReadBound) -> "Bound":
        offset = msg.min_offset
        return cls(msg.max_lag if msg.HasField("max_lag") else None,
                   msg.max_staleness_ms if msg.HasField("max_staleness_ms") else None,
                   Position(table, {partition: offset}) if offset > 0 else None)

    def to_message(self) -> router_pb2.Bound:
        """The bound in the public gRPC API."""
        return router_pb2.Bound(max_lag=self.max_lag, max_staleness_ms=self.max_staleness_ms,
                                min_position=self.min_position.encode() if self.min_position is not None else "",
                                max_input_lag_ms=self.max_input_lag_ms,
                                after=self.after.encode() if self.after is not None else "", wait_ms=self.wait_ms)

    @classmethod
    def from_message(cls, msg: router_pb2.Bound) -> "Bound":
        """A public gRPC ``Bound``; anything malformed is an InvalidArgument naming the field."""
        return parse_bound(msg.max_lag if msg.HasField("max_lag") else None,
                           msg.max_staleness_ms if msg.HasField("max_staleness_ms") else None,
                           msg.min_position or None,
                           msg.max_input_lag_ms if msg.HasField("max_input_lag_ms") else None,
                           msg.after or None, msg.wait_ms if msg.HasField("wait_ms") else None)

    def to_query(self) -> dict[str, str]:
        """The bound as REST query parameters."""
        out = {}
        if self.max_lag is not None:
            out["max_lag"] = str(self.max_lag)
        if self.max_staleness_ms is not None:
            out["max_staleness_ms"] = str(self.max_staleness_ms)
        if self.min_position is not None:
            out["min_position"] = self.min_position.encode()
        if self.max_input_lag_ms is not None:
            out["max_input_lag_ms"] = str(self.max_input_lag_ms)
        if self.after is not None:
            out["after"] = self.after.encode()
        if self.wait_ms is not None:
            out["wait_ms"] = str(self.wait_ms)
        return out


NO_BOUND = Bound()


def parse_limit(name: str, raw: Any) -> int | None:
    """A non-negative integer limit from a query value or JSON number; ``None`` if absent."""
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise InvalidArgument(f"{name} must be a non-negative integer", field=name)
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)  # JSON Schema counts 5.0 as an integer; JSON bodies may carry it so
    else:
        text = raw.strip() if isinstance(raw, str) else None
        # int() alone would accept "1_000" and " +5"; a bound is plain decimal digits.
        if not text or not text.isascii() or not text.isdigit():
            raise InvalidArgument(f"{name} must be a non-negative integer, got {str(raw)[:40]!r}", field=name)
        value = int(text)
    if value < 0 or value > MAX_LIMIT:
        raise InvalidArgument(f"{name} must be a non-negative integer, got {value}", field=name)
    return value


def parse_millis(name: str, raw: Any) -> int:
    """A required time in milliseconds since the epoch (a window bound) from a query value."""
    if raw is None or raw == "":
        raise InvalidArgument(f"{name} is required: a time in milliseconds since the epoch", field=name)
    text = raw.strip() if isinstance(raw, str) else None
    if not text or not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) >= 1 << 63:
        raise InvalidArgument(f"{name} must be a whole number of milliseconds since the epoch, got {str(raw)[:40]!r}",
                              field=name)
    return int(text)


def parse_position(raw: str | Position | None) -> Position | None:
    """Decode a ``min_position`` token (or take a Position); whose table it is, the read checks."""
    if not raw:
        return None
    return raw if isinstance(raw, Position) else Position.decode(raw)


MAX_WAIT_MS = 60_000


def parse_bound(max_lag: Any = None, max_staleness_ms: Any = None, min_position: str | Position | None = None,
                max_input_lag_ms: Any = None, after: str | WriteToken | None = None, wait_ms: Any = None) -> Bound:
    """A caller's bound from raw values; anything malformed is an InvalidArgument naming the field."""
    if (max_lag is None and max_staleness_ms is None and not min_position and max_input_lag_ms is None and not after
            and wait_ms is None):
        return NO_BOUND
    token = None
    if after:
        token = parse_after(after)
    wait = parse_limit("wait_ms", wait_ms)
    if wait is not None and not 1 <= wait <= MAX_WAIT_MS:
        raise InvalidArgument(f"wait_ms must be from 1 to {MAX_WAIT_MS}, got {wait}", field="wait_ms")
    return Bound(parse_limit("max_lag", max_lag), parse_limit("max_staleness_ms", max_staleness_ms),
                 parse_position(min_position), parse_limit("max_input_lag_ms", max_input_lag_ms), token, wait)


def parse_query_bound(params: Mapping[str, str]) -> Bound:
    """A bound from REST query parameters (already split)."""
    return parse_bound(params.get("max_lag"), params.get("max_staleness_ms"), params.get("min_position"),
                       params.get("max_input_lag_ms"), params.get("after"), params.get("wait_ms"))

"""A caller's bound: how fresh an answer must be. The router and the client parse it, the selector skips replicas
it knows cannot meet it, and the store node refuses a read it cannot answer within it — so a stale routing view can
never produce an out-of-bound answer."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from freshroute.errors import InvalidArgument, NoReplicaWithinBound
from freshroute.position import Position
from freshroute.write_tokens.token import ReadAfter, WriteToken, parse_after
from proto import router_pb2, store_pb2

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

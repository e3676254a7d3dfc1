"""A caller's bound: how fresh an answer must be, defined once, here.

Each parameter of a bound is declared once, as a field of :class:`Bound` annotated with what it is
(:class:`Parameter`: how a caller's raw value is read, documented and judged); every front reads a bound with
:meth:`Bound.parse`, every encoding writes :meth:`Bound.shown`, and the REST schema, the CLI's flags and the clients'
keywords follow from the fields. The router and the client judge a replica they know with :meth:`Bound.refusal`, and
the store node refuses a read it cannot answer within the bound with the same function — so a stale routing view can
never produce an out-of-bound answer.
"""

from __future__ import annotations

import operator
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Mapping, NamedTuple, TypedDict, cast

from freshroute.errors import InvalidArgument, NoReplicaWithinBound
from freshroute.position import POSITION_SCHEMA, Position
from freshroute.write_tokens.token import WRITE_TOKEN_SCHEMA, ReadAfter, WriteToken, parse_after

MAX_LIMIT = (1 << 63) - 1  # a bound or limit is an int64, as on the gRPC wire
MAX_WAIT_MS = 60_000
MAX_VERSION = (1 << 31) - 1  # an int32, as answers carry it


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


def parse_position(name: str, raw: str | Position | None) -> Position | None:
    """A ``min_position`` token (or a Position); whose table it is, the read checks."""
    if raw is None or raw == "":
        return None
    return raw if isinstance(raw, Position) else Position.decode(raw)


def _after(name: str, raw: str | WriteToken | None) -> WriteToken | None:
    return parse_after(raw)


def _wait(name: str, raw: Any) -> int | None:
    wait = parse_limit(name, raw)
    if wait is not None and not 1 <= wait <= MAX_WAIT_MS:
        raise InvalidArgument(f"{name} must be from 1 to {MAX_WAIT_MS}, got {wait}", field=name)
    return wait


def _version(name: str, raw: Any) -> int | None:
    version = parse_limit(name, raw)
    if version is not None and not 1 <= version <= MAX_VERSION:
        raise InvalidArgument(f"{name} must be a table version from 1 to {MAX_VERSION}, got {version}", field=name)
    return version


LIMIT_SCHEMA: Mapping[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT}


@dataclass(frozen=True)
class Parameter:
    """What one parameter of a bound is: how a caller's raw value (text, a JSON value, a keyword's value) is read,
    how it is documented, and who judges it."""

    doc: str
    parse: Callable[[str, Any], Any]  # (its name, a raw value) → its value, or None; malformed: InvalidArgument
    schema: Mapping[str, Any]  # its JSON Schema, as the REST API documents it
    # A limit every read carries to the replica that answers, under the same name on the read port: the replica
    # judges it against its own lag (with :meth:`Bound.refusal`) and refuses the read it cannot answer within it.
    replica: bool = False
    limits: bool = True  # whether it limits the answer at all (a wait only says for how long to look)
    # Whether the compiled read paths (native/dataplane) judge it: a bound with any other set is the Python path's (but
    # for the router's key lookups and Get, which also wait for a write token's events: after, wait_ms).
    compiled: bool = False


class Bound(NamedTuple):
    """How fresh an answer must be; ``None`` means no limit. A tuple: one is made for nearly every read, and a tuple
    costs a fraction of a frozen dataclass to make."""

    max_lag: Annotated[int | None, Parameter(
        "at most this many changelog offsets behind (default: the table's)", parse_limit, LIMIT_SCHEMA,
        replica=True, compiled=True)] = None
    max_staleness_ms: Annotated[int | None, Parameter(
        "at most this many ms since the replica was caught up (default: the table's)", parse_limit, LIMIT_SCHEMA,
        replica=True, compiled=True)] = None
    min_position: Annotated[Position | None, Parameter(
        "a position token (`p1.…`, opaque) from an earlier response of this table: answer at least that fresh",
        parse_position, POSITION_SCHEMA, compiled=True)] = None
    # How far the table's changelog may be behind its input (the pipeline's lag, not a replica's): checked once per
    # read against the table's input lag, before any replica is asked.
    max_input_lag_ms: Annotated[int | None, Parameter(
        "at most this many ms between the table's changelog and its input (the pipeline's lag)", parse_limit,
        LIMIT_SCHEMA)] = None
    # Events the answer must include (the caller's write token), and how long to wait for a replica that has them.
    after: Annotated[WriteToken | None, Parameter(
        "a write token (`w1.…`, freshroute.client.write_token of a producer's delivery report): answer only with a "
        "value that includes those input events, waiting for a replica that has them", _after,
        WRITE_TOKEN_SCHEMA)] = None
    wait_ms: Annotated[int | None, Parameter(
        "how long to wait for a replica with the events (`after`) or the position: the lookup's deadline", _wait,
        {"type": "integer", "minimum": 1, "maximum": MAX_WAIT_MS}, limits=False)] = None
    # Not how fresh, but which table: the router reads that version's own table (freshroute.metadata.table_versions).
    version: Annotated[int | None, Parameter(
        "the table's version to read: one building or kept for a rollback, to compare it with the one served "
        "(default: the one served)", _version, {"type": "integer", "minimum": 1, "maximum": MAX_VERSION},
        limits=False)] = None
    # Not a parameter: the token narrowed to the table read, filled in by the router, who knows the table's input
    # and its marks.
    read_after: ReadAfter | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> "Bound":
        """A caller's bound from raw values by name — REST query parameters, a JSON body, keywords, a gRPC message's
        fields — where other names are not the bound's; anything malformed is an InvalidArgument naming it."""
        values: list[Any] | None = None
        for name, value in raw.items():  # a caller gives few, if any: their names, not every parameter's, are looked up
            parser = _PARSERS.get(name)
            if parser is not None and value is not None and (value := parser[1](name, value)) is not None:
                if values is None:
                    values = [None] * len(cls._fields)
                values[parser[0]] = value
        return NO_BOUND if values is None else cls._make(values)

    @classmethod
    def of(cls, bound: "Bound | None", shorthand: Mapping[str, Any]) -> "Bound":
        """``bound`` with a caller's keyword shorthands (``max_lag=5``) over it."""
        if not shorthand:
            return NO_BOUND if bound is None else bound
        parsed = cls.parse(shorthand)
        if bound is None:
            return parsed
        # Field by field, the shorthand's where it gives one (it gives none but parameters), else the bound's.
        return cls._make(p if p is not None else b for p, b in zip(parsed, bound))

    def shown(self) -> dict[str, int | str]:
        """The parameters set, as every wire shows them: numbers, and tokens as text."""
        # The parameters are the fields before read_after: zip stops there.
        parameters = cast("tuple[int | Position | WriteToken | None, ...]", self)
        return {name: value if isinstance(value, int) else value.encode()
                for name, value in zip(PARAMETERS, parameters) if value is not None}

    def to_query(self) -> dict[str, str]:
        """The bound as REST query parameters."""
        return {name: str(value) for name, value in self.shown().items()}

    def to_dict(self) -> dict[str, Any]:
        """The bound as error details show it: what limits the answer, the replica's limits also when unset."""
        return {**dict.fromkeys(REPLICA_LIMITS), **{name: value for name, value in self.shown().items()
                                                    if PARAMETERS[name].limits}}

    @property
    def compiled(self) -> bool:
        """Whether the compiled read paths judge this whole bound: it sets none of the parameters they leave to the
        Python path (nor a narrowed write token)."""
        return bool(_uncompiled(self) == _UNCOMPILED_UNSET)

    @property
    def unbounded(self) -> bool:
        return bool(_limiting(self) == _UNLIMITED)

    def min_offset(self, partition: int) -> int:
        """The applied offset a replica of ``partition`` must have reached (0 = any)."""
        return self.min_position.offset_for(partition) if self.min_position is not None else 0

    def refusal(self, partition: int, applied: int, end: int | None, staleness_ms: int) -> str | None:
        """Why a replica of ``partition`` at this lag must not answer under this bound, or None if it may: the one
        judgement of a replica, by the router and the client of the replicas they know, and by the store node of
        itself.

        ``end`` None: the replica does not know its partition's end offset yet.
        """
        min_offset = self.min_offset(partition)
        if min_offset > applied:
            return f"applied offset {applied} is below the requested position {min_offset}"
        return self.lag_refusal(applied, end, staleness_ms)

    def lag_refusal(self, applied: int, end: int | None, staleness_ms: int) -> str | None:
        """Why a replica at this lag is outside the bound's lag limits, its position aside, or None if it is not."""
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
        return self.min_offset(partition) > applied and self.lag_refusal(applied, end, staleness_ms) is None

    def with_defaults(self, max_lag: int | None, max_staleness_ms: int | None) -> "Bound":
        """Fill unset limits from the table's defaults."""
        if ((self.max_lag is not None or max_lag is None)
                and (self.max_staleness_ms is not None or max_staleness_ms is None)):
            return self
        return self._replace(max_lag=self.max_lag if self.max_lag is not None else max_lag,
                             max_staleness_ms=self.max_staleness_ms if self.max_staleness_ms is not None
                             else max_staleness_ms)

    def input_lag_refusal(self, table: str, input_lag: tuple[int, int]) -> "NoReplicaWithinBound | None":
        """The refusal of a read of ``table`` whose changelog is ``input_lag`` (records, ms) behind its input, or
        None."""
        if self.max_input_lag_ms is None or input_lag[1] <= self.max_input_lag_ms:
            return None
        return NoReplicaWithinBound(
            f"table {table!r} is {input_lag[1]} ms behind its input ({input_lag[0]} records not yet processed by "
            f"the pipeline), bound is {self.max_input_lag_ms} ms", table=table, bound=self.to_dict(),
            input_lag={"records": input_lag[0], "ms": input_lag[1]})


class BoundArgs(TypedDict, total=False):
    """A bound's parameters as a caller's keywords (``client.get(table, key, max_lag=5)``), read by
    :meth:`Bound.of`: the fields of :class:`Bound` that are parameters, as a type checker sees them."""

    max_lag: int
    max_staleness_ms: int
    min_position: str | Position
    max_input_lag_ms: int
    after: str | WriteToken
    wait_ms: int
    version: int


# Every parameter of a bound by name, in the order of its fields: what the fields' annotations declare.
PARAMETERS: dict[str, Parameter] = {
    name: next(m for m in hint.__metadata__ if isinstance(m, Parameter))
    for name, hint in typing.get_type_hints(Bound, include_extras=True).items() if hasattr(hint, "__metadata__")}
REPLICA_LIMITS = tuple(name for name, p in PARAMETERS.items() if p.replica)
_PARSERS = {name: (i, p.parse) for i, (name, p) in enumerate(PARAMETERS.items())}
# What limits an answer, read at once: a bound has several limits (one alone would read as a value, not a tuple).
_LIMITING = tuple(i for i, p in enumerate(PARAMETERS.values()) if p.limits)
assert len(_LIMITING) > 1
_limiting: Callable[[Bound], tuple[Any, ...]] = operator.itemgetter(*_LIMITING)
_UNLIMITED = (None,) * len(_LIMITING)
# The fields the compiled read paths leave to the Python path: every parameter not marked compiled, and read_after.
_UNCOMPILED = tuple(i for i, p in enumerate(PARAMETERS.values()) if not p.compiled) + (len(PARAMETERS),)
_uncompiled: Callable[[Bound], tuple[Any, ...]] = operator.itemgetter(*_UNCOMPILED)
_UNCOMPILED_UNSET = (None,) * len(_UNCOMPILED)
NO_BOUND = Bound()

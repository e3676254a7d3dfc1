"""Freshness bounds of a read: parsed from REST query strings or gRPC messages, defaults filled in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from freshroute.errors import InvalidArgument
from freshroute.position import Position

_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Bound:
    """How fresh an answer must be; ``None`` means no limit."""

    max_lag: int | None = None
    max_staleness_ms: int | None = None
    min_position: Position | None = None

    def min_offset(self, partition: int) -> int:
        """The applied offset a replica of ``partition`` must have reached (0 = any)."""
        return self.min_position.offset_for(partition) if self.min_position is not None else 0

    def with_defaults(self, max_lag: int | None, max_staleness_ms: int | None) -> "Bound":
        """Fill unset limits from the table's defaults."""
        if (self.max_lag is not None or max_lag is None) and (self.max_staleness_ms is not None or max_staleness_ms is None):
            return self
        return Bound(self.max_lag if self.max_lag is not None else max_lag,
                     self.max_staleness_ms if self.max_staleness_ms is not None else max_staleness_ms,
                     self.min_position)

    def to_dict(self) -> dict[str, Any]:
        """The bound as error details show it."""
        out: dict[str, Any] = {"max_lag": self.max_lag, "max_staleness_ms": self.max_staleness_ms}
        if self.min_position is not None:
            out["min_position"] = self.min_position.encode()
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
    else:
        text = raw.strip() if isinstance(raw, str) else None
        # int() alone would accept "1_000" and " +5"; a bound is plain decimal digits.
        if not text or not text.isascii() or not text.isdigit():
            raise InvalidArgument(f"{name} must be a non-negative integer, got {str(raw)[:40]!r}", field=name)
        value = int(text)
    if value < 0 or value > _MAX:
        raise InvalidArgument(f"{name} must be a non-negative integer, got {value}", field=name)
    return value


def parse_position(table: str, raw: str | None) -> Position | None:
    """Decode a ``min_position`` token and check it belongs to ``table``."""
    if not raw:
        return None
    position = Position.decode(raw)
    if position.table != table:
        raise InvalidArgument(f"min_position is a position of table {position.table!r}, not {table!r}",
                              field="min_position")
    return position


def parse_bound(table: str, max_lag: Any = None, max_staleness_ms: Any = None, min_position: str | None = None) -> Bound:
    """A caller's bound from raw values; anything malformed is an InvalidArgument naming the field."""
    if max_lag is None and max_staleness_ms is None and not min_position:
        return NO_BOUND
    return Bound(parse_limit("max_lag", max_lag), parse_limit("max_staleness_ms", max_staleness_ms),
                 parse_position(table, min_position))


def parse_query_bound(table: str, params: dict[str, str]) -> Bound:
    """A bound from REST query parameters (already split)."""
    return parse_bound(table, params.get("max_lag"), params.get("max_staleness_ms"), params.get("min_position"))

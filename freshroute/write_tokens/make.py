"""A write token made from what a writer holds: delivery reports, (topic, partition, offset) tuples, tokens and
the positions of what a session read."""

from __future__ import annotations

from typing import Any

from freshroute.errors import InvalidArgument
from freshroute.position import Position
from freshroute.write_tokens.token import MAX_OFFSET, WRITE_TOKEN_PREFIX, WriteToken

def write_token(*items: Any) -> str:
    """One token for everything given: a confluent-kafka ``Message`` from a delivery report (or the producer's
    ``produce`` callback), a ``(topic, partition, offset)`` tuple, a write token, or a lookup's position (a
    ``position`` string, or a result carrying one) to carry what a session read."""
    if not items:
        raise InvalidArgument("write_token needs a delivered message, (topic, partition, offset), or a token",
                              field="after")
    token = WriteToken()
    for item in items:
        token = token.combine(_token_of(item))
    return token.encode()


def _token_of(item: Any) -> WriteToken:
    if isinstance(item, WriteToken):
        return item
    if isinstance(item, str):
        if item.startswith(WRITE_TOKEN_PREFIX):
            return WriteToken.decode(item)
        return _read(Position.decode(item))
    if isinstance(item, Position):
        return _read(item)
    if isinstance(item, tuple):
        if len(item) not in (3, 4) or not isinstance(item[0], str) or not all(type(v) is int for v in item[1:]):
            raise InvalidArgument(f"a write is (topic, partition, offset[, timestamp_ms]), not {item!r}"[:200],
                                  field="after")
        topic, partition, offset, *ts = item
        return _written(topic, partition, offset, ts[0] if ts else 0)
    if callable(getattr(item, "offset", None)) and callable(getattr(item, "topic", None)):
        error = item.error() if callable(getattr(item, "error", None)) else None
        if error is not None:
            raise InvalidArgument(f"the message was not delivered ({error}): there is nothing to wait for",
                                  field="after")
        stamp = item.timestamp() if callable(getattr(item, "timestamp", None)) else (0, 0)
        return _written(item.topic(), item.partition(), item.offset(), max(0, stamp[1]) if stamp else 0)
    position = getattr(item, "position", None)
    if isinstance(position, str):
        return _read(Position.decode(position))
    raise InvalidArgument(f"write_token takes delivered messages, (topic, partition, offset), tokens and "
                          f"positions, not {type(item).__name__}", field="after")


def _written(topic: str, partition: int, offset: int | None, written_ms: int) -> WriteToken:
    if not topic or partition is None or partition < 0 or offset is None or not 0 <= offset <= MAX_OFFSET:
        raise InvalidArgument(f"no delivered write at {topic!r}/{partition}/{offset}", field="after")
    return WriteToken({topic: {partition: offset}}, {}, written_ms)


def _read(position: Position) -> WriteToken:
    return WriteToken({}, {position.table: dict(position.offsets)}, 0)

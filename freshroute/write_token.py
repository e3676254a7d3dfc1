"""Write tokens: what a writer holds once its input event is in Kafka, handed to a lookup that must include it.

A token names, for each input topic and partition, the offset of the latest event the writer produced (its
producer's delivery report says where it went), and for each table the changelog position of what the session
last read (a lookup's ``position``). Tokens combine: the later offset per partition wins, so one token can carry
"everything I wrote and everything I read". A lookup given one (``after=``) answers only with a value that
reflects those events (:class:`freshroute.freshness.ReadAfter` says how a replica knows).

A token is ``w1.`` + base64url(JSON) + ``.`` + the CRC-32 of that JSON in hex: opaque to its holder, and one cut
or altered in transit is refused rather than read as another. It proves nothing about who wrote the events: a
token names offsets anyone may read.
"""

from __future__ import annotations

from typing import Any

from freshroute.errors import InvalidArgument
from freshroute.freshness import MAX_OFFSET, WRITE_TOKEN_PREFIX, Position, WriteToken, parse_after

__all__ = ["WriteToken", "parse_after", "write_token"]


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

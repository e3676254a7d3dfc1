"""A position: the per-partition applied offsets of one table an answer reflects. Passed back as ``min_position``
it gives monotonic reads and read-your-writes across replicas (cf. Kafka Streams IQv2 ``Position``); its tokens are
opaque to clients: a version tag plus base64url JSON."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Mapping, NamedTuple

import orjson

from freshroute.errors import InvalidArgument

_PREFIX = "p1."
MAX_TOKEN_LENGTH = 8192
# Tokens are opaque to clients; their format is named so that tools can tell them from free text.
POSITION_FORMAT = "freshroute-position"
POSITION_SCHEMA: Mapping[str, Any] = {"type": "string", "format": POSITION_FORMAT,
                                      "maxLength": MAX_TOKEN_LENGTH}


class Position(NamedTuple):
    """Per-partition applied offsets (next offset to apply) of one table.

    A tuple: a session's reads send one with every bound, and a bound asks whether it limits anything by comparing
    its fields with None, which a tuple answers without a call into Python (a dataclass's ``__eq__`` is one)."""

    table: str
    offsets: dict[int, int]

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

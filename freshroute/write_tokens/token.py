"""A write token as a value (``w1.`` + base64url(JSON) + ``.`` + the CRC-32 of the JSON) and its parsing, and the
token narrowed to one table as a lookup carries it."""

from __future__ import annotations

import base64
import binascii
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import orjson

from freshroute.errors import InvalidArgument
from freshroute.position import MAX_TOKEN_LENGTH, Position

WRITE_TOKEN_PREFIX = "w1."
WRITE_TOKEN_FORMAT = "freshroute-write-token"  # as the REST schema names it
WRITE_TOKEN_SCHEMA: Mapping[str, Any] = {"type": "string", "format": WRITE_TOKEN_FORMAT,
                                         "maxLength": MAX_TOKEN_LENGTH}
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


@dataclass(frozen=True)
class ReadAfter:
    """A write token narrowed to one table: the events of its input topic it names, and how a replica shows it
    reflects them — its key's row reflects them (the row's input position, written by a Real-time query, is at
    or past each: :func:`freshroute.input_position.reflects`), or the replica has applied the changelog up to
    where a mark (:class:`freshroute.metadata.progress.InputMark`) says the input was processed past them
    (``reflected``: read from the latest routing metadata at each attempt, since the mark that speaks for a fresh
    write is mostly published while the read waits; empty while none is)."""

    topic: str
    offsets: Mapping[int, int]  # input partition → offset of the latest event written there
    # Changelog partition → applied offset from which every event named is in.
    reflected: Callable[[], Mapping[int, int]] = field(default=dict, compare=False, repr=False)
    # Why the pipeline rejected one of the named events, if it did (read from the latest routing metadata).
    rejection: Callable[[], str | None] = field(default=lambda: None, compare=False, repr=False)

    def after_offset(self, partition: int) -> int:
        """The applied offset of ``partition`` from which the replica reflects every event named (0: unknown)."""
        return self.reflected().get(partition, 0)

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "offsets": {str(p): o for p, o in self.offsets.items()}}

"""How a table's keys and values are written in its topic, and how callers name its keys.

Tables the pipeline writes have ``string`` keys and ``json`` values. A compacted topic served as it is
(``freshroute table add``) may have:

- keys ``string`` (UTF-8 text), ``json`` (a JSON document: callers give its JSON text, e.g. ``42`` or
  ``{"id":7}``, and the key is its compact encoding, as Jackson and most JSON serializers write it) or ``bytes``
  (callers give them base64url-encoded, padding optional, and read them so);
- values ``json`` (served as JSON), ``string`` (UTF-8 text, served as a JSON string) or ``bytes`` (served
  base64-encoded as ``value_b64`` on REST, as bytes on gRPC and in the client; each answer's renderer does it).

A record whose key or value is not of the table's format is skipped by the store nodes, counted and reported
at its offset (its key keeps its last valid value), as a pipeline's changelog record would be.
"""

from __future__ import annotations

import base64
import binascii
from functools import cache, lru_cache
from typing import Any

import orjson

from freshroute.errors import InvalidArgument
from freshroute.keys import key_bytes, not_text, partition_for

KEY_FORMATS = ("string", "json", "bytes")
VALUE_FORMATS = ("json", "string", "bytes")


def key_to_bytes(fmt: str, key: str, field: str = "key") -> bytes:
    """A caller's key as the topic holds it (its partition is Kafka's default partitioner's over these bytes)."""
    if fmt == "string":
        return key_bytes(key, field)
    if not isinstance(key, str):
        raise InvalidArgument(not_text(key, field), field=field)
    if fmt == "json":
        try:
            return orjson.dumps(orjson.loads(key))
        except orjson.JSONDecodeError:
            raise InvalidArgument(f"{field} {key[:64]!r} is not JSON text: this table's keys are JSON documents",
                                  field=field) from None
    try:
        return base64.b64decode(key + "=" * (-len(key) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(f"{field} {key[:64]!r} is not base64url: this table's keys are bytes",
                              field=field) from None


def bound_to_bytes(fmt: str, text: str, field: str) -> bytes:
    """A scan's prefix or start/end as bytes: base64url for a table of bytes keys, else the text's UTF-8 (a JSON
    table's prefix is a prefix of the keys' JSON text, not a document)."""
    if fmt == "bytes":
        return key_to_bytes(fmt, text, field)
    return key_bytes(text, field)


def key_from_bytes(fmt: str, raw: bytes) -> str:
    """A stored key as callers name it (the inverse of :func:`key_to_bytes`)."""
    if fmt == "bytes":
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    return raw.decode("utf-8", "replace")


def key_problem(fmt: str, raw: bytes) -> str | None:
    """Why a record's key cannot be one of this table's keys, or None."""
    if fmt == "string":
        return None if raw.isascii() or is_utf8(raw) else "key is not UTF-8"
    if fmt == "json":
        return None if is_json(raw) else "key is not JSON"
    return None


def value_problem(fmt: str, raw: bytes) -> str | None:
    """Why a record's value cannot be one of this table's values, or None (a store node skips such a record,
    counting and reporting it at its offset: the key keeps its last valid value)."""
    if fmt == "json":
        return None if is_json(raw) else "value is not JSON"
    if fmt == "string":
        return None if raw.isascii() or is_utf8(raw) else "value is not UTF-8 text"
    return None


def is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@cache
def _json_syntax() -> tuple[Any, type[Exception]]:
    """msgspec's decoder of a document's syntax, which builds nothing: a third of the time orjson takes to parse a
    200-byte row. Imported on first use: only store nodes and ``table add`` check values (the server install)."""
    import msgspec

    return msgspec.json.Decoder(msgspec.Raw), msgspec.DecodeError


# The deepest nesting of arrays and objects a JSON value may have: a deeper one would exhaust a recursive
# parser's stack (msgspec's near 1,000 levels, depending on the caller's). A store node's bulk restore reader
# (native/bulkload) checks the same.
MAX_JSON_DEPTH = 512


def is_json(raw: bytes) -> bool:
    """Whether ``raw`` is one JSON document in UTF-8, nested at most MAX_JSON_DEPTH deep, as orjson would accept it
    (msgspec does not check the UTF-8 inside strings, so that is checked apart)."""
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _nesting(raw) > MAX_JSON_DEPTH:
        return False
    decoder, invalid = _json_syntax()
    try:
        decoder.decode(raw)
    except invalid:
        return False
    return raw.isascii() or is_utf8(raw)


def _nesting(raw: bytes) -> int:
    """How deep the arrays and objects of a document nest (brackets inside strings aside)."""
    depth = deepest = 0
    in_string = escaped = False
    for b in raw:
        if in_string:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:  # quote
                in_string = False
        elif b == 0x22:
            in_string = True
        elif b in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif b in (0x5D, 0x7D):
            depth -= 1
    return deepest


@lru_cache(maxsize=65536)
def locate_text(key: str, partitions: int) -> tuple[bytes, int]:
    """:func:`locate` of a text key (a table of string keys, every pipeline table's)."""
    # Murmur2 in Python costs more than the rest of the key handling: hot keys are hashed once.
    raw = key_bytes(key)
    return raw, partition_for(raw, partitions)


def locate(key: str, partitions: int, key_format: str = "string") -> tuple[bytes, int]:
    """The key's bytes (as the table's topic holds them) and partition; a key that is not Unicode text, or not of the
    table's key format, is an :class:`InvalidArgument`."""
    if key_format != "string":
        raw = key_to_bytes(key_format, key)
        return raw, partition_for(raw, partitions)
    try:
        return locate_text(key, partitions)
    except TypeError:  # unhashable, so not a string
        raise InvalidArgument(not_text(key, "key"), field="key") from None

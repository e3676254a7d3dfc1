"""Key serialization and key → partition hashing, shared by every role.

The pipeline's producer, the store node and the router all import this module, so
that a key is always written to, stored under and looked up in the same partition.
The hash is Kafka's default partitioner (murmur2, positive, modulo partitions), so any
Kafka client agrees on where a key lives.
"""

from __future__ import annotations

from typing import Sequence

from freshroute.errors import InvalidArgument

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_SEED = 0x9747B28C


def serialize_key(key: str) -> bytes:
    """Table keys are strings; on the wire and on disk they are their UTF-8 bytes."""
    return key.encode("utf-8")


def key_bytes(key: str, field: str = "key") -> bytes:
    """A caller's key (or key bound) as tables hold it; anything but Unicode text is an :class:`InvalidArgument`."""
    try:
        return serialize_key(key)
    except (AttributeError, UnicodeEncodeError):
        raise InvalidArgument(not_text(key, field), field=field) from None


def not_text(key: object, field: str) -> str:
    """Why ``key`` cannot be a key: not a string, or a string UTF-8 cannot hold (a lone surrogate)."""
    if isinstance(key, str):
        return f"{field} {key[:64]!r} is not valid Unicode text (it holds a lone surrogate)"
    return f"{field} must be a string, not {type(key).__name__}"


def not_a_batch(keys: Sequence[object], i: int) -> InvalidArgument:
    """The error of a batch whose ``i``-th key cannot be a key, as the REST API names it (field ``keys``)."""
    return InvalidArgument(f"keys must be a list of strings: {not_text(keys[i], f'keys[{i}]')}", field="keys")


def deserialize_key(raw: bytes) -> str:
    """Inverse of :func:`serialize_key`."""
    return raw.decode("utf-8")


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (``org.apache.kafka.common.utils.Utils.murmur2``) as a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    nblocks = length // 4
    for i in range(nblocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length & 3
    base = nblocks * 4
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, num_partitions: int) -> int:
    """Kafka's default partition for a non-null key: ``toPositive(murmur2(key)) % partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: unbounded)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def scan_range(prefix: bytes, start: bytes, end: bytes) -> tuple[bytes, bytes | None]:
    """Intersect a prefix with ``[start, end)``; an empty ``end`` is unbounded."""
    lower = max(prefix, start)
    upper = end or None
    if prefix:
        p_end = prefix_end(prefix)
        if p_end is not None and (upper is None or p_end < upper):
            upper = p_end
    return lower, upper

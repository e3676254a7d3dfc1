"""A replica store's checkpoint as its ``meta`` column family records it: the store's format, the applied offset (the
next changelog offset to apply), which incarnation of the changelog topic its rows came from, and when the replica
was last caught up. Read once when the store opens; written with the rows it covers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from freshroute.errors import StoreCorrupt

META_CF = "meta"
FORMAT = b"format"
FORMAT_VERSION = b"1"
TOPIC_ID = b"topic_id"
_APPLIED = b"applied"
_CAUGHT_UP_AT = b"caught_up_at"


@dataclass(frozen=True)
class StoredCheckpoint:
    """What a store's checkpoint says; a new store's is all zero."""

    applied_offset: int = 0
    topic_id: str | None = None
    caught_up_at_ms: int = 0


def read_checkpoint(path: Path, meta: Any, has_rows: Callable[[], bool]) -> StoredCheckpoint:
    """The checkpoint of the store at ``path`` (``meta``: its column family); a new store gets its format marker. A
    store whose rows have no checkpoint, or whose checkpoint cannot be read, is StoreCorrupt."""
    try:
        fmt = meta.get(FORMAT)
        applied = meta.get(_APPLIED)
        topic_id = meta.get(TOPIC_ID)
        caught_up = meta.get(_CAUGHT_UP_AT)
        if fmt is None:
            # A store without a format marker is either brand new or was never checkpointed: rows without a
            # checkpoint cannot be trusted.
            if applied is not None or has_rows():
                raise StoreCorrupt(f"replica store {path} has rows but no checkpoint", path=str(path))
            meta.put(FORMAT, FORMAT_VERSION)
            return StoredCheckpoint()
        if fmt != FORMAT_VERSION:
            raise StoreCorrupt(f"replica store {path} has unknown format {fmt!r}", path=str(path))
        checkpoint = StoredCheckpoint(_int(applied) if applied is not None else 0,
                                      topic_id.decode() if topic_id else None,
                                      _int(caught_up) if caught_up is not None else 0)
    except StoreCorrupt:
        raise
    except Exception as e:
        raise StoreCorrupt(f"cannot read checkpoint of {path}: {e}", path=str(path)) from None
    if checkpoint.applied_offset < 0:
        raise StoreCorrupt(f"replica store {path} has a negative checkpoint", path=str(path))
    return checkpoint


def put_checkpoint(batch: Any, family: Any, next_offset: int, caught_up_at_ms: int | None = None) -> None:
    """Add the checkpoint ``next_offset`` (and when the replica was caught up, if given) to a write ``batch``."""
    batch.put(_APPLIED, _bytes(next_offset), family)
    if caught_up_at_ms is not None:
        batch.put(_CAUGHT_UP_AT, _bytes(caught_up_at_ms), family)


def _int(raw: bytes) -> int:
    if len(raw) != 8:
        raise ValueError(f"expected 8 bytes, got {len(raw)}")
    return int.from_bytes(raw, "big", signed=True)


def _bytes(value: int) -> bytes:
    return value.to_bytes(8, "big", signed=True)

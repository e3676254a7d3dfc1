"""Types of the store node's bulk restore reader (src/lib.rs, src/reader.rs): what store_node/bulk_restore.py calls and
its unit tests fake."""

from pathlib import Path

class ReadFailed(RuntimeError):
    """The changelog could not be read, or a table file not written."""

class Chunk:
    """A partition's changes from where its previous chunk ended to ``next_offset``, as one table file."""

    partition: int
    next_offset: int  # the offset after the last record read (skipped ones included)
    end_offset: int  # the partition's high watermark as its latest fetch response gave it (-1: not known yet)
    end_seen_ms: int  # when the reader saw the partition's end, in its last chunk (-1 in the others)
    records: int  # records read, skipped ones included
    skipped: int  # a null key, or a key or value not of the table's formats
    problems: list[tuple[int, str]]  # the first skipped records: (offset, why)
    superseded: int  # not applied: the input position does not cover the one held for the key (a replayed row)
    unpositioned: int  # applied without an input position
    rows: int  # one per key, its latest applied change (a delete included)
    file: Path | None  # the table file (None: no rows)
    positions: Path | None  # the input positions the rows leave their keys, a table file of the store's positions
    last: bool  # the partition was read to its end: no chunk of it follows

class ChangelogReader:
    """Reads ``partitions`` — (partition, first offset, directory for its table files) — of ``topic`` to their ends,
    on threads of its own."""

    def __init__(self, config: dict[str, str], topic: str, partitions: list[tuple[int, int, Path]], key_format: str,
                 value_format: str, chunk_bytes: int = ..., queued: int = ...) -> None: ...
    def next_chunk(self, timeout_s: float) -> Chunk | None:
        """The next chunk written, or None when none came within ``timeout_s``; raises ReadFailed."""
    def drop_partition(self, partition: int) -> None: ...
    def close(self) -> None: ...

def problem(key_format: str, value_format: str, key: bytes | None, value: bytes | None) -> str | None:
    """Why a record is skipped under the formats, or None: the reader's checks."""

"""Which windows a windowed table has written, by when they expire: the pipeline tombstones them then.

Spark forgets a window once the watermark passes its end, but its changelog record stays until
someone deletes it. The sink notes each window it writes under (expiry time, partition, changelog
key) in a small RocksDB beside the table's checkpoint; when the watermark passes an expiry the
window's tombstone is written, so store nodes drop it, restores never bring it back, and compaction
can remove it from the topic. Entries are written only after their records were acknowledged and
removed only after their tombstones were: a crash in between repeats a write, never skips one.
"""

from __future__ import annotations

import struct
import threading
from pathlib import Path
from typing import Iterable

from rocksdict import Options, Rdict, WriteBatch

_HEAD = struct.Struct(">qH")  # expiry ms, partition; then the changelog key


class WindowExpiry:
    """(expiry ms, partition, changelog key) of every window written and not yet tombstoned."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self._db: Rdict | None = Rdict(str(path), opts)
        self._lock = threading.Lock()

    def note(self, windows: Iterable[tuple[int, int, bytes]]) -> None:
        """Remember windows as (expires at ms, partition, changelog key); noting one twice is harmless."""
        batch = WriteBatch(raw_mode=True)
        for expires, partition, key in windows:
            batch.put(_HEAD.pack(expires, partition) + key, b"")
        with self._lock:
            if self._db is not None:
                self._db.write(batch)

    def due(self, watermark_ms: int, limit: int = 100_000) -> list[tuple[bytes, int, bytes]]:
        """Up to ``limit`` windows expired at ``watermark_ms``: (entry, partition, changelog key), oldest first."""
        out = []
        with self._lock:
            if self._db is None:
                return out
            it = self._db.iter()
            it.seek_to_first()
            while it.valid() and len(out) < limit:
                entry = it.key()
                expires, partition = _HEAD.unpack_from(entry)
                if expires > watermark_ms:
                    break
                out.append((entry, partition, entry[_HEAD.size:]))
                it.next()
            del it
        return out

    def forget(self, entries: Iterable[bytes]) -> None:
        batch = WriteBatch(raw_mode=True)
        for entry in entries:
            batch.delete(entry)
        with self._lock:
            if self._db is not None:
                self._db.write(batch)

    def close(self) -> None:
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            db.close()

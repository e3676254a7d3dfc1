"""One table-partition's local RocksDB: a cache of its changelog that can always be rebuilt.

Rows live in the default column family (raw key bytes → value bytes, ordered bytewise for
scans); the replica's checkpoint lives in the ``meta`` column family, and the input position of each key's row
(:mod:`freshroute.input_position`, written by the Real-time pipeline) in ``input_positions``. A versioned table's
history lives in two more (:mod:`store_node.history`). The applied offset (next
changelog offset to apply) is written with the last of the rows it covers, so a crash can never
leave the rows behind the checkpoint (ahead of it, a replay from it rewrites them).

A replica restoring into an empty store loads in bulk (:attr:`ReplicaStore.bulk_load`) until it has caught up,
then is reopened for reads (:meth:`ReplicaStore.reopened`); most of its rows come as table files it ingests
whole (:meth:`ReplicaStore.ingest`).

rocksdict keeps a database open while any handle derived from it lives, so this class owns
every handle and iterators never outlive one call.
"""

from __future__ import annotations

import shutil
import time
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable

from rocksdict import (BlockBasedOptions, Cache, DBCompressionType, IngestExternalFileOptions, MemtableFactory, Options,
                       Rdict, ReadOptions, WriteBatch, WriteBufferManager, WriteOptions)

from freshroute.errors import FatalError, StoreCorrupt
from store_node.history import EXPIRY_CF, VERSIONS_CF, History, Write
from store_node.store_checkpoint import FORMAT, FORMAT_VERSION, META_CF, TOPIC_ID, put_checkpoint, read_checkpoint

POSITIONS_CF = "input_positions"
_FLUSH_AT_ONCE_BYTES = 1 << 20
WRITE_CHUNK_ROWS = 2_000
_STALL_WAIT_S = 0.005
_STALL_MAX_S = 120.0
# Table files a bulk restore writes into the store's directory for it to ingest (store_node/bulk_restore.py).
TABLE_FILES = "load-*.sst"


class StoreBusy(FatalError):
    """The replica's database is already open (a bug, or a second process): never wipe it for that."""

    code = "STORE_BUSY"


class DiskFull(StoreCorrupt):
    """The replica's store cannot be written for want of disk space: wiping and restoring it would fail the same way."""

    code = "DISK_FULL"


def _write_failure(path: Path, doing: str, e: Exception) -> StoreCorrupt:
    """RocksDB's status (rocksdict raises a bare Exception with its text) as the store's error."""
    text = str(e)
    if "No space left" in text or "NoSpace" in text:
        return DiskFull(f"no space left on the device of {path} (while {doing})", path=str(path))
    return StoreCorrupt(f"cannot {doing} replica store {path}: {text}", path=str(path))


class StoreMemory:
    """The RocksDB memory of one store node, shared by all its replicas: one block cache, and the memtables
    charged to it, so that however many replicas and keys a node hosts its RocksDB memory stays within
    ``cache_mb`` (the rest of the process — Python, the Kafka consumer — comes on top)."""

    def __init__(self, cache_mb: int) -> None:
        self.cache_mb = cache_mb
        self.cache = Cache(cache_mb << 20)
        # Memtables may take up to half of it; past that the largest is flushed rather than writers stalled.
        self.write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(cache_mb << 19, False, self.cache)


DEFAULT_CACHE_MB = 256
_default_memory: StoreMemory | None = None


def default_memory() -> StoreMemory:
    """The process's storage memory when none is given (tools and tests); a store node passes its own."""
    global _default_memory
    if _default_memory is None:
        _default_memory = StoreMemory(DEFAULT_CACHE_MB)
    return _default_memory


# The table options the bulk restore reader writes its table files with too (native/bulkload/src/table_file.rs; a unit
# test holds the two to each other).
BLOOM_BITS_PER_KEY = 10
COMPRESSION = "lz4"


def _options(memory: StoreMemory, bulk_load: bool) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    # One writer per store (its tailer), so concurrent memtable writes are not needed.
    opts.set_allow_concurrent_memtable_write(False)
    if bulk_load:
        # A restore into an empty store writes each key about once, in the changelog's (random) key order: appended
        # to a vector and sorted once when flushed, where a skiplist insert walks a memtable of 64 MB that misses the
        # CPU cache at every step (0.4 µs a 200-byte row instead of 2.9). A vector cannot serve reads (a get sorts a
        # copy of it), so a store loading in bulk is not read until it is reopened.
        opts.set_memtable_factory(MemtableFactory.vector())
        # Nor is it compacted meanwhile: its files are merged once, in the background, after it is reopened
        # (a close waits for a running compaction).
        opts.set_disable_auto_compactions(True)
        opts.set_level_zero_slowdown_writes_trigger(1 << 30)
        opts.set_level_zero_stop_writes_trigger(1 << 30)
        opts.set_soft_pending_compaction_bytes_limit(0)
        opts.set_hard_pending_compaction_bytes_limit(0)
    else:
        # A changelog rewrites the same keys over and over: updated in place, the memtable holds one entry per key
        # rather than every version since the last flush, and a read's skiplist seek stays short and cache-warm.
        opts.set_inplace_update_support(True)
    # Point lookups: a whole-key bloom filter (10 bits a key, ~1 % false positives) lets a get skip every file
    # that cannot hold its key. Index and filter blocks stay with their open files, outside the cache (about
    # 2 bytes a key: 20 MB for 10 million), so a read never waits on the cache for them. Data blocks are
    # LZ4-compressed: cheap to decompress on a read that misses the cache, and to compact.
    table = BlockBasedOptions()
    table.set_block_cache(memory.cache)
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    opts.set_block_based_table_factory(table)
    opts.set_compression_type(getattr(DBCompressionType, COMPRESSION)())
    opts.set_write_buffer_manager(memory.write_buffers)
    # Rows and checkpoint are written together (two column families); flushed together, a write-ahead log is
    # released as soon as the rows' memtable is flushed, instead of living until the checkpoint's tiny one is.
    opts.set_atomic_flush(True)
    return opts


def _history_options(memory: StoreMemory) -> Options:
    """A versioned table's history: read by seeks within a key's run of versions, cached and compressed as rows are."""
    opts = Options(raw_mode=True)
    table = BlockBasedOptions()
    table.set_block_cache(memory.cache)
    opts.set_block_based_table_factory(table)
    opts.set_compression_type(getattr(DBCompressionType, COMPRESSION)())
    return opts


class ReplicaStore:
    """Rows and checkpoint of one replica; every failure to open or read is a :class:`StoreCorrupt`.

    While it loads in bulk (``bulk_load``) its writes skip RocksDB's write-ahead log: the changelog is the log.
    After a crash the store holds what its flushes wrote, the rows never behind the checkpoint (they are flushed
    first), and the replica resumes from the checkpoint.
    """

    def __init__(self, path: Path, db: Rdict, memory: StoreMemory, bulk_load: bool = False) -> None:
        self.path = path
        self.memory = memory
        self.bulk_load = bulk_load
        self._write_options = WriteOptions()
        self._write_options.disable_wal = bulk_load
        self._write_options.no_slowdown = True
        self._flush_started = False
        self._db: Rdict | None = db
        self._meta_cf = db.get_column_family_handle(META_CF)
        self._meta: Rdict | None = db.get_column_family(META_CF)
        self._positions_cf = db.get_column_family_handle(POSITIONS_CF)
        self._positions: Rdict | None = db.get_column_family(POSITIONS_CF)
        self.history = History(path, db)
        self.applied_offset = 0
        self.topic_id: str | None = None
        self.caught_up_at_ms = 0
        try:
            self._load_meta()
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, path: Path, memory: StoreMemory | None = None, bulk_load: bool = False) -> "ReplicaStore":
        """Open (or create) the replica at ``path``, its RocksDB memory within ``memory`` (the node's), for reads or
        to load in bulk; an unreadable database raises StoreCorrupt."""
        path.mkdir(parents=True, exist_ok=True)
        memory = memory or default_memory()
        cls.drop_table_files(path)
        try:
            db = Rdict(str(path), _options(memory, bulk_load),
                       column_families={META_CF: Options(raw_mode=True), POSITIONS_CF: Options(raw_mode=True),
                                        VERSIONS_CF: _history_options(memory), EXPIRY_CF: Options(raw_mode=True)})
        except Exception as e:  # rocksdict raises bare Exception for every RocksDB status
            if "lock" in str(e).lower() and "LOCK" in str(e):
                raise StoreBusy(f"replica store {path} is already open: {e}", path=str(path)) from None
            raise _write_failure(path, "open", e) from None
        return cls(path, db, memory, bulk_load)

    @classmethod
    def open_or_wipe(cls, path: Path, memory: StoreMemory | None = None) -> tuple["ReplicaStore", str | None]:
        """Open the replica, or wipe an unreadable one and start empty; returns why it was wiped. A store that starts
        empty (new or wiped) loads in bulk."""
        try:
            return cls.open(path, memory, bulk_load=not path.is_dir() or not any(path.iterdir())), None
        except DiskFull:
            raise
        except StoreCorrupt as e:
            cls.destroy(path)
            return cls.open(path, memory, bulk_load=True), e.message

    def flush_loaded(self) -> bool:
        """Whether what a bulk load wrote is on disk. The first call starts writing it: at once if it is small, else in
        the background, and the tailer applies other replicas' records meanwhile (a close would write it all on the
        tailer's thread)."""
        db = self._db
        if db is None:
            raise StoreCorrupt(f"replica store {self.path} is closed", path=str(self.path))
        try:
            if not self._flush_started:
                self._flush_started = True
                small = db.property_int_value("rocksdb.cur-size-active-mem-table") < _FLUSH_AT_ONCE_BYTES
                db.flush(wait=small)
            if db.property_int_value("rocksdb.background-errors"):
                # A failed flush stops the database's writes; the next one says why.
                self._meta.put(FORMAT, FORMAT_VERSION)
            return db.property_int_value("rocksdb.num-immutable-mem-table") == 0
        except Exception as e:
            raise _write_failure(self.path, "flush", e) from None

    def reopened(self) -> "ReplicaStore":
        """This store closed and opened again for reads; a store not loading in bulk is returned as it is."""
        if not self.bulk_load:
            return self
        self.close()
        return self.open(self.path, self.memory)

    @staticmethod
    def drop_table_files(path: Path) -> None:
        """Delete table files a bulk restore wrote and the store never ingested (a crash, a stopped restore)."""
        for stray in path.glob(TABLE_FILES):
            stray.unlink(missing_ok=True)

    @staticmethod
    def destroy(path: Path) -> None:
        """Delete a (closed) replica's files; the changelog can rebuild it."""
        shutil.rmtree(path, ignore_errors=True)

    def _load_meta(self) -> None:
        assert self._meta is not None and self._db is not None
        db = self._db

        def has_rows() -> bool:
            it = db.iter()
            it.seek_to_first()
            found = it.valid()
            del it
            return found

        checkpoint = read_checkpoint(self.path, self._meta, has_rows)
        self.applied_offset, self.topic_id = checkpoint.applied_offset, checkpoint.topic_id
        self.caught_up_at_ms = checkpoint.caught_up_at_ms

    @property
    def closed(self) -> bool:
        return self._db is None

    def apply(self, changes: Iterable[tuple[bytes, bytes | None]], next_offset: int,
              caught_up_at_ms: int | None = None, positions: Iterable[tuple[bytes, bytes | None]] = (),
              history_rows: list[Write] = ()) -> None:
        """Upsert/delete rows (None = tombstone) and move the checkpoint to ``next_offset``; ``positions`` (the rows'
        input positions, None: none) and ``history_rows`` (:mod:`store_node.history`) go with the checkpoint.

        The rows go in WriteBatches of at most WRITE_CHUNK_ROWS, the checkpoint with the last: RocksDB's write keeps
        the interpreter (rocksdict holds the GIL through it), so one big write would hold up every read of the node
        (74 ms for 50,000 rows). A crash between two leaves rows ahead of the checkpoint, never behind it, and the
        replay from the checkpoint rewrites them to the same values.
        """
        rows = iter(changes)
        while True:
            chunk = list(islice(rows, WRITE_CHUNK_ROWS))
            if len(chunk) == WRITE_CHUNK_ROWS:
                self._write(chunk)
                continue
            self._write(chunk, next_offset, caught_up_at_ms, positions, history_rows)
            break
        self.applied_offset = next_offset
        if caught_up_at_ms is not None:
            self.caught_up_at_ms = caught_up_at_ms

    def ingest(self, table_file: Path | None, positions_file: Path | None, next_offset: int) -> None:
        """Take in table files written for this store (their keys sorted and distinct; None: none) as they are — rows,
        and their input positions — then move the checkpoint to ``next_offset``. The files are moved into the store,
        never copied; their rows are newer than every row before them, as a write of them would be."""
        db = self._db
        if db is None or self._positions is None:
            raise StoreCorrupt(f"replica store {self.path} is closed", path=str(self.path))
        for family, file in ((db, table_file), (self._positions, positions_file)):
            if file is None:
                continue
            options = IngestExternalFileOptions()
            options.set_move_files(True)
            try:
                family.ingest_external_file([str(file)], options)
            except Exception as e:
                raise _write_failure(self.path, "ingest a table file", e) from None
            finally:
                file.unlink(missing_ok=True)
        self._write([], next_offset)
        self.applied_offset = next_offset

    @staticmethod
    def batch(changes: Iterable[tuple[bytes, bytes | None]] = ()) -> WriteBatch:
        """A batch of row upserts and deletes (None = tombstone)."""
        batch = WriteBatch(raw_mode=True)
        for key, value in changes:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        return batch

    def _write(self, rows: list[tuple[bytes, bytes | None]], next_offset: int | None = None,
               caught_up_at_ms: int | None = None, positions: Iterable[tuple[bytes, bytes | None]] = (),
               history_rows: list[Write] = ()) -> None:
        """Write ``rows`` (and ``history_rows``), and the checkpoint with them if given.

        A write that would stall (its memtables full while a flush runs) is refused by RocksDB and tried again here
        every few ms: RocksDB would wait holding the interpreter, and every read of the node with it. A flush that
        failed shows as the next write's error.
        """
        db = self._db
        if db is None:
            raise StoreCorrupt(f"replica store {self.path} is closed", path=str(self.path))
        stalled = 0
        positions = list(positions)
        while True:
            batch = self.batch(rows)  # built again for each try: a write takes its batch
            for key, position in positions:
                if position is None:
                    batch.delete(key, self._positions_cf)
                else:
                    batch.put(key, position, self._positions_cf)
            for family, key, value in history_rows:
                batch.delete(key, family) if value is None else batch.put(key, value, family)
            if next_offset is not None:
                put_checkpoint(batch, self._meta_cf, next_offset, caught_up_at_ms)
            try:
                db.write(batch, self._write_options)
                return
            except Exception as e:
                if "Write stall" not in str(e):
                    raise _write_failure(self.path, "write", e) from None
            stalled += 1
            if stalled * _STALL_WAIT_S >= _STALL_MAX_S:
                raise StoreCorrupt(f"writes to replica store {self.path} stalled for {_STALL_MAX_S:.0f} s",
                                   path=str(self.path))
            time.sleep(_STALL_WAIT_S)

    def set_topic_id(self, topic_id: str) -> None:
        """Remember which incarnation of the changelog topic these rows came from."""
        assert self._meta is not None
        self._meta.put(TOPIC_ID, topic_id.encode())
        self.topic_id = topic_id

    def get(self, key: bytes) -> bytes | None:
        return self._read(key)

    def positions_of(self, keys: list[bytes]) -> list[bytes | None]:
        """The input positions of the rows of ``keys`` (None: none recorded)."""
        return self._read(keys, self._positions)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in order (None: no such key), in one call into RocksDB."""
        return self._read(keys)

    def _read(self, keys: bytes | list[bytes], family: Rdict | None = None) -> Any:
        """RocksDB's get of one key or a list of them, of the rows or of ``family``; a closed or failing store is
        StoreCorrupt."""
        db = self._db if family is None or self._db is None else family
        if db is None:
            raise StoreCorrupt(f"replica store {self.path} is closed", path=str(self.path))
        try:
            return db.get(keys)
        except Exception as e:
            raise StoreCorrupt(f"cannot read replica store {self.path}: {e}", path=str(self.path)) from None

    def scan(self, lower: bytes, upper: bytes | None, limit: int,
             keep: Callable[[bytes], bool] | None = None) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` rows with ``lower <= key < upper`` in key order (only keys ``keep`` accepts, if given)."""
        db = self._db
        if db is None:
            raise StoreCorrupt(f"replica store {self.path} is closed", path=str(self.path))
        read_opts = ReadOptions()
        if upper is not None:
            read_opts.set_iterate_upper_bound(upper)
        out: list[tuple[bytes, bytes]] = []
        try:
            it = db.iter(read_opts)
            it.seek(lower)
            while len(out) < limit and it.valid():
                key = it.key()
                if keep is None or keep(key):
                    out.append((key, it.value()))
                it.next()
            del it
        except Exception as e:
            raise StoreCorrupt(f"cannot scan replica store {self.path}: {e}", path=str(self.path)) from None
        return out

    def flush(self) -> None:
        if self._db is not None:
            self._db.flush_wal(True)

    def close(self) -> None:
        """Close the database (what was written without the log is flushed first); drops every handle first so that
        RocksDB releases its lock."""
        db, self._db = self._db, None
        if db is None:
            return  # closed already: its handles went with it
        try:
            if self.bulk_load:
                # Rows before the checkpoint (dropping the meta handle flushes the checkpoint): a kill between the
                # two leaves rows ahead of it, which a replay from it rewrites to the same values, never behind.
                db.flush(wait=True)
            db.flush_wal(True)
        except Exception:
            pass  # a store that cannot flush is about to be wiped or was cleanly written already
        self._meta = self._positions = None
        self._meta_cf = self._positions_cf = None  # type: ignore[assignment]
        self.history.close()
        try:
            db.close()
        except Exception:
            pass  # its last writes could not be flushed (a full disk): the checkpoint on disk is still before them

"""A hosted replica: its store, its lag, its role and state, and what it has done.

The changelog tailer's thread owns a replica's lifecycle (open, apply, wipe, close); reads on
the event loop only take a reference to the current store and check the bound first. The
tailer publishes the applied offset after the WriteBatch commits, so a read never reports a
position ahead of the data it returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable
from urllib.parse import quote


from freshroute.errors import StoreCorrupt
from freshroute.formats import value_problem
from freshroute.metadata import ReplicaReport, ReplicaState, Role, TableSpec
from store_node.lag import Clock, LagSnapshot, LagTracker
from store_node.replica_store import DiskFull, ReplicaStore, StoreMemory

def replica_path(root: Path, table: str, partition: int) -> Path:
    """``root/{table}/{partition}``; a table name that is not a safe file name is percent-encoded."""
    safe = quote(table, safe="-_.")
    if safe in (".", ".."):
        safe = safe.replace(".", "%2E")
    return root / safe / str(partition)


def _all_valid(values: Iterable[bytes | None], value_format: str) -> bool:
    """Whether every value (tombstones aside) is of the table's format."""
    return all(value is None or value_problem(value_format, value) is None for value in values)


@dataclass
class ReplicaCounters:
    """What a replica did since this process opened it."""

    records_applied: int = 0
    records_skipped: int = 0  # poison records: null key, non-UTF-8 key, non-JSON value
    restores: int = 0  # wipes followed by a restore from the changelog's start
    resumed_from: int = 0  # the applied offset read from disk when the replica was opened


@dataclass(slots=True)
class Staged:
    """A restoring replica's changes read and not yet written: the latest of each key (None = delete).

    A changelog's uncompacted tail holds every recent update of a key, so a restore that
    writes only the last change per key writes a fraction of the records it reads; the
    rows and the offset after them still go to the store in one write. For the same
    reason their values are checked once, when written, rather than as each record is read.
    """

    rows: dict[bytes, bytes | None] = field(default_factory=dict)
    next_offset: int = 0
    records: int = 0
    skipped: int = 0
    since: float = field(default_factory=time.monotonic)
    poison: bool = False  # a record read unchecked had a bad key: the window is read again, checked


class Replica:
    """One table-partition hosted by this node."""

    def __init__(self, spec: TableSpec, partition: int, role: Role, store: ReplicaStore | None, clock: Clock,
                 evidence_window_ms: int, caught_up_threshold: int, failure: str | None = None) -> None:
        """A replica over its opened ``store``; or, with no store and a ``failure``, one whose store could not be
        opened (FAILED)."""
        self.spec = spec
        self.table = spec.name
        self.topic = spec.topic
        self.partition = partition
        self.key = (spec.name, partition)
        self.role = role
        self.store: ReplicaStore | None = store
        applied = store.applied_offset if store is not None else 0
        self.lag = LagTracker(applied, store.caught_up_at_ms if store is not None else 0, clock, evidence_window_ms)
        self.restoring = True  # until the first time it catches up
        self.epoch = 0  # bumped by every wipe, so a multi-chunk scan can notice it
        self.corrupt_reason: str | None = None  # set by a failed read; the tailer then wipes
        # Set when its store cannot be written (the disk is full): the tailer drops its files, and it is FAILED, never
        # read, until it tries again (failed_at: time.monotonic()).
        self.failure = failure
        self.failed_at = time.monotonic()
        self.counters = ReplicaCounters(resumed_from=applied)
        self._clock = clock
        self._threshold = caught_up_threshold
        self.restore_started = time.monotonic()
        self.restore_from = applied
        self.staged: Staged | None = None  # only while restoring; the tailer writes it out
        # A staged window that held poison is dropped and read again from the checkpoint, each
        # record checked as it is read up to check_until; reread asks the tailer to fetch it.
        self.check_until = 0
        self.reread = False

    @property
    def state(self) -> ReplicaState:
        if self.failure is not None:
            return ReplicaState.FAILED
        if self.restoring:
            return ReplicaState.RESTORING
        return ReplicaState.ACTIVE if self.role is Role.ACTIVE else ReplicaState.STANDBY

    def snapshot(self, now_ms: int | None = None) -> LagSnapshot:
        return self.lag.snapshot(now_ms)

    def report(self, now_ms: int) -> ReplicaReport:
        lag = self.lag.snapshot(now_ms)
        end = None if lag.end is None else max(lag.end, lag.applied)
        return ReplicaReport(self.table, self.partition, self.role, self.state, lag.applied, end, lag.staleness_ms,
                             self.failure)

    def check_restored(self, now_ms: int) -> bool:
        """Leave RESTORING once within the threshold of a fresh end offset; True on that transition.

        A store that loaded in bulk is reopened for reads then, once what it loaded is on disk (a failure marks the
        replica failed or corrupt).
        """
        if not (self.restoring and self.lag.within(self._threshold, now_ms)):
            return False
        store = self.store
        if store is not None and store.bulk_load:
            try:
                if not store.flush_loaded():
                    return False
                self.store = None  # readers meanwhile hear "being rebuilt", as during a wipe
                self.store = store.reopened()
            except DiskFull as e:
                self.mark_failed(e.message)
                return False
            except StoreCorrupt as e:
                self.mark_corrupt(e.message)
                return False
        self.restoring = False
        return True

    def mark_corrupt(self, reason: str) -> None:
        if self.corrupt_reason is None:
            self.corrupt_reason = reason

    def mark_failed(self, reason: str) -> None:
        """Its store cannot be written: FAILED from now on, and the tailer drops its files (see
        ReplicaSet.follow_failure)."""
        if self.failure is None:
            self.failure = reason
        self.failed_at = time.monotonic()  # its next try counts from the latest failure

    # --- lifecycle, called only from the tailer's thread -----------------------------------------

    def apply(self, changes: list[tuple[bytes, bytes | None]], next_offset: int, skipped: int) -> None:
        self._open_store()  # a replica without one fails here, before its staged changes take these
        staged = self.staged
        if staged is not None:
            # The checkpoint never moves past changes still staged: they go in the same write.
            staged.rows.update(changes)
            staged.next_offset = next_offset
            staged.records += len(changes)
            staged.skipped += skipped
            self.write_staged()
            return
        self.commit(changes, next_offset, len(changes), skipped)

    def commit(self, rows: Iterable[tuple[bytes, bytes | None]], next_offset: int, applied: int, skipped: int) -> None:
        """Write ``rows`` (standing for ``applied`` records) with the checkpoint ``next_offset``, then publish the
        position."""
        store = self._open_store()
        caught_up_at = self.lag.caught_up_at_after(next_offset)
        try:
            store.apply(rows, next_offset, caught_up_at or None)
        except DiskFull as e:
            self.mark_failed(e.message)
            return
        self._publish(next_offset, applied, skipped)

    def load(self, table_file: Path | None, next_offset: int, applied: int, skipped: int) -> None:
        """Ingest a bulk restore's table file (standing for ``applied`` records; None: no rows) with the checkpoint
        ``next_offset``, then publish the position."""
        store = self._open_store()
        try:
            store.ingest(table_file, next_offset)
        except DiskFull as e:
            self.mark_failed(e.message)
            return
        except StoreCorrupt as e:
            self.mark_corrupt(e.message)
            return
        self._publish(next_offset, applied, skipped)

    def _open_store(self) -> ReplicaStore:
        store = self.store
        if store is None:
            raise StoreCorrupt(f"replica {self.table}/{self.partition} has no open store")
        return store

    def _publish(self, next_offset: int, applied: int, skipped: int) -> None:
        """The position and counters after rows are in the store, never before: a read never reports more."""
        self.lag.advance(next_offset)
        self.counters.records_applied += applied
        self.counters.records_skipped += skipped

    def write_staged(self) -> int:
        """Write the staged changes with their checkpoint; returns how many records they stand for.

        A window holding poison (a value not of the table's format, or a record whose bad key was not
        reported) is dropped whole instead, and 0 returned: the checkpoint stays before it, as
        after a crash, and the window is read again checking each record, so that the poison is
        reported at its offset and each key keeps its latest valid change, even an older one.
        """
        staged, self.staged = self.staged, None
        if staged is None or self.store is None:
            return 0
        if staged.poison or not _all_valid(staged.rows.values(), self.spec.value_format):
            self.check_until = staged.next_offset
            self.reread = True
            return 0
        self.commit(staged.rows.items(), staged.next_offset, staged.records, staged.skipped)
        return staged.records

    def close(self) -> None:
        # Staged changes are dropped, never half-written: the checkpoint on disk still precedes them.
        self.staged = None
        store, self.store = self.store, None
        if store is not None:
            store.close()

    def wipe(self, root: Path, memory: StoreMemory | None = None) -> None:
        """Delete the local copy and start over from an empty store (restore from offset 0)."""
        path = replica_path(root, self.table, self.partition)
        self.close()
        self.lag.reset()
        ReplicaStore.destroy(path)  # close() dropped the staged changes
        store = ReplicaStore.open(path, memory, bulk_load=True)  # a fresh directory cannot be corrupt; if it is, the caller retries
        self.restoring = True
        self.check_until = 0
        self.reread = False
        self.corrupt_reason = None
        self.failure = None
        self.counters.restores += 1
        self.restore_started = time.monotonic()
        self.restore_from = 0
        self.epoch += 1
        self.store = store

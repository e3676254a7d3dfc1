"""A hosted replica: its store, its lag, its role and state, and what it has done.

The changelog tailer's thread owns a replica's lifecycle (open, apply, wipe, close); reads on
the event loop only take a reference to the current store and check the bound first. The
tailer publishes the applied offset after the WriteBatch commits, so a read never reports a
position ahead of the data it returns.

**Lag** (:class:`LagTracker`): how far behind its changelog a replica is: in offsets, and in time.

Offset lag is ``end − applied`` where the end offset is the high watermark of the Fetch
responses the tailer reads anyway (no request of its own); without a broker response within
the evidence window it is unknown: a replica cut off from its broker cannot know how far
behind it is. Time staleness is how long ago the replica last held every record the broker
had: 0 while caught up, otherwise ``now − caught_up_at``. "Caught up" needs fresh evidence
from the broker — an end offset the broker reported recently — so staleness keeps growing
while the broker is unreachable instead of freezing at an optimistic value.

Each end offset the broker reports is remembered with a time no later than the broker sent
it (by its request, not its arrival: a response the network held back is old news); when the
applied offset passes it, the replica is known to have been complete as of that time. This
keeps staleness honest under a steady write load, where ``applied == end`` at one instant
may never be observed even though the replica trails by only milliseconds.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import quote

from freshroute.errors import StoreCorrupt
from freshroute.formats import value_problem
from freshroute.lag import lag_offsets, ReplicaLag
from freshroute.metadata.reports import ReplicaReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.tables import TableSpec
from store_node.history import Write
from store_node.replica_store import DiskFull, ReplicaStore, StoreMemory

Clock = Callable[[], int]  # milliseconds since the epoch
EXPIRE_AT_ONCE = 2_000  # versions deleted in one write: a write holds the interpreter, and every read with it


@dataclass(frozen=True, slots=True)
class LagSnapshot:
    """Applied and end offsets (end None: not reported yet), offset lag and staleness at one instant."""

    applied: int
    end: int | None
    staleness_ms: int
    caught_up: bool

    @property
    def lag_offsets(self) -> int | None:
        return lag_offsets(self.applied, self.end)

    def to_replica_lag(self) -> ReplicaLag:
        return ReplicaLag(self.applied, self.end, self.staleness_ms)


class LagTracker:
    """Applied offset against the broker's end offset, and the last time the replica was complete."""

    def __init__(self, applied: int, caught_up_at_ms: int, clock: Clock, evidence_window_ms: int,
                 max_pending: int = 64) -> None:
        self.applied = applied
        self.end: int | None = None
        # 0 means "never known to be complete": staleness is then the whole epoch, i.e. unbounded.
        self.caught_up_at_ms = caught_up_at_ms
        self.evidence_at_ms: int | None = None
        self._clock = clock
        self._window = evidence_window_ms
        self._pending: deque[list[int]] = deque()  # [end, seen_at_ms], end strictly increasing
        self._max_pending = max_pending

    def observe_end(self, end: int, seen_at_ms: int) -> None:
        """The broker reported ``end`` as the partition's end offset in a response at ``seen_at_ms``."""
        if self.end is not None and end < self.end:
            self._pending.clear()  # the partition shrank (recreated topic): older observations are void
        self.end = end
        if self.evidence_at_ms is None or seen_at_ms > self.evidence_at_ms:
            self.evidence_at_ms = seen_at_ms
        if self.applied >= end:
            self._complete_as_of(seen_at_ms)
            self._pending.clear()
            return
        if self._pending and self._pending[-1][0] == end:
            # Same end seen again later: once applied reaches it, the replica is complete as of
            # the later sighting.
            self._pending[-1][1] = max(self._pending[-1][1], seen_at_ms)
            return
        self._pending.append([end, seen_at_ms])
        if len(self._pending) > self._max_pending:
            self._pending.popleft()  # forgetting an old sighting only makes staleness more conservative

    def advance(self, applied: int) -> None:
        """The replica has applied everything below ``applied``."""
        self.applied = applied
        pending = self._pending
        while pending and pending[0][0] <= applied:
            self._complete_as_of(pending.popleft()[1])

    def caught_up_at_after(self, applied: int) -> int:
        """The caught-up time :meth:`advance` would record for ``applied`` (persisted with the batch)."""
        at = self.caught_up_at_ms
        for end, seen_at in self._pending:
            if end > applied:
                break
            at = max(at, seen_at)
        return at

    def _complete_as_of(self, at_ms: int) -> None:
        if at_ms > self.caught_up_at_ms:
            self.caught_up_at_ms = at_ms

    def reset(self) -> None:
        """Forget everything: the replica was wiped and restores from the start."""
        self.applied = 0
        self.end = None
        self.caught_up_at_ms = 0
        self.evidence_at_ms = None
        self._pending.clear()

    def evidence_fresh(self, now_ms: int) -> bool:
        return self.evidence_at_ms is not None and now_ms - self.evidence_at_ms <= self._window

    def within(self, threshold: int, now_ms: int | None = None) -> bool:
        """Within ``threshold`` offsets of an end offset the broker reported recently."""
        now = self._clock() if now_ms is None else now_ms
        return self.end is not None and self.end - self.applied <= threshold and self.evidence_fresh(now)

    def staleness_ms(self, now_ms: int | None = None) -> int:
        return self.figures(self._clock() if now_ms is None else now_ms)[2]

    def figures(self, now_ms: int) -> tuple[int, int | None, int]:
        """(applied, end, staleness_ms) at ``now_ms``: a snapshot's numbers without building one (a read's path)."""
        applied, end = self.applied, self.end
        if not self.evidence_fresh(now_ms):
            # With no broker response this recent the end is a memory, not a measurement: the offset lag is unknown.
            return applied, None, max(0, now_ms - self.caught_up_at_ms)
        if end is not None and end <= applied:
            return applied, end, 0
        return applied, end, max(0, now_ms - self.caught_up_at_ms)

    def snapshot(self, now_ms: int | None = None) -> LagSnapshot:
        now = self._clock() if now_ms is None else now_ms
        applied, end, staleness = self.figures(now)
        return LagSnapshot(applied, end, staleness, self.within(0, now))


# ---- the replica --------------------------------------------------------------------------------------


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
    records_superseded: int = 0  # rows a replayed Real-time query wrote again, older than the row held for their key
    records_unpositioned: int = 0  # records without an input position (a micro-batch pipeline's, or by hand)
    restores: int = 0  # wipes followed by a restore from the changelog's start
    resumed_from: int = 0  # the applied offset read from disk when the replica was opened
    versions_expired: int = 0  # a versioned table's versions deleted for their age


@dataclass(slots=True)
class Staged:
    """A restoring replica's changes read and not yet written: the latest of each key (None = delete).

    A changelog's uncompacted tail holds every recent update of a key, so a restore that
    writes only the last change per key writes a fraction of the records it reads; the
    rows and the offset after them still go to the store in one write. For the same
    reason their values are checked once, when written, rather than as each record is read.
    """

    rows: dict[bytes, bytes | None] = field(default_factory=dict)
    positions: dict[bytes, bytes | None] = field(default_factory=dict)  # the input position of each row, if any
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
        self.writes = 0  # commits begun and ended: odd while one writes rows before publishing their position
        self._clock = clock
        self._threshold = caught_up_threshold
        self.restore_started = time.monotonic()
        self.restore_from = applied
        self.staged: Staged | None = None  # only while restoring; the tailer writes it out
        # A staged window that held poison is dropped and read again from the checkpoint, each
        # record checked as it is read up to check_until; reread asks the tailer to fetch it.
        self.check_until = 0
        self.reread = False
        self._expire_at_ms = 0

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
        ReplicaResets.follow_failure)."""
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

    def commit(self, rows: Iterable[tuple[bytes, bytes | None]], next_offset: int, applied: int, skipped: int,
               positions: Iterable[tuple[bytes, bytes | None]] = (), history_rows: list[Write] = ()) -> None:
        """Write ``rows`` (standing for ``applied`` records), their keys' input ``positions`` and a versioned table's
        ``history_rows`` with the checkpoint ``next_offset``, then publish the position."""
        store = self._open_store()
        caught_up_at = self.lag.caught_up_at_after(next_offset)
        self.writes += 1  # odd until the position is published: a read meanwhile may see rows newer than it
        try:
            store.apply(rows, next_offset, caught_up_at or None, positions, history_rows)
            self._publish(next_offset, applied, skipped)
        except DiskFull as e:
            self.mark_failed(e.message)
        finally:
            self.writes += 1

    def commit_versions(self, versions: list[tuple[bytes, int, bytes | None]], next_offset: int, applied: int,
                        skipped: int, positions: Iterable[tuple[bytes, bytes | None]] = ()) -> None:
        """A versioned table's :meth:`commit`: records' (key, time, value) into its history and latest rows."""
        rows, writes = self._open_store().history.changes(versions)
        self.commit(rows, next_offset, applied, skipped, positions, writes)

    def expire_history(self, now_ms: int) -> None:
        """Delete the versions of a versioned table that have been replaced for its history retention, a bounded
        number at a time, about once a second."""
        store = self.store
        if store is None or not self.spec.versioned or now_ms < self._expire_at_ms:
            return
        writes: list[Write] = []

        def expire() -> None:
            writes.extend(store.history.expiring(now_ms - self.spec.history_retention_ms, EXPIRE_AT_ONCE))
            if writes:
                store.apply([], store.applied_offset, history_rows=writes)

        if not self._stored(expire):
            return
        expired = len(writes) // 2  # a version and its index entry each
        self.counters.versions_expired += expired
        # A full round leaves more to expire: the next poll goes on with them.
        self._expire_at_ms = now_ms if expired == EXPIRE_AT_ONCE else now_ms + 1_000

    def load(self, table_file: Path | None, positions_file: Path | None, next_offset: int, applied: int,
             skipped: int) -> None:
        """Ingest a bulk restore's table file of rows and of their input positions (standing for ``applied`` records;
        None: none) with the checkpoint ``next_offset``, then publish the position."""
        store = self._open_store()
        if self._stored(lambda: store.ingest(table_file, positions_file, next_offset)):
            self._publish(next_offset, applied, skipped)

    def _stored(self, write: Callable[[], None]) -> bool:
        """Whether ``write`` of the store went through: a full disk fails the replica, another failure has it rebuilt."""
        try:
            write()
        except DiskFull as e:
            self.mark_failed(e.message)
            return False
        except StoreCorrupt as e:
            self.mark_corrupt(e.message)
            return False
        return True

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
        self.commit(staged.rows.items(), staged.next_offset, staged.records, staged.skipped, staged.positions.items())
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

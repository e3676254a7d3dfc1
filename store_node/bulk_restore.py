"""Restoring empty replicas in bulk: their changelogs read to the end by the native reader, as table files.

A replica whose store starts empty (new, or wiped) has its whole changelog to apply. Applied record by
record, a Python consumer spends most of a restore creating and calling into a message object per record
and writing each row into a memtable. Here a native reader (``native/bulkload``: librdkafka, the library
confluent-kafka wraps, and RocksDB's table file writer) reads the changelog partitions of one topic to their
ends on threads of its own, checks every record against the table's formats as the tailer does, and writes
each chunk of a partition's rows — sorted, the latest change of each key — as one table file, which the
replica's store ingests whole with the checkpoint after it (:meth:`ReplicaStore.ingest`). The tailer's
thread only ingests and keeps count; once a partition is read to its end, the replica is handed back to the
tailer's consumer at its checkpoint and goes on as any replica does: it catches up with what came since,
leaves RESTORING and is reopened for reads.

A replica that is removed, reset or fails meanwhile leaves its restore; a restore whose reader fails (the
topic is gone, a position out of range, a file that cannot be written) hands its replicas to the tailer's
consumer at their checkpoints, whose handling of each of those cases applies.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from store_node.replica import Clock, Replica
from store_node.settings import StoreNodeSettings

if TYPE_CHECKING:
    from freshroute_bulkload import ChangelogReader, Chunk

log = logging.getLogger(__name__)

# The tailer's thread ingests for at most this long per round, then polls its consumer for the other replicas.
_ROUND_S = 0.2
_POISON_LOG_INTERVAL_S = 10.0


def _native_reader() -> "Callable[..., ChangelogReader] | None":
    try:
        from freshroute_bulkload import ChangelogReader
    except ImportError:
        return None
    return ChangelogReader


@dataclass
class _Restore:
    """One reader and the replicas it restores: those of one changelog topic."""

    reader: "ChangelogReader"
    replicas: dict[int, Replica]
    started_ms: int
    poison_logged: float = field(default=0.0)


class BulkRestores:
    """The bulk restores running on a node; every method runs on the tailer's thread."""

    def __init__(self, settings: StoreNodeSettings, clock: Clock,
                 reader_factory: "Callable[..., ChangelogReader] | None" = None) -> None:
        self._settings = settings
        self._clock = clock
        self._reader_factory = reader_factory or _native_reader()
        self._restores: dict[str, _Restore] = {}
        if settings.bulk_restore and self._reader_factory is None:
            log.warning("the native bulk restore reader (freshroute_bulkload) is not installed: empty replicas "
                        "restore record by record")

    @property
    def active(self) -> bool:
        return bool(self._restores)

    def takes(self, rep: Replica) -> bool:
        """Whether ``rep`` restores in bulk: its store is empty and loading in bulk, no rate limit applies, and it keeps
        no history (the reader writes each key's latest row only)."""
        s = self._settings
        return (s.bulk_restore and not rep.spec.versioned and not s.apply_rate_limit and self._reader_factory is not None
                and rep.store is not None and rep.store.bulk_load and rep.lag.applied == 0 and rep.failure is None)

    def start(self, reps: list[Replica]) -> list[Replica]:
        """Restore in bulk those of ``reps`` it takes, one reader per topic; returns the others."""
        by_topic: dict[str, list[Replica]] = {}
        others = []
        for rep in reps:
            (by_topic.setdefault(rep.topic, []) if self.takes(rep) else others).append(rep)
        for topic, group in by_topic.items():
            if topic in self._restores:
                # A reader reads the partitions it was given: a later replica of the topic goes the usual way.
                others.extend(group)
                continue
            spec = group[0].spec
            try:
                reader = self._reader_factory(self._settings.bulk_reader_config(), topic,
                                              [(r.partition, r.lag.applied, str(r.store.path)) for r in group],
                                              spec.key_format, spec.value_format)
            except Exception as e:
                log.warning("cannot restore %s in bulk (%s); its replicas restore record by record", topic, e)
                others.extend(group)
                continue
            self._restores[topic] = _Restore(reader, {r.partition: r for r in group}, self._clock())
            log.info("restoring %d partition(s) of %s in bulk", len(group), topic)
        return others

    def cancel(self, rep: Replica) -> None:
        """``rep`` leaves its restore (removed, reset, failed): its reader passes over its partition from now on. A
        file the reader wrote before is deleted when it comes, or when the store is next opened."""
        restore = self._restores.get(rep.topic)
        if restore is None or restore.replicas.get(rep.partition) is not rep:
            return
        self._remove(restore, rep.partition)
        if not restore.replicas:
            self._close(rep.topic)

    def step(self, wait_s: float) -> tuple[int, list[Replica]]:
        """Ingest the chunks that are ready (waiting up to ``wait_s`` for the first); returns the records they stand
        for and the replicas read to their end, for the tailer's consumer to go on with."""
        applied = 0
        done: list[Replica] = []
        deadline = time.monotonic() + _ROUND_S
        for topic, restore in list(self._restores.items()):
            wait = wait_s
            while time.monotonic() < deadline:
                try:
                    chunk = restore.reader.next_chunk(wait)
                except Exception as e:
                    log.warning("the bulk restore of %s failed (%s); its %d replica(s) go on record by record from "
                                "their checkpoints", topic, e, len(restore.replicas))
                    done.extend(restore.replicas.values())
                    restore.replicas.clear()
                    break
                if chunk is None:
                    break
                wait = 0.0
                try:
                    applied += self._load(restore, chunk, done)
                except Exception:
                    # Its later chunks must not be ingested past this one: the consumer goes on from its checkpoint.
                    log.exception("loading a chunk of %s/%d failed; it goes on record by record", topic, chunk.partition)
                    self._leave(restore, chunk.partition, done)
            if not restore.replicas:
                self._close(topic)
        return applied, done

    def close(self) -> None:
        for topic in list(self._restores):
            self._close(topic)

    # --- inside ------------------------------------------------------------------------------------

    def _load(self, restore: _Restore, chunk: "Chunk", done: list[Replica]) -> int:
        rep = restore.replicas.get(chunk.partition)
        if rep is None:  # it left the restore
            for file in (chunk.file, chunk.positions):
                if file:
                    Path(file).unlink(missing_ok=True)
            return 0
        applied = chunk.records - chunk.skipped - chunk.superseded
        rep.load(chunk.file and Path(chunk.file), chunk.positions and Path(chunk.positions), chunk.next_offset, applied,
                 chunk.skipped)
        rep.counters.records_superseded += chunk.superseded
        rep.counters.records_unpositioned += chunk.unpositioned
        if chunk.end_offset >= 0:
            # The last chunk's end came with the fetch response that found it (an end-of-partition event, as the
            # tailer's consumer dates one); an earlier chunk's is dated when the restore started, when the end was
            # at most this (an end offset only grows).
            rep.lag.observe_end(chunk.end_offset, chunk.end_seen_ms if chunk.last else restore.started_ms)
        if chunk.skipped:
            self._report_poison(restore, rep, chunk)
        if rep.failure is not None or rep.corrupt_reason is not None:
            self._remove(restore, chunk.partition)  # the tailer fails or wipes it
        elif chunk.last:
            self._remove(restore, chunk.partition)
            done.append(rep)
            log.info("replica %s/%d: read in bulk to offset %d in %.1fs; it follows on from there", rep.table,
                     rep.partition, chunk.next_offset, time.monotonic() - rep.restore_started)
        return applied

    def _leave(self, restore: _Restore, partition: int, done: list[Replica]) -> None:
        rep = self._remove(restore, partition)
        if rep is not None:
            done.append(rep)

    @staticmethod
    def _remove(restore: _Restore, partition: int) -> Replica | None:
        """Take a partition's replica out of its restore; its reader passes over the partition from then on (the
        restore's owner closes a reader left with none)."""
        rep = restore.replicas.pop(partition, None)
        if rep is not None and restore.replicas:
            restore.reader.drop_partition(partition)
        return rep

    def _report_poison(self, restore: _Restore, rep: Replica, chunk: "Chunk") -> None:
        now = time.monotonic()
        if now - restore.poison_logged < _POISON_LOG_INTERVAL_S:
            return
        restore.poison_logged = now
        shown = ", ".join(f"{offset} ({problem})" for offset, problem in chunk.problems)
        log.warning("replica %s/%d: skipped %d poison record(s) before offset %d, at offsets %s; %d skipped so far",
                    rep.table, rep.partition, chunk.skipped, chunk.next_offset, shown, rep.counters.records_skipped)

    def _close(self, topic: str) -> None:
        restore = self._restores.pop(topic)
        try:
            restore.reader.close()
        except Exception:
            log.exception("closing the bulk reader of %s failed", topic)

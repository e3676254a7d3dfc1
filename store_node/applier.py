"""Applying polled changelog records to the replicas, one checkpointed write per partition per poll.

A poison record (null key, key or value not of the table's formats) is skipped with a counted,
rate-limited warning, and the partition moves on. A row older than the one held for its key (a replayed
Real-time query's, by its input position) is skipped and counted. A restoring replica checks values only when
it writes its staged changes (the latest per key); a staged window with poison is dropped and
read again from the checkpoint, each record checked as it is read.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaError

from freshroute import input_position, version_time
from freshroute.formats import key_problem, value_problem
from store_node.end_offsets import MISSING_TOPIC, EndOffsetWatcher
from store_node.hosted_replicas import ReplicaKey
from store_node.replica import Clock, Replica, Staged
from store_node.replica_set import ReplicaSet
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)

_OUT_OF_RANGE = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}
_POISON_LOG_INTERVAL_S = 10.0
# A restoring replica's changes are written at least this often and in at most this many rows:
# its reported progress moves every second, and a staged batch stays a few MB.
_STAGE_MAX_S = 1.0
_STAGE_MAX_ROWS = 50_000


class RateLimiter:
    """Records per second, as a virtual clock that sleeps the applying thread when ahead."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._next = time.monotonic()

    def batch_size(self, maximum: int) -> int:
        return maximum if not self.rate else max(1, min(maximum, self.rate // 10))

    def spend(self, records: int, stop: threading.Event) -> None:
        if not self.rate or not records:
            return
        now = time.monotonic()
        self._next = max(self._next, now - 1.0) + records / self.rate
        if self._next > now:
            stop.wait(min(self._next - now, 1.0))


class Applier:
    """Applies what a poll returned: records into the stores, events into lag and resets."""

    def __init__(self, settings: StoreNodeSettings, clock: Clock, replicas: ReplicaSet,
                 end_offsets: EndOffsetWatcher) -> None:
        self._settings = settings
        self._clock = clock
        self._replicas = replicas
        self._end_offsets = end_offsets
        self._poison_logged: dict[ReplicaKey, float] = {}
        self.limiter = RateLimiter(settings.apply_rate_limit)
        self.records_skipped = 0

    def handle(self, msgs: list) -> int:
        """Apply a polled batch, one checkpointed write per partition; returns how many records were applied.

        This loop and :meth:`_apply` run once per record during a restore, so they are written
        for speed: records come in runs of one partition, and a run looks its replica up once.
        """
        now = self._clock()
        by_tp = self._replicas.by_tp
        pending: dict[Replica, list] = {}
        reset_now: set[Replica] = set()
        applied = 0
        run_tp = None
        run: list | None = None
        for m in msgs:
            err = m.error()
            if err is None:
                tp = (m.topic(), m.partition())
                if tp != run_tp:
                    run_tp = tp
                    rep = by_tp.get(tp)
                    if rep is None or rep in reset_now or rep.reread:
                        # Unassigned since this record was fetched, reset by this batch, or to fetch
                        # again from its checkpoint (its staged window held poison): void.
                        run = None
                    else:
                        run = pending.get(rep)
                        if run is None:
                            pending[rep] = run = []
                if run is not None:
                    run.append(m)
                continue
            run_tp = None  # an event may apply or reset a replica: the next record looks up again
            rep = by_tp.get((m.topic(), m.partition()))
            if rep is not None and rep in pending:
                # Events follow the partition's records in order: apply those first.
                applied += self._apply(rep, pending.pop(rep))
            if rep is not None and (rep in reset_now or rep.reread):
                continue  # fetched before this batch reset the replica or dropped its window: void
            if self._on_event(m, err, rep, now) and rep is not None:
                reset_now.add(rep)
        for rep, batch in pending.items():
            applied += self._apply(rep, batch)
        return applied

    def write_if_due(self, rep: Replica, mono: float) -> None:
        """Write a restoring replica's staged changes if they are due (see :meth:`_staged_due`)."""
        if rep.staged is not None and self._staged_due(rep, rep.staged, mono):
            rep.write_staged()

    def _apply(self, rep: Replica, batch: list) -> int:
        store = rep.store
        if store is None:
            return 0
        staged = rep.staged
        floor = staged.next_offset if staged is not None else rep.lag.applied
        last = batch[-1].offset()
        if last < floor:
            return 0
        if batch[0].offset() < floor:
            batch = [m for m in batch if m.offset() >= floor]  # a re-delivery after a re-assign
        # A versioned table's records are each a version of its key at its time (store_node/history.py): a restore
        # keeps every one, so none is staged, and each is checked as it is read.
        versioned = rep.spec.versioned
        if rep.restoring and not versioned:
            if staged is None:
                staged = rep.staged = Staged()
            rows = staged.rows
            # Most records of a restore are overwritten by a later change of their key, so staged
            # values are checked once, when written; a batch that starts in a window read again
            # for its poison is checked record by record, all of it.
            check = batch[0].offset() < rep.check_until
        else:
            rows = {}
            check = True
        skipped = 0
        key_format, value_format = rep.spec.key_format, rep.spec.value_format
        valid, times = [], []
        for m in batch:
            key = m.key()
            value = m.value()
            if key is None:
                problem = "null key"
            elif (problem := key_problem(key_format, key)) is not None:
                pass
            elif not check or value is None or (problem := value_problem(value_format, value)) is None:
                headers = m.headers()
                if not versioned:
                    valid.append((key, value, headers))
                    continue
                if (time := version_time.of_record(headers, m.timestamp()[1])) is not None:
                    valid.append((key, value, headers))
                    times.append(time)
                    continue
                problem = f"its {version_time.HEADER} header is not a time in milliseconds"
            if not check:
                staged.poison = True  # reported once, when the window is read again checked
                continue
            skipped += 1
            self._poison(rep, m.offset(), problem,
                         rep.counters.records_skipped + (staged.skipped if staged is not None else 0) + skipped)
        positions = staged.positions if staged is not None else {}
        taken: list[int] | None = [] if versioned else None
        count = self._newer(rep, valid, rows, positions, taken)
        if taken is not None:
            rep.commit_versions([(valid[i][0], times[i], valid[i][1]) for i in taken], last + 1, count, skipped,
                                positions.items())
        elif staged is None:
            rep.commit(rows.items(), last + 1, count, skipped, positions.items())
        else:
            staged.next_offset = last + 1
            staged.records += count
            staged.skipped += skipped
            if self._staged_due(rep, staged):
                rep.write_staged()
        self._end_offsets.refresh(rep)
        return count

    @staticmethod
    def _newer(rep: Replica, valid: list, rows: dict, positions: dict, taken: list[int] | None = None) -> int:
        """Take the valid records (key, value, headers) into ``rows`` and their input positions into ``positions``, in
        order, except a row whose input position does not cover the one held for its key (a replayed Real-time
        query's older row, :mod:`freshroute.input_position`); returns how many were taken (and their indexes in
        ``taken``, if given)."""
        if not any(headers for _, _, headers in valid):
            if taken is not None:
                taken.extend(range(len(valid)))
            rows.update((key, value) for key, value, _ in valid)
            # A delete forgets its key's position (windows expire so); an upsert leaves it, as rewriting it costs a
            # write per record of every table whose pipeline writes none.
            positions.update((key, None) for key, value, _ in valid if value is None)
            rep.counters.records_unpositioned += len(valid)
            return len(valid)
        unknown = list({key for key, _, headers in valid if headers and key not in positions})
        held = dict(zip(unknown, rep.store.positions_of(unknown))) if unknown and rep.store is not None else {}
        held.update(positions)
        count = 0
        for i, (key, value, headers) in enumerate(valid):
            raw = input_position.of_record(headers)
            before = held.get(key)
            applied, after = input_position.applies(before, raw, value is None)
            if not applied:
                rep.counters.records_superseded += 1
                continue
            rows[key] = value
            if raw is None or after is not raw:
                rep.counters.records_unpositioned += 1
            # A delete is written even when nothing was held here: a row without a position read none of its key.
            if after is not before or value is None:
                positions[key] = held[key] = after
            count += 1
            if taken is not None:
                taken.append(i)
        return count

    def _staged_due(self, rep: Replica, staged: Staged, mono: float | None = None) -> bool:
        """Write a restoring replica's staged changes now? When they are many, old, or reach the end.

        Also as soon as a window read again covers the one dropped for its poison: it then
        holds only checked values, and poison after it cannot send the tailer back over it.
        """
        end = rep.lag.end
        return (len(staged.rows) >= _STAGE_MAX_ROWS
                or staged.next_offset >= rep.check_until > rep.lag.applied
                or (end is not None and staged.next_offset + self._settings.caught_up_threshold >= end)
                or (mono if mono is not None else time.monotonic()) - staged.since >= _STAGE_MAX_S)

    def _poison(self, rep: Replica, offset: int, problem: str, skipped_so_far: int) -> None:
        self.records_skipped += 1
        now = time.monotonic()
        last = self._poison_logged.get(rep.key)
        if last is None or now - last >= _POISON_LOG_INTERVAL_S:
            self._poison_logged[rep.key] = now
            log.warning("replica %s/%d: skipping poison record at offset %d (%s); %d skipped so far",
                        rep.table, rep.partition, offset, problem, skipped_so_far)

    def _on_event(self, m: Any, err: KafkaError, rep: Replica | None, now: int) -> bool:
        """Handle a consumer event; True if it reset ``rep``."""
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            if rep is None or rep.store is None:
                return False
            end = m.offset()
            if not self._end_offsets.plausible(rep, end, f"the changelog ends at offset {end}, "
                                                         "below the applied offset"):
                return False
            if end > rep.lag.applied:
                # Nothing between: offsets skipped by compaction or control records.
                rep.apply([], end, 0)
            answered = self._end_offsets.answered_at(rep, now)
            if answered is not None:
                rep.lag.observe_end(end, answered)
            return False
        if code in _OUT_OF_RANGE:
            if rep is not None:
                self._replicas.reset(rep, f"its position is out of range ({err.str()})")
                return True
            return False
        if code in MISSING_TOPIC:
            self._end_offsets.note_missing(m.topic() or "?")
            return False
        log.warning("changelog consumer error on %s/%s: %s", m.topic(), m.partition(), err.str())
        return False

"""The changelog tailer: one consumer per node, one thread, keeping every hosted replica up to date.

It wires three parts and runs their rounds: the :class:`~store_node.replica_set.ReplicaSet`
(which replicas are hosted and from where their changelogs are fetched), the
:class:`~store_node.applier.Applier` (records into the stores), and the
:class:`~store_node.end_offsets.EndOffsetWatcher` (where each changelog ends, and whether it is
still the one the replicas were built from). It also reports restore progress.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Mapping

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from freshroute.lag import now_ms
from freshroute.settings import kafka_logging
from store_node.applier import Applier
from store_node.assignment_follower import Desired
from store_node.bulk_restore import BulkRestores
from store_node.end_offsets import EndOffsetWatcher
from store_node.hosted_replicas import ReplicaKey
from store_node.replica import Clock, Replica
from store_node.replica_set import ReplicaSet
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)


class ChangelogTailer:
    """Tails the changelog partitions of every replica this node hosts, on one thread."""

    def __init__(self, settings: StoreNodeSettings, clock: Clock = now_ms,
                 consumer_factory: Callable[[dict[str, Any]], Any] = Consumer,
                 admin_factory: Callable[[dict[str, Any]], Any] = AdminClient,
                 bulk_reader_factory: Callable[..., Any] | None = None) -> None:
        self._settings = settings
        self._clock = clock
        self._consumer_factory = consumer_factory
        self._admin_factory = admin_factory
        self.bulk = BulkRestores(settings, clock, bulk_reader_factory)
        self.replicas = ReplicaSet(settings, clock, self.bulk)
        self.end_offsets = EndOffsetWatcher(settings, clock, self.replicas)
        self.applier = Applier(settings, clock, self.replicas, self.end_offsets)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._progress_at = time.monotonic()
        self._progress_applied: dict[ReplicaKey, int] = {}
        self.started = threading.Event()
        self.failed = False
        self._kafka_logging = kafka_logging(f"store_node.kafka.{settings.node_id}")

    @property
    def serving(self) -> Mapping[ReplicaKey, Replica]:
        """The hosted replicas, for reads from any thread."""
        return self.replicas.serving

    @property
    def assignment_applied(self) -> bool:
        return self.replicas.assignment_applied

    @property
    def records_skipped(self) -> int:
        return self.applier.records_skipped

    # --- control, from other threads --------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="changelog-tailer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop tailing and close every store cleanly."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("changelog tailer did not stop within %.0fs", timeout_s)

    def set_desired(self, desired: Desired) -> None:
        """The replicas this node should host, with their roles (from a fresh read of the assignment)."""
        self.replicas.set_desired(desired)

    def reports(self, now: int | None = None):
        now = self._clock() if now is None else now
        return tuple(rep.report(now) for rep in self.serving.values())

    # --- the thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        if not self.open():
            return
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    self.step()
                    failures = 0
                except Exception:
                    # A bug must not freeze the replicas silently, nor spin: log, back off, carry on.
                    failures += 1
                    if failures <= 3 or failures % 100 == 0:
                        log.exception("changelog tailer step failed (%d in a row)", failures)
                    self._stop.wait(min(0.1 * failures, 2.0))
        finally:
            self.close()

    def open(self) -> bool:
        """Create the consumer and note replicas left on disk; False (logged) if the consumer cannot be made."""
        try:
            end_offsets = self.end_offsets
            self._consumer = self._consumer_factory(self._settings.consumer_config(
                stats_cb=end_offsets.on_stats, error_cb=end_offsets.on_client_error, **self._kafka_logging))
            admin_config = self._settings.kafka(**{"client.id": f"freshroute-store-{self._settings.node_id}-admin"},
                                                **self._kafka_logging)
            end_offsets.open(self._consumer, lambda: self._admin_factory(admin_config))
            self.replicas.open(self._consumer)
        except Exception:
            log.exception("cannot create the changelog consumer")
            self.failed = True
            return False
        finally:
            self.started.set()
        return True

    def step(self) -> None:
        """One round: follow the assignment, poll, apply, housekeeping."""
        self.replicas.follow()
        consumer = self._consumer
        limiter = self.applier.limiter
        batch_max = limiter.batch_size(self._settings.apply_batch_max)
        # poll() returns as soon as one message is there; consume(…, 0) then drains what is queued
        # without waiting to fill the batch, so an idle replica applies a new record at once.
        # While replicas restore in bulk, the consumer is not waited on: their chunks are.
        bulk = self.bulk.active
        first = consumer.poll(0 if bulk else 0.1)
        msgs = [first] if first is not None else []
        if first is not None and batch_max > 1:
            msgs.extend(consumer.consume(batch_max - 1, 0))
        applied = self.applier.handle(msgs) if msgs else 0
        if bulk:
            loaded, read_to_end = self.bulk.step(0.0 if msgs else 0.1)
            applied += loaded
            for rep in read_to_end:
                self.replicas.follow_on(rep)
        self._after_poll()
        limiter.spend(applied, self._stop)

    def close(self) -> None:
        """Close every replica's store and the consumer."""
        self.bulk.close()
        closed = self.replicas.close()
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:
                log.exception("closing the changelog consumer failed")
        log.info("changelog tailer stopped; %d replica stores closed", closed)

    def _after_poll(self) -> None:
        self.end_offsets.confirm_shrunk()
        now = self._clock()
        mono = time.monotonic()
        for rep in self.replicas.hosted():
            if rep.failure is not None:
                self.replicas.follow_failure(rep, mono)
                continue
            # Before check_restored: a replica is caught up only once what it read is written.
            self.applier.write_if_due(rep, mono)
            if rep.reread:
                self.replicas.reread(rep)
            if rep.corrupt_reason is not None:
                self.replicas.reset(rep, f"its store failed a read ({rep.corrupt_reason})")
            elif rep.check_restored(now):
                self._log_restored(rep)
            rep.expire_history(now)
        self.end_offsets.check_topic_ids()
        if mono - self._progress_at >= self._settings.restore_log_interval_ms / 1000:
            self._log_progress(mono)
        self.replicas.end_moved(mono)
        self.replicas.delete_retired(mono)

    # --- restore progress --------------------------------------------------------------------------

    def _log_restored(self, rep: Replica) -> None:
        records = rep.lag.applied - rep.restore_from
        secs = max(time.monotonic() - rep.restore_started, 1e-6)
        log.info("replica %s/%d: caught up at offset %d after %d offsets in %.1fs (%.0f/s), now %s",
                 rep.table, rep.partition, rep.lag.applied, records, secs, records / secs, rep.state.value)

    def _log_progress(self, mono: float) -> None:
        elapsed = mono - self._progress_at
        self._progress_at = mono
        before, self._progress_applied = self._progress_applied, {}
        per_table: dict[str, list[Replica]] = defaultdict(list)
        for rep in self.replicas.hosted():
            if rep.restoring:
                per_table[rep.table].append(rep)
                self._progress_applied[rep.key] = rep.lag.applied
        for table, reps in sorted(per_table.items()):
            done = sum(r.lag.applied - r.restore_from for r in reps)
            total = sum(max(r.lag.end or 0, r.lag.applied) - r.restore_from for r in reps)
            if total <= 0:
                continue  # nothing to fetch yet (end offsets unknown or empty changelog)
            remaining = max(0, total - done)
            # Progress since the last line, of the replicas restoring then (some may have finished).
            moved = sum(max(0, r.lag.applied - before[r.key]) for r in self.replicas.hosted()
                        if r.table == table and r.key in before)
            rate = moved / elapsed if elapsed > 0 else 0.0
            eta = f"{remaining / rate:.0f}s" if rate > 0 else "unknown"
            pct = 100.0 * done / total
            log.info("restoring %s: %d partition(s) left, %d/%d offsets (%.0f%%), %.0f/s, ETA %s",
                     table, len(reps), done, total, pct, rate, eta)

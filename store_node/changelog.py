"""The changelog tailer: one consumer per node that keeps every hosted replica up to date.

It owns the replicas' lifecycle on its own thread: opens a replica's store when the
assignment gives it to this node, assigns its changelog partition at the stored applied
offset (``assign()`` with explicit offsets; no consumer-group rebalancing, no commits),
applies records in one WriteBatch per partition per poll, and closes the store when the
partition moves away (its files are deleted after a grace period, in case it comes back).

It is also where the replica learns its lag: the statistics callback carries each
partition's high watermark from Fetch responses and each broker's state and response count,
which together are the fresh evidence a caught-up confirmation needs.

And it is where the changelog's surprises are handled, never silently:
- an end offset that stays below the applied offset, an out-of-range position, or a changelog
  topic with a new topic id (a memory-only broker restarted, or the topic was recreated) wipes
  the replica and restores it from the start;
- a poison record (null or non-UTF-8 key, value that is not JSON) is skipped with a counted,
  rate-limited warning, and the partition moves on. A restoring replica checks values only
  when it writes its staged changes (the latest per key); a staged window with poison is
  dropped and read again from the checkpoint, each record checked as it is read.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping
from urllib.parse import unquote

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from freshroute.errors import StoreCorrupt
from freshroute.metadata import Role, TableSpec, now_ms
from store_node.lag import Clock
from store_node.replica import Replica, Staged, replica_path
from store_node.replica_store import ReplicaStore
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)

ReplicaKey = tuple[str, int]
Desired = Mapping[ReplicaKey, tuple[TableSpec, Role]]

_MISSING_TOPIC = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
_OUT_OF_RANGE = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}
_BROKER_DOWN = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}
_POISON_LOG_INTERVAL_S = 10.0
_RETRY_S = 1.0
# A restoring replica's changes are written at least this often and in at most this many rows:
# its reported progress moves every second, and a staged batch stays a few MB.
_STAGE_MAX_S = 1.0
_STAGE_MAX_ROWS = 50_000
# A changelog end below the applied offset must be seen this often, for this long, to wipe a replica.
_SHRUNK_CONFIRMATIONS = 3
_SHRUNK_CONFIRM_S = 1.0
# Retired replica files are deleted only while the assignment is known to be current.
_ASSIGNMENT_FRESH_S = 5.0


def _from_checkpoint(rep: Replica) -> TopicPartition:
    """Where ``rep``'s changelog is fetched from: the offset after what its store holds."""
    return TopicPartition(rep.topic, rep.partition, rep.lag.applied or OFFSET_BEGINNING)


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class _BrokerSeen:
    state: str
    rx: int
    last_response_ms: int


class _QuietRepeats(logging.Filter):
    """librdkafka logs the same connection failure on every reconnect attempt; pass one per interval."""

    def __init__(self, interval_s: float = 60.0) -> None:
        super().__init__()
        self._interval = interval_s
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = re.sub(r"\d+", "#", record.getMessage())[:200]
        now = time.monotonic()
        last = self._seen.get(key)
        if last is not None and now - last < self._interval:
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[key] = now
        return True


class _RateLimiter:
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


class ChangelogTailer:
    """Tails the changelog partitions of every replica this node hosts, on one thread."""

    def __init__(self, settings: StoreNodeSettings, clock: Clock = now_ms,
                 consumer_factory: Callable[[dict[str, Any]], Any] = Consumer,
                 admin_factory: Callable[[dict[str, Any]], Any] = AdminClient) -> None:
        self._settings = settings
        self._root: Path = settings.replica_root
        self._clock = clock
        self._consumer_factory = consumer_factory
        self._admin_factory = admin_factory
        self._replicas: dict[ReplicaKey, Replica] = {}
        self._by_tp: dict[tuple[str, int], Replica] = {}
        # What the event loop reads: swapped whole, never mutated in place.
        self.serving: Mapping[ReplicaKey, Replica] = MappingProxyType({})
        self._lock = threading.Lock()
        self._wanted: Desired = {}
        self._wanted_changed = False
        self._wanted_at = 0.0
        self._failed: set[ReplicaKey] = set()
        self._retry_at = 0.0
        self._retired: dict[ReplicaKey, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._admin: Any = None
        self._brokers: dict[int, _BrokerSeen] = {}
        self._broker_outage = False
        self._responding_at: int | None = None  # the last broker response the statistics saw
        # Replicas whose changelog end looks lower than their applied offset: (first seen, times, reason).
        self._shrunk: dict[ReplicaKey, tuple[float, int, str]] = {}
        self._topic_ids: dict[str, str] = {}
        self._topic_futures: dict[str, Any] | None = None
        self._topic_check_at = 0.0
        self._missing_topics: set[str] = set()
        self._poison_logged: dict[ReplicaKey, float] = {}
        self._limiter = _RateLimiter(settings.apply_rate_limit)
        self._progress_at = time.monotonic()
        self._progress_applied: dict[ReplicaKey, int] = {}
        self.records_skipped = 0
        self.started = threading.Event()
        self.failed = False
        self.assignment_applied = False  # the node has followed an assignment at least once
        self._kafka_log = logging.getLogger(f"store_node.kafka.{settings.node_id}")
        self._kafka_log.addFilter(_QuietRepeats())

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
        with self._lock:
            self._wanted_at = time.monotonic()
            if desired != self._wanted:
                self._wanted = dict(desired)
                self._wanted_changed = True

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
            self._consumer = self._consumer_factory(self._settings.consumer_config(
                stats_cb=self._on_stats, error_cb=self._on_client_error, logger=self._kafka_log, log_level=4))
            self._admin = self._admin_factory(self._settings.kafka(
                **{"client.id": f"freshroute-store-{self._settings.node_id}-admin"},
                logger=self._kafka_log, log_level=4))
            self._note_local_replicas()
        except Exception:
            log.exception("cannot create the changelog consumer")
            self.failed = True
            return False
        finally:
            self.started.set()
        return True

    def step(self) -> None:
        """One round: follow the assignment, poll, apply, housekeeping."""
        self._reconcile()
        consumer = self._consumer
        batch_max = self._limiter.batch_size(self._settings.apply_batch_max)
        # poll() returns as soon as one message is there; consume(…, 0) then drains what is queued
        # without waiting to fill the batch, so an idle replica applies a new record at once.
        first = consumer.poll(0.1)
        msgs = [first] if first is not None else []
        if first is not None and batch_max > 1:
            msgs.extend(consumer.consume(batch_max - 1, 0))
        applied = self._handle(msgs) if msgs else 0
        self._after_poll()
        self._limiter.spend(applied, self._stop)

    def close(self) -> None:
        """Close every replica's store and the consumer."""
        for rep in list(self._replicas.values()):
            try:
                rep.write_staged()  # a restart resumes after what was read, not before
                rep.close()
            except Exception:
                log.exception("closing replica %s/%d failed", rep.table, rep.partition)
        self.serving = MappingProxyType({})
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:
                log.exception("closing the changelog consumer failed")
        log.info("changelog tailer stopped; %d replica stores closed", len(self._replicas))
        self._replicas.clear()
        self._by_tp.clear()

    # --- assignment -------------------------------------------------------------------------------

    def _note_local_replicas(self) -> None:
        """Replicas on disk from an earlier run are kept for the grace period, then deleted if unassigned."""
        if not self._root.is_dir():
            return
        deadline = time.monotonic() + self._settings.removed_replica_grace_ms / 1000
        for table_dir in self._root.iterdir():
            if not table_dir.is_dir():
                continue
            for part_dir in table_dir.iterdir():
                if part_dir.is_dir() and part_dir.name.isdigit():
                    self._retired[(unquote(table_dir.name), int(part_dir.name))] = deadline

    def _reconcile(self) -> None:
        with self._lock:
            changed, self._wanted_changed = self._wanted_changed, False
            wanted = self._wanted
        if not changed and not (self._failed and time.monotonic() >= self._retry_at):
            return
        self._failed.clear()
        for key in [k for k in self._replicas if k not in wanted]:
            self._remove(key)
        opened: list[Replica] = []
        for key, (spec, role) in wanted.items():
            rep = self._replicas.get(key)
            if rep is not None and rep.topic != spec.topic:
                self._remove(key)
                rep = None
            if rep is None:
                try:
                    opened.append(self._open(spec, key[1], role))
                except Exception as e:
                    self._open_failed(key, e)
            elif rep.role is not role:
                log.info("replica %s/%d: role %s → %s", rep.table, rep.partition, rep.role.value, role.value)
                rep.role = role
        if opened:
            self._assign(opened)
        self._publish()
        self.assignment_applied = True

    def _publish(self) -> None:
        self.serving = MappingProxyType(dict(self._replicas))

    def _open(self, spec: TableSpec, partition: int, role: Role) -> Replica:
        """A replica over its opened store (its changelog not fetched yet)."""
        store, wiped = ReplicaStore.open_or_wipe(replica_path(self._root, spec.name, partition))
        if wiped is not None:
            log.warning("replica %s/%d: local store was unreadable (%s); wiped it, it restores from the changelog",
                        spec.name, partition, wiped)
        s = self._settings
        rep = Replica(spec, partition, role, store, self._clock, s.evidence_window_ms, s.caught_up_threshold)
        try:
            known_id = self._topic_ids.get(spec.topic)
            if known_id and store.topic_id and store.topic_id != known_id:
                log.warning("replica %s/%d: stored rows come from an earlier changelog topic (id %s, now %s); "
                            "wiping it and restoring from the start", spec.name, partition, store.topic_id, known_id)
                rep.wipe(self._root)
        except BaseException:
            rep.close()  # an open store left behind would make the retry find it locked
            raise
        return rep

    def _assign(self, opened: list[Replica]) -> None:
        """Fetch the changelogs of newly opened replicas, all in one assignment.

        Every store is opened first (each open costs milliseconds of file syncs, tens on a busy
        machine): assigned one by one, the first partitions' records would wait in the fetch
        queue for the later opens, counted in their restore time.
        """
        try:
            self._consumer.incremental_assign([_from_checkpoint(rep) for rep in opened])
        except Exception as e:
            for rep in opened:
                rep.close()
                self._open_failed(rep.key, e)
            return
        started = time.monotonic()
        for rep in opened:
            applied = rep.lag.applied
            rep.restore_started = started  # reading starts now, for every one of them
            self._replicas[rep.key] = rep
            self._by_tp[(rep.topic, rep.partition)] = rep
            self._retired.pop(rep.key, None)
            if applied:
                log.info("replica %s/%d (%s): resuming changelog %s at stored offset %d",
                         rep.table, rep.partition, rep.role.value, rep.topic, applied)
            else:
                log.info("replica %s/%d (%s): restoring from the start of changelog %s",
                         rep.table, rep.partition, rep.role.value, rep.topic)

    def _open_failed(self, key: ReplicaKey, e: BaseException) -> None:
        log.error("cannot open replica %s/%d: %s; retrying", key[0], key[1], e)
        self._retry_later(key)

    def _retry_later(self, key: ReplicaKey) -> None:
        """Open the replica again at a later reconcile, after the retry delay."""
        self._failed.add(key)
        self._retry_at = time.monotonic() + _RETRY_S

    def _remove(self, key: ReplicaKey) -> None:
        rep = self._replicas.pop(key)
        self._by_tp.pop((rep.topic, rep.partition), None)
        self._publish()  # stop serving it before its store closes
        self._unassign(rep)
        rep.close()
        grace_ms = self._settings.removed_replica_grace_ms
        self._retired[key] = time.monotonic() + grace_ms / 1000
        log.info("replica %s/%d: no longer assigned here; its files are kept %.0fs in case it returns",
                 rep.table, rep.partition, grace_ms / 1000)

    def _reset(self, rep: Replica, reason: str) -> None:
        """Wipe a replica and restore it from the start of its changelog."""
        if self._replicas.get(rep.key) is not rep:
            return
        log.warning("replica %s/%d: %s; wiping it and restoring from the start of the changelog (applied was %d)",
                    rep.table, rep.partition, reason, rep.lag.applied)
        self._unassign(rep)
        try:
            rep.wipe(self._root)
        except StoreCorrupt as e:
            # The directory cannot even be recreated (disk?): drop the replica and let reconcile retry.
            log.error("replica %s/%d: cannot recreate its store: %s", rep.table, rep.partition, e.message)
            self._replicas.pop(rep.key, None)
            self._by_tp.pop((rep.topic, rep.partition), None)
            self._publish()
            self._retry_later(rep.key)
            return
        self._consumer.incremental_assign([_from_checkpoint(rep)])  # the start: the store is empty

    def _reread(self, rep: Replica) -> None:
        """Fetch again, from the checkpoint, the staged window ``rep`` dropped for holding poison."""
        log.debug("replica %s/%d: its staged changes up to offset %d hold poison; reading them again from %d",
                  rep.table, rep.partition, rep.check_until, rep.lag.applied)
        self._unassign(rep)
        self._consumer.incremental_assign([_from_checkpoint(rep)])
        rep.reread = False  # only once assigned: a failed assignment is retried after the next poll

    def _unassign(self, rep: Replica) -> None:
        """Stop fetching ``rep``'s changelog; a failure is logged (the partition may not be assigned)."""
        try:
            self._consumer.incremental_unassign([TopicPartition(rep.topic, rep.partition)])
        except KafkaException as e:
            log.warning("unassigning %s/%d failed: %s", rep.topic, rep.partition, e)

    # --- records ----------------------------------------------------------------------------------

    def _handle(self, msgs: list) -> int:
        """Apply a polled batch, one WriteBatch per partition; returns how many records were applied.

        This loop and :meth:`_apply` run once per record during a restore, so they are written
        for speed: records come in runs of one partition, and a run looks its replica up once.
        """
        now = self._clock()
        by_tp = self._by_tp
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
        if rep.restoring:
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
        loads = orjson.loads
        count = skipped = 0
        for m in batch:
            key = m.key()
            value = m.value()
            if key is None:
                problem = "null key"
            elif not key.isascii() and not _is_utf8(key):
                problem = "key is not UTF-8"
            elif not check or value is None:
                rows[key] = value
                count += 1
                continue
            else:
                try:
                    loads(value)
                except orjson.JSONDecodeError:
                    problem = "value is not JSON"
                else:
                    rows[key] = value
                    count += 1
                    continue
            if not check:
                staged.poison = True  # reported once, when the window is read again checked
                continue
            skipped += 1
            self._poison(rep, m.offset(), problem,
                         rep.counters.records_skipped + (staged.skipped if staged is not None else 0) + skipped)
        if staged is None:
            rep.commit(store.batch(rows.items()), last + 1, count, skipped)
        else:
            staged.next_offset = last + 1
            staged.records += count
            staged.skipped += skipped
            if self._staged_due(rep, staged):
                rep.write_staged()
        self._refresh_end(rep)
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

    def _refresh_end(self, rep: Replica) -> None:
        """Take the end offset of the latest Fetch response now, rather than at the next statistics.

        It is dated to the broker's last response the statistics saw, which is no later than the
        Fetch that carried it: the end offset at that time was at most this, so the replica, once
        past it, was complete as of then.
        """
        seen = self._responding_at
        if seen is None or self._clock() - seen > self._settings.evidence_window_ms:
            return
        try:
            _, hi = self._consumer.get_watermark_offsets(TopicPartition(rep.topic, rep.partition), cached=True)
        except KafkaException:
            return
        if hi >= rep.lag.applied:
            rep.lag.observe_end(hi, seen)

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
            if end < rep.lag.applied:
                self._suspect_shrunk(rep, f"the changelog ends at offset {end}, below the applied offset")
                return False
            self._shrunk.pop(rep.key, None)
            if end > rep.lag.applied:
                # Nothing between: offsets skipped by compaction or control records.
                rep.apply([], end, 0)
            rep.lag.observe_end(end, now)  # an EOF is a Fetch response just received
            return False
        if code in _OUT_OF_RANGE:
            if rep is not None:
                self._reset(rep, f"its position is out of range ({err.str()})")
                return True
            return False
        if code in _MISSING_TOPIC:
            self._note_missing(m.topic() or "?")
            return False
        log.warning("changelog consumer error on %s/%s: %s", m.topic(), m.partition(), err.str())
        return False

    # --- evidence from the broker ------------------------------------------------------------------

    def _on_client_error(self, err: KafkaError) -> None:
        if err.code() in _BROKER_DOWN:
            if not self._broker_outage:
                self._broker_outage = True
                log.warning("changelog broker unreachable (%s); replicas keep serving and their staleness grows",
                            err.str())
            return
        log.warning("changelog consumer: %s", err.str())

    def _on_stats(self, raw: str) -> None:
        now = self._clock()
        stats = orjson.loads(raw)
        window = self._settings.evidence_window_ms
        brokers = self._brokers
        responding = False
        for b in stats.get("brokers", {}).values():
            nid = b.get("nodeid", -1)
            if nid < 0:
                continue  # bootstrap and coordinator pseudo-brokers
            rx = b.get("rx", 0)
            seen = brokers.get(nid)
            if seen is None:
                brokers[nid] = seen = _BrokerSeen(b.get("state", ""), rx, now if rx else 0)
            elif rx > seen.rx:
                seen.last_response_ms = now
            seen.state = b.get("state", "")
            seen.rx = rx
            if seen.state == "UP" and now - seen.last_response_ms <= window:
                responding = True
        if responding:
            self._responding_at = max(b.last_response_ms for b in brokers.values() if b.state == "UP")
        if responding and self._broker_outage:
            self._broker_outage = False
            log.info("changelog broker reachable again")
        by_tp = self._by_tp
        for topic, t in stats.get("topics", {}).items():
            for pid, p in t.get("partitions", {}).items():
                rep = by_tp.get((topic, int(pid)))
                if rep is None or rep.store is None:
                    continue
                hi = p.get("hi_offset", -1)
                if hi < 0 or p.get("fetch_state") != "active":
                    continue
                leader = brokers.get(p.get("leader", -1))
                if leader is None or leader.state != "UP" or now - leader.last_response_ms > window:
                    continue
                if hi < rep.lag.applied:
                    self._suspect_shrunk(rep, f"the changelog's high watermark {hi} is below the applied offset")
                    continue
                self._shrunk.pop(rep.key, None)
                rep.lag.observe_end(hi, leader.last_response_ms)

    def _suspect_shrunk(self, rep: Replica, what: str) -> None:
        """Note evidence that the partition lost records; :meth:`_confirm_shrunk` acts once it persists.

        A high watermark below the applied offset means the broker lost the partition (a
        memory-only broker restarted, the topic was recreated) — or, for a moment, that the
        broker reported a watermark older than the records it had already served, which this
        broker does under concurrent appends. Only a low watermark that persists is a loss.
        """
        first, times, _ = self._shrunk.get(rep.key, (time.monotonic(), 0, what))
        self._shrunk[rep.key] = (first, times + 1, what)

    def _confirm_shrunk(self) -> None:
        now = time.monotonic()
        for key, (first, times, what) in list(self._shrunk.items()):
            rep = self._replicas.get(key)
            if rep is None:
                del self._shrunk[key]
            elif times >= _SHRUNK_CONFIRMATIONS and now - first >= _SHRUNK_CONFIRM_S:
                del self._shrunk[key]
                self._reset(rep, f"{what} for {now - first:.1f}s (the broker lost the partition: restarted "
                                 "memory-only, or the topic was recreated)")

    def _note_missing(self, topic: str) -> None:
        if topic not in self._missing_topics:
            self._missing_topics.add(topic)
            log.warning("changelog topic %s does not exist (yet); its replicas wait for it", topic)

    def _check_topic_ids(self) -> None:
        """Compare each changelog's topic id with the one its replicas' rows came from."""
        now = time.monotonic()
        futures = self._topic_futures
        if futures is not None:
            if not all(f.done() for f in futures.values()):
                if now - self._topic_check_at < 30:
                    return
            self._topic_futures = None
            for topic, f in futures.items():
                if not f.done():
                    continue
                try:
                    desc = f.result(0)
                except KafkaException as e:
                    if e.args and getattr(e.args[0], "code", lambda: None)() in _MISSING_TOPIC:
                        self._note_missing(topic)
                    continue  # missing topic or broker down: nothing learned
                except Exception:
                    continue
                topic_id = str(desc.topic_id)
                if topic in self._missing_topics:
                    self._missing_topics.discard(topic)
                    log.info("changelog topic %s exists now", topic)
                self._topic_ids[topic] = topic_id
                for rep in [r for r in self._replicas.values() if r.topic == topic and r.store is not None]:
                    if rep.store.topic_id is None:
                        rep.store.set_topic_id(topic_id)
                    elif rep.store.topic_id != topic_id:
                        self._reset(rep, f"changelog topic {topic} was recreated (topic id {rep.store.topic_id} "
                                         f"→ {topic_id})")
            return
        if now - self._topic_check_at < self._settings.topic_check_ms / 1000:
            return
        self._topic_check_at = now
        topics = sorted({r.topic for r in self._replicas.values()})
        if topics:
            try:
                self._topic_futures = self._admin.describe_topics(TopicCollection(topics), request_timeout=5)
            except Exception as e:
                log.debug("describe_topics failed: %s", e)

    # --- housekeeping after every poll --------------------------------------------------------------

    def _after_poll(self) -> None:
        if self._shrunk:
            self._confirm_shrunk()
        now = self._clock()
        mono = time.monotonic()
        for rep in self._replicas.values():
            # Before check_restored: a replica is caught up only once what it read is written.
            if rep.staged is not None and self._staged_due(rep, rep.staged, mono):
                rep.write_staged()
            if rep.reread:
                self._reread(rep)
            if rep.corrupt_reason is not None:
                self._reset(rep, f"its store failed a read ({rep.corrupt_reason})")
            elif rep.check_restored(now):
                self._log_restored(rep)
        self._check_topic_ids()
        if mono - self._progress_at >= self._settings.restore_log_interval_ms / 1000:
            self._log_progress(mono)
        if self._retired:
            self._delete_retired(mono)

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
        for rep in self._replicas.values():
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
            moved = sum(max(0, r.lag.applied - before[r.key]) for r in self._replicas.values()
                        if r.table == table and r.key in before)
            rate = moved / elapsed if elapsed > 0 else 0.0
            eta = f"{remaining / rate:.0f}s" if rate > 0 else "unknown"
            pct = 100.0 * done / total
            log.info("restoring %s: %d partition(s) left, %d/%d offsets (%.0f%%), %.0f/s, ETA %s",
                     table, len(reps), done, total, pct, rate, eta)

    def _delete_retired(self, mono: float) -> None:
        if not self._retired:
            return
        with self._lock:
            fresh = mono - self._wanted_at <= _ASSIGNMENT_FRESH_S and self._wanted_at > 0
        if not fresh:
            return  # never delete on an outdated view of the assignment
        for key, deadline in list(self._retired.items()):
            if mono < deadline or key in self._replicas:
                continue
            del self._retired[key]
            path = replica_path(self._root, *key)
            ReplicaStore.destroy(path)
            try:
                path.parent.rmdir()  # the table's directory, once its last partition is gone
            except OSError:
                pass
            log.info("replica %s/%d: deleted its files (not assigned here for the grace period)", *key)

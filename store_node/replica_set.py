"""The replicas a node hosts: opened when the assignment gives them here, removed when it moves them.

A replica's store is opened when its partition is assigned to this node and its changelog
fetched from the stored applied offset (``assign()`` with explicit offsets: no consumer-group
rebalancing, no commits). When the partition moves away the replica serves on as a standby for
``moved_replica_serve_ms`` (a node judged dead a moment too soon gets its placements back within
it, and the replicas placed elsewhere restore meanwhile); then its store is closed and its files
are kept for a grace period, in case it comes back. A replica whose changelog cannot be trusted
any more is wiped and restored from the start.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping
from urllib.parse import unquote

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from freshroute.errors import StoreCorrupt
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.tables import TableSpec
from store_node.bulk_restore import BulkRestores
from store_node.replica import Clock, Replica, replica_path
from store_node.replica_store import DiskFull, ReplicaStore, StoreMemory
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)

ReplicaKey = tuple[str, int]
Desired = Mapping[ReplicaKey, tuple[TableSpec, Role]]

_RETRY_S = 1.0
# A replica FAILED for want of disk tries again this long after (space may have been freed meanwhile).
FAILED_RETRY_S = 60.0
# Retired replica files are deleted only while the assignment is known to be current.
_ASSIGNMENT_FRESH_S = 5.0


def _from_checkpoint(rep: Replica) -> TopicPartition:
    """Where ``rep``'s changelog is fetched from: the offset after what its store holds."""
    return TopicPartition(rep.topic, rep.partition, rep.lag.applied or OFFSET_BEGINNING)


class ReplicaSet:
    """Every replica this node hosts, changed only on the tailer's thread; ``serving`` is read anywhere."""

    def __init__(self, settings: StoreNodeSettings, clock: Clock, bulk: BulkRestores | None = None) -> None:
        self._settings = settings
        self._bulk = bulk
        self._root: Path = settings.replica_root
        self._memory = StoreMemory(settings.block_cache_mb)
        self._clock = clock
        self._consumer: Any = None
        self._replicas: dict[ReplicaKey, Replica] = {}
        self.by_tp: dict[tuple[str, int], Replica] = {}
        # What the event loop reads: swapped whole, never mutated in place.
        self.serving: Mapping[ReplicaKey, Replica] = MappingProxyType({})
        # The id of each changelog topic when last described; rows from another id are wiped.
        self.topic_ids: dict[str, str] = {}
        self.assignment_applied = False  # the node has followed an assignment at least once
        self._lock = threading.Lock()
        self._wanted: Desired = {}
        self._wanted_changed = False
        self._wanted_at = 0.0
        self._failed: set[ReplicaKey] = set()
        self._retry_at = 0.0
        self._retired: dict[ReplicaKey, float] = {}
        self._moved: dict[ReplicaKey, float] = {}  # replicas moved away, serving until then (monotonic)

    def set_desired(self, desired: Desired) -> None:
        """The replicas this node should host, with their roles; from any thread."""
        with self._lock:
            self._wanted_at = time.monotonic()
            if desired != self._wanted:
                self._wanted = dict(desired)
                self._wanted_changed = True

    def hosted(self) -> list[Replica]:
        """The replicas hosted now, as a list: acting on one may remove it."""
        return list(self._replicas.values())

    def get(self, key: ReplicaKey) -> Replica | None:
        return self._replicas.get(key)

    # --- lifecycle --------------------------------------------------------------------------------

    def open(self, consumer: Any) -> None:
        """Fetch changelogs with ``consumer`` from now on; replicas left on disk are retired."""
        self._consumer = consumer
        if not self._root.is_dir():
            return
        # Kept for the grace period, then deleted if the assignment does not give them back.
        deadline = time.monotonic() + self._settings.removed_replica_grace_ms / 1000
        for table_dir in self._root.iterdir():
            if not table_dir.is_dir():
                continue
            for part_dir in table_dir.iterdir():
                if part_dir.is_dir() and part_dir.name.isdigit():
                    self._retired[(unquote(table_dir.name), int(part_dir.name))] = deadline

    def close(self) -> int:
        """Close every replica's store, after writing what a restore has staged; returns how many."""
        for rep in list(self._replicas.values()):
            try:
                rep.write_staged()  # a restart resumes after what was read, not before
                rep.close()
            except Exception:
                log.exception("closing replica %s/%d failed", rep.table, rep.partition)
        self.serving = MappingProxyType({})
        self._moved.clear()
        closed = len(self._replicas)
        self._replicas.clear()
        self.by_tp.clear()
        return closed

    def follow(self) -> None:
        """Open, remove or change the role of replicas to match the desired assignment, if it changed."""
        with self._lock:
            changed, self._wanted_changed = self._wanted_changed, False
            wanted = self._wanted
        if not changed and not (self._failed and time.monotonic() >= self._retry_at):
            return
        self._failed.clear()
        for key in [k for k in self._replicas if k not in wanted and k not in self._moved]:
            self._move_away(key)
        opened: list[Replica] = []
        for key, (spec, role) in wanted.items():
            rep = self._replicas.get(key)
            if self._moved.pop(key, None) is not None and rep is not None:
                log.info("replica %s/%d: placed here again while it still served", rep.table, rep.partition)
            if rep is not None and rep.topic != spec.topic:
                self._remove(key)
                rep = None
            if rep is None:
                try:
                    opened.append(self._open(spec, key[1], role))
                except DiskFull as e:
                    # Hosted FAILED, its reason reported, and opened again later (follow_failure).
                    self._host(self._replica(spec, key[1], role, None, failure=e.message))
                    log.error("replica %s/%d: %s; it is FAILED and tries again in %.0f s", spec.name, key[1],
                              e.message, FAILED_RETRY_S)
                except Exception as e:
                    self._open_failed(key, e)
            elif rep.role is not role:
                log.info("replica %s/%d: role %s → %s", rep.table, rep.partition, rep.role.value, role.value)
                rep.role = role
        if opened:
            self._assign(opened)
        self._publish()
        self.assignment_applied = True

    def reset(self, rep: Replica, reason: str) -> None:
        """Wipe a replica and restore it from the start of its changelog."""
        if self._replicas.get(rep.key) is not rep:
            return
        log.warning("replica %s/%d: %s; wiping it and restoring from the start of the changelog (applied was %d)",
                    rep.table, rep.partition, reason, rep.lag.applied)
        self._unassign(rep)
        try:
            rep.wipe(self._root, self._memory)
        except DiskFull as e:
            rep.mark_failed(e.message)  # still FAILED; tries again later
            return
        except StoreCorrupt as e:
            # The directory cannot even be recreated (disk?): drop the replica and let follow() retry.
            log.error("replica %s/%d: cannot recreate its store: %s", rep.table, rep.partition, e.message)
            self._replicas.pop(rep.key, None)
            self.by_tp.pop((rep.topic, rep.partition), None)
            self._publish()
            self._retry_later(rep.key)
            return
        self._fetch([rep])  # from the start: the store is empty

    def follow_failure(self, rep: Replica, mono: float) -> None:
        """A FAILED replica: stopped at once (:meth:`_fail`), restored from the start again FAILED_RETRY_S later."""
        if rep.store is not None:
            self._fail(rep)
        elif mono - rep.failed_at >= FAILED_RETRY_S:
            self.reset(rep, f"trying again after its failure ({rep.failure})")

    def _fail(self, rep: Replica) -> None:
        """Stop a replica whose store cannot be written: it stays hosted, FAILED (its report says why), never read,
        and its files are deleted — a partial copy, whose space the node's other replicas need."""
        log.error("replica %s/%d: %s; it is FAILED and not read, its files are deleted, and it tries again in %.0f s",
                  rep.table, rep.partition, rep.failure, FAILED_RETRY_S)
        self._unassign(rep)
        rep.close()
        rep.lag.reset()
        ReplicaStore.destroy(replica_path(self._root, rep.table, rep.partition))

    def reread(self, rep: Replica) -> None:
        """Fetch again, from the checkpoint, the staged window ``rep`` dropped for holding poison."""
        log.debug("replica %s/%d: its staged changes up to offset %d hold poison; reading them again from %d",
                  rep.table, rep.partition, rep.check_until, rep.lag.applied)
        self._unassign(rep)
        self._consumer.incremental_assign([_from_checkpoint(rep)])
        rep.reread = False  # only once assigned: a failed assignment is retried after the next poll

    def end_moved(self, mono: float) -> None:
        """Stop serving the replicas moved away whose time to serve on is over."""
        for key in [k for k, until in self._moved.items() if mono >= until]:
            del self._moved[key]
            if key in self._replicas:
                self._remove(key)

    def delete_retired(self, mono: float) -> None:
        """Delete the files of replicas not assigned here for the grace period."""
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

    # --- inside ------------------------------------------------------------------------------------

    def _publish(self) -> None:
        self.serving = MappingProxyType(dict(self._replicas))

    def _open(self, spec: TableSpec, partition: int, role: Role) -> Replica:
        """A replica over its opened store (its changelog not fetched yet)."""
        store, wiped = ReplicaStore.open_or_wipe(replica_path(self._root, spec.name, partition), self._memory)
        if wiped is not None:
            log.warning("replica %s/%d: local store was unreadable (%s); wiped it, it restores from the changelog",
                        spec.name, partition, wiped)
        rep = self._replica(spec, partition, role, store)
        try:
            known_id = self.topic_ids.get(spec.topic)
            if known_id and store.topic_id and store.topic_id != known_id:
                log.warning("replica %s/%d: stored rows come from an earlier changelog topic (id %s, now %s); "
                            "wiping it and restoring from the start", spec.name, partition, store.topic_id, known_id)
                rep.wipe(self._root, self._memory)
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
            self._fetch(opened)
        except Exception as e:
            for rep in opened:
                if self._bulk is not None:
                    self._bulk.cancel(rep)
                rep.close()
                self._open_failed(rep.key, e)
            return
        started = time.monotonic()
        for rep in opened:
            applied = rep.lag.applied
            rep.restore_started = started  # reading starts now, for every one of them
            self._host(rep)
            if applied:
                log.info("replica %s/%d (%s): resuming changelog %s at stored offset %d",
                         rep.table, rep.partition, rep.role.value, rep.topic, applied)
            else:
                log.info("replica %s/%d (%s): restoring from the start of changelog %s",
                         rep.table, rep.partition, rep.role.value, rep.topic)

    def _fetch(self, reps: list[Replica]) -> None:
        """Fetch the changelogs of ``reps`` from their checkpoints: empty stores in bulk, the others by the consumer."""
        rest = self._bulk.start(reps) if self._bulk is not None else reps
        if rest:
            self._consumer.incremental_assign([_from_checkpoint(rep) for rep in rest])

    def follow_on(self, rep: Replica) -> None:
        """Fetch by the consumer, from its checkpoint, the changelog of a replica its bulk restore read to the end."""
        if self._replicas.get(rep.key) is rep:
            self._consumer.incremental_assign([_from_checkpoint(rep)])

    def _replica(self, spec: TableSpec, partition: int, role: Role, store: ReplicaStore | None,
                 failure: str | None = None) -> Replica:
        s = self._settings
        return Replica(spec, partition, role, store, self._clock, s.evidence_window_ms, s.caught_up_threshold, failure)

    def _host(self, rep: Replica) -> None:
        self._replicas[rep.key] = rep
        self.by_tp[(rep.topic, rep.partition)] = rep
        self._retired.pop(rep.key, None)

    def _open_failed(self, key: ReplicaKey, e: BaseException) -> None:
        log.error("cannot open replica %s/%d: %s; retrying", key[0], key[1], e)
        self._retry_later(key)

    def _retry_later(self, key: ReplicaKey) -> None:
        """Open the replica again at a later follow(), after the retry delay."""
        self._failed.add(key)
        self._retry_at = time.monotonic() + _RETRY_S

    def _move_away(self, key: ReplicaKey) -> None:
        """The assignment placed ``key`` elsewhere: a caught-up replica serves on as a standby for a while; one still
        restoring (or failed) has nothing to answer with and stops at once."""
        serve_ms = self._settings.moved_replica_serve_ms
        rep = self._replicas[key]
        if serve_ms <= 0 or rep.store is None or rep.failure is not None or rep.state is ReplicaState.RESTORING:
            self._remove(key)
            return
        self._moved[key] = time.monotonic() + serve_ms / 1000
        rep.role = Role.STANDBY
        log.info("replica %s/%d: no longer assigned here; it serves on as a standby for %.0fs while the replicas "
                 "placed elsewhere restore", rep.table, rep.partition, serve_ms / 1000)

    def _remove(self, key: ReplicaKey) -> None:
        self._moved.pop(key, None)
        rep = self._replicas.pop(key)
        self.by_tp.pop((rep.topic, rep.partition), None)
        self._publish()  # stop serving it before its store closes
        self._unassign(rep)
        rep.close()
        grace_ms = self._settings.removed_replica_grace_ms
        self._retired[key] = time.monotonic() + grace_ms / 1000
        log.info("replica %s/%d: no longer assigned here; its files are kept %.0fs in case it returns",
                 rep.table, rep.partition, grace_ms / 1000)

    def _unassign(self, rep: Replica) -> None:
        """Stop fetching ``rep``'s changelog; a failure is logged (the partition may not be assigned)."""
        if self._bulk is not None:
            self._bulk.cancel(rep)
        try:
            self._consumer.incremental_unassign([TopicPartition(rep.topic, rep.partition)])
        except KafkaException as e:
            log.warning("unassigning %s/%d failed: %s", rep.topic, rep.partition, e)

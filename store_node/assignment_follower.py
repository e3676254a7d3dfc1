"""Hosting the replicas the assignment gives this node: opened when it places them here, removed when it moves them.

A replica's store is opened when its partition is assigned to this node, and its changelog fetched from the stored
applied offset. When the partition moves away the replica serves on as a standby for ``moved_replica_serve_ms`` (a
node judged dead a moment too soon gets its placements back within it, and the replicas placed elsewhere restore
meanwhile); then its store is closed and its files are retired, in case it comes back.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Mapping

from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.tables import TableSpec
from store_node.changelog_fetch import ChangelogFetch
from store_node.hosted_replicas import HostedReplicas, ReplicaKey
from store_node.replica import Clock, Replica, replica_path
from store_node.replica_resets import FAILED_RETRY_S
from store_node.replica_store import DiskFull, ReplicaStore, StoreMemory
from store_node.retired_replicas import RetiredReplicas
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)

Desired = Mapping[ReplicaKey, tuple[TableSpec, Role]]

_RETRY_S = 1.0


class DesiredAssignment:
    """The replicas this node should host, with their roles: set from any thread, taken by the tailer's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted: Desired = {}
        self._changed = False
        self._read_at = 0.0  # when the assignment was last read (monotonic; 0: never)

    def set(self, desired: Desired) -> None:
        """The replicas this node should host, with their roles, from a fresh read of the assignment."""
        with self._lock:
            self._read_at = time.monotonic()
            if desired != self._wanted:
                self._wanted = dict(desired)
                self._changed = True

    def take(self) -> tuple[bool, Desired]:
        """The desired replicas, and whether they changed since last taken."""
        with self._lock:
            changed, self._changed = self._changed, False
            return changed, self._wanted

    def read_at(self) -> float:
        with self._lock:
            return self._read_at


class AssignmentFollower:
    """Opens, moves away and removes replicas, and changes their roles, so the hosted ones are the desired ones."""

    def __init__(self, settings: StoreNodeSettings, clock: Clock, memory: StoreMemory, topic_ids: dict[str, str],
                 desired: DesiredAssignment, hosted: HostedReplicas, fetch: ChangelogFetch,
                 retired: RetiredReplicas) -> None:
        self._settings = settings
        self._clock = clock
        self._root = settings.replica_root
        self._memory = memory
        self._topic_ids = topic_ids
        self._desired = desired
        self._hosted = hosted
        self._fetch = fetch
        self._retired = retired
        self._failed: set[ReplicaKey] = set()
        self._retry_at = 0.0
        self._moved: dict[ReplicaKey, float] = {}  # replicas moved away, serving until then (monotonic)
        self.assignment_applied = False  # the node has followed an assignment at least once

    def follow(self) -> None:
        """Open, remove or change the role of replicas to match the desired assignment, if it changed."""
        changed, wanted = self._desired.take()
        if not changed and not (self._failed and time.monotonic() >= self._retry_at):
            return
        self._failed.clear()
        for key in [k for k in self._hosted.keys() if k not in wanted and k not in self._moved]:
            self._move_away(key)
        opened: list[Replica] = []
        for key, (spec, role) in wanted.items():
            rep = self._hosted.get(key)
            if self._moved.pop(key, None) is not None and rep is not None:
                log.info("replica %s/%d: placed here again while it still served", rep.table, rep.partition)
            if rep is not None and rep.topic != spec.topic:
                self._remove(key)
                rep = None
            if rep is None:
                try:
                    opened.append(self._open(spec, key[1], role))
                except DiskFull as e:
                    # Hosted FAILED, its reason reported, and opened again later (ReplicaResets.follow_failure).
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
        self._hosted.publish()
        self.assignment_applied = True

    def end_moved(self, mono: float) -> None:
        """Stop serving the replicas moved away whose time to serve on is over."""
        for key in [k for k, until in self._moved.items() if mono >= until]:
            del self._moved[key]
            if key in self._hosted:
                self._remove(key)

    def retry_later(self, key: ReplicaKey) -> None:
        """Open the replica again at a later follow(), after the retry delay."""
        self._failed.add(key)
        self._retry_at = time.monotonic() + _RETRY_S

    def close(self) -> None:
        """The stores are closing: no replica serves on."""
        self._moved.clear()

    # --- inside ------------------------------------------------------------------------------------

    def _open(self, spec: TableSpec, partition: int, role: Role) -> Replica:
        """A replica over its opened store (its changelog not fetched yet)."""
        store, wiped = ReplicaStore.open_or_wipe(replica_path(self._root, spec.name, partition), self._memory)
        if wiped is not None:
            log.warning("replica %s/%d: local store was unreadable (%s); wiped it, it restores from the changelog",
                        spec.name, partition, wiped)
        rep = self._replica(spec, partition, role, store)
        try:
            known_id = self._topic_ids.get(spec.topic)
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
            self._fetch.start(opened)
        except Exception as e:
            for rep in opened:
                self._fetch.cancel_bulk(rep)
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

    def _replica(self, spec: TableSpec, partition: int, role: Role, store: ReplicaStore | None,
                 failure: str | None = None) -> Replica:
        s = self._settings
        return Replica(spec, partition, role, store, self._clock, s.evidence_window_ms, s.caught_up_threshold, failure)

    def _host(self, rep: Replica) -> None:
        self._hosted.add(rep)
        self._retired.discard(rep.key)

    def _open_failed(self, key: ReplicaKey, e: BaseException) -> None:
        log.error("cannot open replica %s/%d: %s; retrying", key[0], key[1], e)
        self.retry_later(key)

    def _move_away(self, key: ReplicaKey) -> None:
        """The assignment placed ``key`` elsewhere: a caught-up replica serves on as a standby for a while; one still
        restoring (or failed) has nothing to answer with and stops at once."""
        serve_ms = self._settings.moved_replica_serve_ms
        rep = self._hosted[key]
        if serve_ms <= 0 or rep.store is None or rep.failure is not None or rep.state is ReplicaState.RESTORING:
            self._remove(key)
            return
        self._moved[key] = time.monotonic() + serve_ms / 1000
        rep.role = Role.STANDBY
        log.info("replica %s/%d: no longer assigned here; it serves on as a standby for %.0fs while the replicas "
                 "placed elsewhere restore", rep.table, rep.partition, serve_ms / 1000)

    def _remove(self, key: ReplicaKey) -> None:
        self._moved.pop(key, None)
        rep = self._hosted.drop(key)  # reads stop before its store closes
        self._fetch.stop(rep)
        rep.close()
        self._retired.retire(rep)

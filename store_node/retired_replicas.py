"""The files of replicas no longer hosted: kept for a grace period in case the replica comes back, then deleted.

A replica removed from the node leaves its store's files behind, and so does every replica found on disk when the
node starts: placed here again within ``removed_replica_grace_ms``, it resumes from them instead of restoring.
"""

from __future__ import annotations

import logging
import time
from typing import Callable
from urllib.parse import unquote

from store_node.hosted_replicas import HostedReplicas, ReplicaKey
from store_node.replica import Replica, replica_path
from store_node.replica_store import ReplicaStore
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)

# Retired replica files are deleted only while the assignment is known to be current.
_ASSIGNMENT_FRESH_S = 5.0


class RetiredReplicas:
    """Replicas whose files are kept until a deadline (monotonic), deleted after it unless hosted again."""

    def __init__(self, settings: StoreNodeSettings, hosted: HostedReplicas,
                 assignment_read_at: Callable[[], float]) -> None:
        self._settings = settings
        self._root = settings.replica_root
        self._hosted = hosted
        self._assignment_read_at = assignment_read_at
        self._retired: dict[ReplicaKey, float] = {}

    def find_on_disk(self) -> None:
        """Retire the replicas left on disk by an earlier run: none is hosted yet."""
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

    def retire(self, rep: Replica) -> None:
        """Keep the files of ``rep``, just removed, for the grace period."""
        grace_ms = self._settings.removed_replica_grace_ms
        self._retired[rep.key] = time.monotonic() + grace_ms / 1000
        log.info("replica %s/%d: no longer assigned here; its files are kept %.0fs in case it returns",
                 rep.table, rep.partition, grace_ms / 1000)

    def discard(self, key: ReplicaKey) -> None:
        """The replica at ``key`` is hosted again: its files are its store's."""
        self._retired.pop(key, None)

    def delete_due(self, mono: float) -> None:
        """Delete the files of replicas not assigned here for the grace period."""
        if not self._retired:
            return
        read_at = self._assignment_read_at()
        if not (mono - read_at <= _ASSIGNMENT_FRESH_S and read_at > 0):
            return  # never delete on an outdated view of the assignment
        for key, deadline in list(self._retired.items()):
            if mono < deadline or key in self._hosted:
                continue
            del self._retired[key]
            path = replica_path(self._root, *key)
            ReplicaStore.destroy(path)
            try:
                path.parent.rmdir()  # the table's directory, once its last partition is gone
            except OSError:
                pass
            log.info("replica %s/%d: deleted its files (not assigned here for the grace period)", *key)

"""Replicas restored again from the start of their changelog.

A replica whose changelog or store can no longer be trusted is wiped and restored from the start. One whose store
cannot be written (a full disk) is FAILED: stopped at once, its files deleted, and restored from the start again
``FAILED_RETRY_S`` later, when space may have been freed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from freshroute.errors import StoreCorrupt
from store_node.changelog_fetch import ChangelogFetch
from store_node.hosted_replicas import HostedReplicas, ReplicaKey
from store_node.replica import Replica, replica_path
from store_node.replica_store import DiskFull, ReplicaStore, StoreMemory

log = logging.getLogger(__name__)

# A replica FAILED for want of disk tries again this long after (space may have been freed meanwhile).
FAILED_RETRY_S = 60.0


class ReplicaResets:
    """Wipes hosted replicas and restores them from the start; stops FAILED ones and tries them again later."""

    def __init__(self, root: Path, memory: StoreMemory, hosted: HostedReplicas, fetch: ChangelogFetch,
                 retry_later: Callable[[ReplicaKey], None]) -> None:
        self._root = root
        self._memory = memory
        self._hosted = hosted
        self._fetch = fetch
        self._retry_later = retry_later  # the assignment follower opens a dropped replica again, later

    def reset(self, rep: Replica, reason: str) -> None:
        """Wipe a replica and restore it from the start of its changelog."""
        if self._hosted.get(rep.key) is not rep:
            return
        log.warning("replica %s/%d: %s; wiping it and restoring from the start of the changelog (applied was %d)",
                    rep.table, rep.partition, reason, rep.lag.applied)
        self._fetch.stop(rep)
        try:
            rep.wipe(self._root, self._memory)
        except DiskFull as e:
            rep.mark_failed(e.message)  # still FAILED; tries again later
            return
        except StoreCorrupt as e:
            # The directory cannot even be recreated (disk?): drop the replica and let follow() retry.
            log.error("replica %s/%d: cannot recreate its store: %s", rep.table, rep.partition, e.message)
            self._hosted.drop(rep.key)
            self._retry_later(rep.key)
            return
        self._fetch.start([rep])  # from the start: the store is empty

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
        self._fetch.stop(rep)
        rep.close()
        rep.lag.reset()
        ReplicaStore.destroy(replica_path(self._root, rep.table, rep.partition))

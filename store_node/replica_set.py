"""The replicas a node hosts, as the changelog tailer and its parts act on them.

:class:`ReplicaSet` composes the parts of hosting a replica and binds their calls:

- :class:`~store_node.hosted_replicas.HostedReplicas`: the set hosted now, and the copy of it that reads take;
- :class:`~store_node.assignment_follower.AssignmentFollower`: replicas opened when the assignment places them here,
  moved away (serving on as standbys for a while) and removed when it places them elsewhere;
- :class:`~store_node.changelog_fetch.ChangelogFetch`: from where each one's changelog is fetched (explicit offsets,
  no consumer-group rebalancing, no commits);
- :class:`~store_node.replica_resets.ReplicaResets`: a replica whose changelog cannot be trusted any more wiped and
  restored from the start; one whose disk is full FAILED, and tried again later;
- :class:`~store_node.retired_replicas.RetiredReplicas`: the files of replicas removed (or found on disk at start)
  kept for a grace period, in case they come back, then deleted.
"""

from __future__ import annotations

from typing import Any, Mapping

from store_node.assignment_follower import AssignmentFollower, DesiredAssignment
from store_node.bulk_restore import BulkRestores
from store_node.changelog_fetch import ChangelogFetch
from store_node.hosted_replicas import HostedReplicas, ReplicaKey
from store_node.replica import Clock, Replica
from store_node.replica_resets import ReplicaResets
from store_node.replica_store import StoreMemory
from store_node.retired_replicas import RetiredReplicas
from store_node.settings import StoreNodeSettings


class ReplicaSet:
    """Every replica this node hosts, changed only on the tailer's thread; ``serving`` is read anywhere.

    The tailer's rounds, the applier and the end-offset watcher call the parts through it: ``set_desired`` (from
    any thread), ``follow`` and ``end_moved`` (the assignment follower), ``reset``, ``follow_failure`` (the
    resets), ``reread`` (the fetch), ``delete_retired``, and ``get``, ``hosted`` and ``by_tp`` (the hosted set).
    """

    def __init__(self, settings: StoreNodeSettings, clock: Clock, bulk: BulkRestores | None = None) -> None:
        memory = StoreMemory(settings.block_cache_mb)
        # The id of each changelog topic when last described; rows from another id are wiped.
        self.topic_ids: dict[str, str] = {}
        self._hosted = HostedReplicas()
        self._fetch = ChangelogFetch(bulk)
        self._desired = DesiredAssignment()
        self._retired = RetiredReplicas(settings, self._hosted, self._desired.read_at)
        self._follower = AssignmentFollower(settings, clock, memory, self.topic_ids, self._desired, self._hosted,
                                            self._fetch, self._retired)
        self._resets = ReplicaResets(settings.replica_root, memory, self._hosted, self._fetch,
                                     self._follower.retry_later)
        # The parts' calls bound once, so a round (and the applier's records) cost no call more than before the split.
        self.by_tp = self._hosted.by_tp  # the same dict: emptied in place, never replaced
        self.get = self._hosted.get
        self.hosted = self._hosted.hosted
        self.set_desired = self._desired.set
        self.follow = self._follower.follow
        self.end_moved = self._follower.end_moved
        self.reset = self._resets.reset
        self.follow_failure = self._resets.follow_failure
        self.reread = self._fetch.reread
        self.delete_retired = self._retired.delete_due

    @property
    def serving(self) -> Mapping[ReplicaKey, Replica]:
        """The hosted replicas, for reads from any thread: an immutable snapshot, swapped on every change."""
        return self._hosted.serving

    @property
    def assignment_applied(self) -> bool:
        """Whether the node has followed an assignment at least once."""
        return self._follower.assignment_applied

    def open(self, consumer: Any) -> None:
        """Fetch changelogs with ``consumer`` from now on; replicas left on disk are retired."""
        self._fetch.open(consumer)
        self._retired.find_on_disk()

    def close(self) -> int:
        """Close every replica's store, after writing what a restore has staged; returns how many."""
        self._follower.close()
        return self._hosted.close()

    def follow_on(self, rep: Replica) -> None:
        """Fetch by the consumer, from its checkpoint, the changelog of a replica its bulk restore read to the end."""
        if self._hosted.get(rep.key) is rep:
            self._fetch.resume(rep)

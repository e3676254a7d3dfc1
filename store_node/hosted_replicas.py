"""The set of replicas a node hosts, and the snapshot of it that reads take.

Only the changelog tailer's thread changes the set. The event loop reads :attr:`HostedReplicas.serving`, an
immutable copy swapped whole when the set changes, so a lookup never sees a change half made.
"""

from __future__ import annotations

import logging
from types import MappingProxyType
from typing import KeysView, Mapping

from store_node.replica import Replica

log = logging.getLogger(__name__)

ReplicaKey = tuple[str, int]  # (table, partition)


class HostedReplicas:
    """The replicas hosted now, by key and by changelog partition, and the published copy that reads use."""

    def __init__(self) -> None:
        self._replicas: dict[ReplicaKey, Replica] = {}
        # The applier's way from a record's (topic, partition) to its replica: emptied in place, never replaced,
        # because the ReplicaSet hands this same dict on.
        self.by_tp: dict[tuple[str, int], Replica] = {}
        # What the event loop reads: swapped whole, never mutated in place.
        self.serving: Mapping[ReplicaKey, Replica] = MappingProxyType({})

    def __contains__(self, key: ReplicaKey) -> bool:
        return key in self._replicas

    def __getitem__(self, key: ReplicaKey) -> Replica:
        return self._replicas[key]

    def get(self, key: ReplicaKey) -> Replica | None:
        return self._replicas.get(key)

    def keys(self) -> KeysView[ReplicaKey]:
        return self._replicas.keys()

    def hosted(self) -> list[Replica]:
        """The replicas hosted now, as a list: acting on one may remove it."""
        return list(self._replicas.values())

    def add(self, rep: Replica) -> None:
        """Host ``rep``; reads see it once :meth:`publish` is called (after the whole change)."""
        self._replicas[rep.key] = rep
        self.by_tp[(rep.topic, rep.partition)] = rep

    def drop(self, key: ReplicaKey) -> Replica:
        """Stop hosting the replica at ``key``, published at once: reads stop before its store is closed."""
        rep = self._replicas.pop(key)
        self.by_tp.pop((rep.topic, rep.partition), None)
        self.publish()
        return rep

    def publish(self) -> None:
        self.serving = MappingProxyType(dict(self._replicas))

    def close(self) -> int:
        """Close every replica's store, after writing what a restore has staged; returns how many."""
        for rep in list(self._replicas.values()):
            try:
                rep.write_staged()  # a restart resumes after what was read, not before
                rep.close()
            except Exception:
                log.exception("closing replica %s/%d failed", rep.table, rep.partition)
        self.serving = MappingProxyType({})
        closed = len(self._replicas)
        self._replicas.clear()
        self.by_tp.clear()
        return closed

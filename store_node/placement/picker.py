"""Step 4 of the assignment: which node takes a new replica of a partition, or one moved off a node above its
quota — without looking at every node for every replica."""

from __future__ import annotations

import functools
import heapq
import zlib
from typing import Callable, Mapping

from store_node.placement.lags import COLD, ReplicaKey, ReportedLags


def _shuffle(node: str, level: int) -> int:
    """A tie-break among equally loaded nodes that differs at every load level: placing by node id
    would give the replicas of one node's actives to the same few nodes, and its death would then
    make those few the active of all of them."""
    return zlib.crc32(f"{node}/{level}".encode())


class Picker:
    """Step 4's choice of a node for a new replica, without looking at every node for every replica.

    The choice is the minimum of a sort key over the candidate nodes: below quota first; then,
    for an active, the fewest actives of the partition's table and in all, for a standby, a new
    rack and the least loaded; then the replica's freshness on that node; then a tie-break.
    Freshness is the same (unknown) on every node that reports no replica of the partition, so
    those wait in heaps ordered by the rest of the key (one per table for actives, one per rack
    for standbys), and the few nodes that do report the partition are judged one by one.
    Counts only grow while step 4 runs, so an entry whose node's counts have changed since it
    was pushed is re-keyed when it comes up rather than updated every time.
    """

    def __init__(self, nodes: list[str], rack: Mapping[str, str | None], lags: ReportedLags, total: dict[str, int],
                 active: dict[str, int], table_active: dict[tuple[str, str], int], quota: Mapping[str, int],
                 active_quota: Mapping[str, int]) -> None:
        self._nodes, self._rack, self._lags = nodes, rack, lags
        self._total, self._active, self._table_active = total, active, table_active
        self._quota, self._active_quota = quota, active_quota
        self._actives: dict[str, list[tuple]] = {}  # by table, made when first needed
        self._standbys: dict[str | None, list[tuple]] = {}
        for n in nodes:
            self._standbys.setdefault(rack[n], []).append(self._standby_key(n))
        for heap in self._standbys.values():
            heapq.heapify(heap)

    def _active_key(self, table: str, n: str) -> tuple:
        active, total = self._active[n], self._total[n]
        return (active >= self._active_quota[n], total >= self._quota[n], self._table_active.get((table, n), 0),
                active, total, n)

    def _standby_key(self, n: str) -> tuple:
        total = self._total[n]
        return (total >= self._quota[n], total, _shuffle(n, total), n)

    @staticmethod
    def _top(heap: list[tuple], current: Callable[[str], tuple], skip: set[str]) -> tuple | None:
        """The heap's least entry, re-keyed where counts changed, whose node is not in ``skip``."""
        aside = []
        top = None
        while heap:
            entry = heap[0]
            now = current(entry[-1])
            if entry != now:
                heapq.heapreplace(heap, now)
            elif entry[-1] in skip:
                aside.append(heapq.heappop(heap))
            else:
                top = entry
                break
        for entry in aside:
            heapq.heappush(heap, entry)
        return top

    def for_active(self, key: ReplicaKey) -> str:
        """The node for a partition's only replica, its active."""
        table = key[0]
        reporting = self._lags.by_key.get(key, {})
        fresh = self._lags.freshness
        current = functools.partial(self._active_key, table)
        options = [(k[0], k[1], fresh(key, n), *k[2:]) for n in reporting if n in self._total for k in [current(n)]]
        heap = self._actives.get(table)
        if heap is None:
            heap = self._actives[table] = [current(n) for n in self._nodes]
            heapq.heapify(heap)
        top = self._top(heap, current, set(reporting))
        if top is not None:
            options.append((top[0], top[1], COLD, *top[2:]))
        best = min(options)[-1]
        self._active[best] += 1
        self._table_active[table, best] = self._table_active.get((table, best), 0) + 1
        self._total[best] += 1
        return best

    def for_standby(self, key: ReplicaKey, ns: list[str]) -> str:
        """The node for one more replica of a partition placed on ``ns``."""
        option = self._best_standby(key, ns)
        assert option is not None, "a partition short of replicas has a node without one"
        best = option[-1]
        self._total[best] += 1
        return best

    def for_move(self, key: ReplicaKey, ns: list[str], leaving: str) -> str | None:
        """The node below its quota to take over ``leaving``'s replica of a partition, if any (counts unchanged)."""
        best = self._best_standby(key, ns, leaving)
        return None if best is None or best[0] else best[-1]

    def _best_standby(self, key: ReplicaKey, ns: list[str], leaving: str | None = None) -> tuple | None:
        rack, fresh = self._rack, self._lags.freshness
        used = {rack[n] for n in ns if n != leaving and rack[n] is not None}
        skip = set(ns) | set(self._lags.by_key.get(key, {}))
        options = [(k[0], rack[n] is not None and rack[n] in used, k[1], fresh(key, n), *k[2:])
                   for n in skip.difference(ns) if n in self._total for k in [self._standby_key(n)]]
        for group, heap in self._standbys.items():
            top = self._top(heap, self._standby_key, skip)
            if top is not None:
                options.append((top[0], group is not None and group in used, top[1], COLD, *top[2:]))
        return min(options, default=None)

"""Who hosts what: a pure assignment function, and the lease-holding loop that publishes it.

Every table-partition gets one active and ``standby_replicas`` standbys on distinct live
nodes (fewer when there are not enough nodes). The assignment is

- sticky: a replica stays where it is while its node lives and the balance allows it;
- balanced: every node's count of replicas, and of actives, is within one of every other's
  (quotas of floor/ceil of the fair share; the extra slots go to the nodes that already hold
  the most, so that balancing moves as little as possible); and, as far as warm standbys
  allow, so is every node's count of each table's actives, so that a node's death costs every
  table its share and no more;
- warm: an active moves only to a caught-up standby (like Kafka Streams' warm-up replicas),
  except when the active's node is gone — then the most caught-up surviving replica takes
  over at once, by the lag the nodes report;
- rack-aware: replicas of one partition go to different racks when the quotas allow.

The loop runs on every node; only the holder of the assignor lease (a Redis key with a
fencing generation) computes and writes, through a write that fails once the lease is lost.
"""

from __future__ import annotations

import bisect
import functools
import gc
import heapq
import logging
import zlib
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Container, Iterable, Iterator, Mapping, Protocol

from freshroute.lag import rank_lag
from freshroute.heartbeats import Liveness, NodeFeed, Rejections
from freshroute.metadata.assignment import Assignment
from freshroute.metadata.reports import NodeReport, ReplicaReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.rounds import UNREAD
from freshroute.metadata.tables import TableSpec

log = logging.getLogger(__name__)

ReplicaKey = tuple[str, int]
_COLD = (2, float("inf"), float("inf"))
_RESTORING = ReplicaState.RESTORING


class _Lags:
    """Per (table-partition, node): what that node reports about its replica."""

    __slots__ = ("by_key", "_warm")

    def __init__(self, by_key: Mapping[ReplicaKey, Mapping[str, ReplicaReport]], threshold: int) -> None:
        self.by_key = by_key
        # Judged once: every step of an assignment asks about warmth, tens of thousands of times.
        self._warm = {(key, node) for key, reports in by_key.items() for node, r in reports.items()
                      if r.state is not _RESTORING and r.within(threshold)}

    def freshness(self, key: ReplicaKey, node: str) -> tuple:
        """Sort key, most caught-up first: serving replicas, then restoring ones, then unknown."""
        reports = self.by_key.get(key)
        r = reports.get(node) if reports is not None else None
        if r is None:
            return _COLD
        return (1 if r.state is _RESTORING else 0, rank_lag(r.lag.offsets), r.staleness_ms)

    def warm(self, key: ReplicaKey, node: str) -> bool:
        return (key, node) in self._warm


def _quotas(total: int, nodes: list[str], current: Mapping[str, int]) -> dict[str, int]:
    """floor(total/n) each, +1 for ``total % n`` nodes: those already holding the most (then by id)."""
    base, extra = divmod(total, len(nodes))
    ranked = sorted(nodes, key=lambda n: (-current.get(n, 0), n))
    return {n: base + (1 if i < extra else 0) for i, n in enumerate(ranked)}


def _previous_from_reports(reports: Iterable[NodeReport], lags: _Lags) -> dict[ReplicaKey, tuple[str, ...]]:
    """Rebuild placements from what nodes say they host (the stored assignment was lost with Redis)."""
    holders: dict[ReplicaKey, list[tuple[bool, str]]] = {}
    for report in reports:
        for r in report.replicas:
            holders.setdefault((r.table, r.partition), []).append((r.role is Role.ACTIVE, report.node_id))
    out = {}
    for key, hs in holders.items():
        ordered = sorted(hs, key=lambda h: (not h[0], lags.freshness(key, h[1]), h[1]))
        out[key] = tuple(n for _, n in ordered)
    return out


def assign(tables: Mapping[str, TableSpec], live_nodes: Iterable[NodeReport], previous: Assignment | None,
           generation: int, caught_up_threshold: int = 100) -> Assignment:
    """Place one active and ``standby_replicas`` standbys of every table-partition on live nodes."""
    reports = {n.node_id: n for n in live_nodes if not n.draining}
    nodes = sorted(reports)
    if not nodes:
        return Assignment(generation, {})
    rack = {n: reports[n].rack for n in nodes}
    lags = _lags_of(reports.values(), caught_up_threshold)
    keys = _keys(tables)
    want = _wanted(tables, keys, len(nodes))
    prev = previous.replicas if previous is not None else _previous_from_reports(reports.values(), lags)

    # 1. Keep what is still on live nodes. A dead active's partition goes to its most caught-up survivor.
    placement: dict[ReplicaKey, list[str]] = {}
    for key in keys:
        placement[key] = _survivors(key, list(dict.fromkeys(prev.get(key, ()))), reports, lags)

    def promote_freshest(key: ReplicaKey) -> None:
        ns = placement[key]
        if ns:
            # Among equally fresh replicas the longest-standing one (earliest in the list) wins.
            best = min(ns, key=lambda n: (lags.freshness(key, n), ns.index(n)))
            ns.remove(best)
            ns.insert(0, best)

    # 2. More replicas than wanted (warm-up extras, or standby_replicas lowered): drop the ones on
    #    the busiest nodes, standbys before actives, the coldest first.
    total, _ = _loads(placement, nodes)
    for key in keys:
        ns = placement[key]
        while len(ns) > want[key]:
            victim = max(ns, key=lambda n: (total[n], n != ns[0], lags.freshness(key, n), n))
            was_active = victim == ns[0]
            ns.remove(victim)
            total[victim] -= 1
            if was_active:
                promote_freshest(key)

    # 3. Even out actives among warm replicas first: a demoted active becomes a standby, which
    #    is cheaper to move in step 5.
    _balance_actives(keys, nodes, placement, lags)

    # 4. Fill every partition up to its replica count (new tables, replicas of dead nodes):
    #    below-quota nodes first, a new rack first, then the least loaded; a partition with no
    #    replica left gets its active on the node with the fewest actives.
    total, active = _loads(placement, nodes)
    quota = _quotas(sum(want.values()), nodes, total)
    pick = _fill(placement, want, keys, nodes, rack, lags, total, active, quota)

    # 5. Move replicas from nodes above their quota to nodes below it: standbys first, the
    #    coldest first; then actives, preferring partitions whose warm standby can take over.
    hosted: dict[str, list[ReplicaKey]] = {n: [] for n in nodes}
    for k in keys:
        for n in placement[k]:
            hosted[n].append(k)
    for n in sorted(nodes, key=lambda x: (-(total[x] - quota[x]), x)):
        if total[n] <= quota[n]:
            continue
        standbys = _by_turns(sorted((k for k in hosted[n] if n in placement[k][1:]),
                                    key=lambda k: (lags.freshness(k, n), k), reverse=True))
        actives = sorted((k for k in hosted[n] if placement[k][0] == n),
                         key=lambda k: (not any(lags.warm(k, m) for m in placement[k][1:]), k))
        for k in standbys + actives:
            if total[n] <= quota[n]:
                break
            ns = placement[k]
            m = pick.for_move(k, ns, n)
            if m is None:
                continue
            was_active = ns[0] == n
            ns.remove(n)
            ns.append(m)
            total[n] -= 1
            total[m] += 1
            if was_active:
                promote_freshest(k)

    # 6. Moves may have unbalanced actives again: hand actives to warm standbys, and where no
    #    chain of warm standbys can fix it (partitions without standbys), trade an active for a
    #    standby between the two nodes; step 7 keeps the moved active where it was until its
    #    new replica catches up.
    if not _balance_actives(keys, nodes, placement, lags):
        # Trade only if waiting for the standbys to catch up could never fix it.
        hypothetical = {k: list(ns) for k, ns in placement.items()}
        if not _balance_actives(keys, nodes, hypothetical, lags, warm=lambda k, n: True):
            _trade_actives(keys, nodes, placement)
    _spread_tables(keys, nodes, placement, lags)

    # 7. Warm-up: an active never moves to a replica that has not caught up while a caught-up
    #    one survives. The warm one stays active (an extra replica if the target dropped it) until
    #    the new one catches up; a later round then drops it in step 2.
    for key in keys:
        ns = placement[key]
        before = prev.get(key, ())
        if not ns or lags.warm(key, ns[0]) or (before and ns[0] == before[0]):
            continue  # warm already, or not a move: an active still restoring in place stays active
        warm = [n for n in dict.fromkeys(before) if n in reports and lags.warm(key, n)]
        if warm:
            keeper = min(warm, key=lambda n: (lags.freshness(key, n), n))
            if keeper in ns:
                ns.remove(keeper)
            ns.insert(0, keeper)
    return Assignment(generation, {k: tuple(ns) for k, ns in placement.items() if ns})


def repair(tables: Mapping[str, TableSpec], live_nodes: Iterable[NodeReport], previous: Assignment,
           generation: int, caught_up_threshold: int = 100) -> Assignment | None:
    """The urgent part of losing nodes, at a fraction of :func:`assign`'s cost: the dead nodes'
    replicas dropped, a dead active's partition handed to its freshest survivor, and the
    partitions refilled as step 4 of :func:`assign` would; nothing else moves. None when no
    placed node died, or when the cluster changed in another way too (a draining node, other
    tables): :func:`assign` then does all of it. The next :func:`assign` evens out what this
    leaves uneven, by hand-overs rather than by moving data."""
    live = list(live_nodes)
    reports = {n.node_id: n for n in live}
    keys = _keys(tables)
    if any(n.draining for n in live) or not reports or previous.replicas.keys() != set(keys):
        return None
    dead = {n for ns in previous.replicas.values() for n in ns if n not in reports}
    if not dead:
        return None
    affected = {k: ns for k, ns in previous.replicas.items() if not dead.isdisjoint(ns)}
    nodes = sorted(reports)
    lags = _lags_of(live, caught_up_threshold, only=affected)
    want = _wanted(tables, keys, len(nodes))
    placement = {k: list(ns) for k, ns in previous.replicas.items()}
    for k, ns in affected.items():
        placement[k] = _survivors(k, ns, reports, lags)
    total, active = _loads(placement, nodes)
    quota = _quotas(sum(want.values()), nodes, total)
    pick = _fill(placement, want, sorted(affected), nodes, {n: reports[n].rack for n in nodes}, lags, total, active,
                 quota)
    # Filling partition by partition can leave a node over its quota while another that already
    # holds those partitions is under it: the new replicas, cold anyway, move before they restore.
    for k, before in affected.items():
        ns = placement[k]
        for n in [n for n in ns if n not in before and total[n] > quota[n]]:
            m = pick.for_move(k, ns, n)
            if m is not None:
                ns[ns.index(n)] = m
                total[n] -= 1
                total[m] += 1
    return Assignment(generation, {k: tuple(ns) if k in affected else previous.replicas[k]
                                   for k, ns in placement.items() if ns})


def _by_turns(keys: list[ReplicaKey]) -> list[ReplicaKey]:
    """``keys`` a table at a time in turn (each table's in the order given, the table with the most first), so that
    the replicas moved off a node are every table's share of them, not all of one table's: a node that came back
    empty then holds every table, and each table's actives can spread to it (``_spread_tables``)."""
    by_table: dict[str, list[ReplicaKey]] = {}
    for k in keys:
        by_table.setdefault(k[0], []).append(k)
    queues = sorted(by_table.values(), key=lambda ks: (-len(ks), ks[0][0]))
    return [ks[i] for i in range(max(map(len, queues), default=0)) for ks in queues if i < len(ks)]


def _keys(tables: Mapping[str, TableSpec]) -> list[ReplicaKey]:
    return sorted((t, p) for t, spec in tables.items() for p in range(spec.partitions))


def _wanted(tables: Mapping[str, TableSpec], keys: list[ReplicaKey], nodes: int) -> dict[ReplicaKey, int]:
    """Each partition's replica count: an active and its standbys, at most one per node."""
    return {(t, p): min(1 + max(0, tables[t].standby_replicas), nodes) for t, p in keys}


def _survivors(key: ReplicaKey, before: list[str], alive: Container[str], lags: "_Lags") -> list[str]:
    """A partition's replicas on live nodes; if its active died, its most caught-up survivor first."""
    kept = [n for n in before if n in alive]
    if kept and before[0] not in alive:
        kept.sort(key=lambda n: (lags.freshness(key, n), n))
    return kept


def _loads(placement: Mapping[ReplicaKey, list[str]], nodes: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Each node's (replicas, actives)."""
    total = {n: 0 for n in nodes}
    active = {n: 0 for n in nodes}
    for ns in placement.values():
        for n in ns:
            total[n] += 1
        if ns:
            active[ns[0]] += 1
    return total, active


def _lags_of(reports: Iterable[NodeReport], caught_up_threshold: int,
             only: Container[ReplicaKey] | None = None) -> "_Lags":
    """What the nodes report about each partition's replicas (or only these partitions')."""
    by_key: dict[ReplicaKey, dict[str, ReplicaReport]] = {}
    for report in reports:
        for r in report.replicas:
            key = (r.table, r.partition)
            if only is None or key in only:
                by_key.setdefault(key, {})[report.node_id] = r
    return _Lags(by_key, caught_up_threshold)


def _fill(placement: dict[ReplicaKey, list[str]], want: Mapping[ReplicaKey, int], keys: list[ReplicaKey],
          nodes: list[str], rack: Mapping[str, str | None], lags: "_Lags", total: dict[str, int],
          active: dict[str, int], quota: Mapping[str, int]) -> "_Picker":
    """Fill the partitions among ``keys`` that are short of replicas; returns the picker it used (it
    keeps the counts up to date). Quotas count every partition ``want`` names."""
    active_quota = _quotas(len(want), nodes, active)
    table_active: dict[tuple[str, str], int] = {}
    for k, ns in placement.items():
        if ns:
            table_active[k[0], ns[0]] = table_active.get((k[0], ns[0]), 0) + 1
    pick = _Picker(nodes, rack, lags, total, active, table_active, quota, active_quota)
    for key in sorted((k for k in keys if len(placement[k]) < want[k]), key=lambda k: (len(placement[k]), k)):
        ns = placement[key]
        while len(ns) < want[key]:
            ns.append(pick.for_active(key) if not ns else pick.for_standby(key, ns))
    return pick


def _shuffle(node: str, level: int) -> int:
    """A tie-break among equally loaded nodes that differs at every load level: placing by node id
    would give the replicas of one node's actives to the same few nodes, and its death would then
    make those few the active of all of them."""
    return zlib.crc32(f"{node}/{level}".encode())


class _Picker:
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

    def __init__(self, nodes: list[str], rack: Mapping[str, str | None], lags: _Lags, total: dict[str, int],
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
            options.append((top[0], top[1], _COLD, *top[2:]))
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
                options.append((top[0], group is not None and group in used, top[1], _COLD, *top[2:]))
        return min(options, default=None)


def _balance_actives(keys: list[ReplicaKey], nodes: list[str], placement: dict[ReplicaKey, list[str]],
                     lags: _Lags, warm: Callable[[ReplicaKey, str], bool] | None = None) -> bool:
    """Hand actives to warm standbys until every node's active count is within one of every other's.

    Returns whether the counts ended within one. ``warm`` overrides which standbys may take over.
    Each round finds shortest chains of hand-overs (x's active to a warm standby on y, y's to
    one on z, …) from nodes with the most actives to nodes with at least two fewer, and shifts
    those that share no node: the ends change by one, the nodes in between keep their count.
    Every shift lowers the sum of squared counts, so the loop ends.
    """
    warm = warm or lags.warm
    active = {n: 0 for n in nodes}
    # Possible hand-overs by giver: (partition, warm standby). Kept up to date by appending
    # after each shift; entries a shift made obsolete are skipped when met.
    hand_over: dict[str, list[tuple[ReplicaKey, str]]] = {n: [] for n in nodes}

    def offer(k: ReplicaKey) -> None:
        ns = placement[k]
        hand_over[ns[0]].extend((k, m) for m in ns[1:] if warm(k, m))

    for k in keys:
        if placement[k]:
            active[placement[k][0]] += 1
            offer(k)
    for _ in range(len(keys) + 1):
        top, low = max(active.values()), min(active.values())
        if top - low <= 1:
            return True
        # One breadth-first search from every node with the most actives finds a shortest chain
        # to each node two or more below; the chains that share no node are shifted together.
        sources = [n for n in nodes if active[n] == top]
        parent: dict[str, tuple[str, ReplicaKey]] = {}
        seen = set(sources)
        queue = deque(sources)
        sinks = []
        while queue:
            x = queue.popleft()
            if active[x] <= top - 2:
                sinks.append(x)
                continue
            for k, y in hand_over[x]:
                if y not in seen and placement[k][0] == x and y in placement[k]:
                    seen.add(y)
                    parent[y] = (x, k)
                    queue.append(y)
        if not sinks:
            return False
        used: set[str] = set()
        for sink in sinks:
            chain = [sink]
            while chain[-1] in parent:
                chain.append(parent[chain[-1]][0])
            if used.intersection(chain):
                continue
            used.update(chain)
            active[sink] += 1
            active[chain[-1]] -= 1
            for y in chain[:-1]:
                x, k = parent[y]
                ns = placement[k]
                ns.remove(y)
                ns.insert(0, y)
                offer(k)
    return False


def _spread_tables(keys: list[ReplicaKey], nodes: list[str], placement: dict[ReplicaKey, list[str]],
                   lags: _Lags) -> None:
    """Spread each table's actives over the nodes, keeping every node's total: hand-overs to warm standbys.

    Balanced totals can still leave one table's actives on few nodes (after a node comes back,
    the hand-overs that even out the totals pick partitions of any table); a node's death then
    costs that table more than its share. Each step hands an active of table t from a node
    holding at least two more of t's actives than another node to a warm standby there, and,
    unless the totals allow that alone, hands back an active of a table the receiver holds more
    of. Every step lowers the sum of squared per-table counts and keeps the totals within one,
    so the loop ends; a step never moves data, only roles.
    """
    tables = sorted({k[0] for k in keys})
    per = {t: {n: 0 for n in nodes} for t in tables}
    total = {n: 0 for n in nodes}
    actives: dict[tuple[str, str], list[ReplicaKey]] = {}  # (table, node) -> its actives, in key order
    for k in keys:
        if placement[k]:
            a = placement[k][0]
            per[k[0]][a] += 1
            total[a] += 1
            actives.setdefault((k[0], a), []).append(k)

    def hand_over(table: str, giver: str, taker: str) -> ReplicaKey | None:
        return next((k for k in actives.get((table, giver), ()) if taker in placement[k][1:]
                     and lags.warm(k, taker)), None)

    def steps() -> Iterator[list[tuple[ReplicaKey, str]]]:
        """Improving steps, as the hand-overs (partition, new active) each makes, each judged on the
        counts as the steps before it left them."""
        for t in tables:
            count = per[t]
            low = min(count.values())
            for a in nodes:
                if count[a] < low + 2:
                    continue
                # The takers are the warm standbys of a's actives of t: a few, not every node.
                for give in list(actives.get((t, a), ())):
                    for b in placement[give][1:]:
                        if placement[give][0] != a or count[a] - count[b] < 2 or not lags.warm(give, b):
                            continue
                        if total[a] > total[b]:
                            yield [(give, b)]
                            break
                        back = next((x for t2 in tables if t2 != t and per[t2][b] > per[t2][a]
                                     for x in [hand_over(t2, b, a)] if x is not None), None)
                        if back is not None:
                            yield [(give, b), (back, a)]
                            break

    for _ in range(len(keys) + 1):
        stepped = False
        for step in steps():
            stepped = True
            for k, n in step:
                t, giver = k[0], placement[k][0]
                placement[k].remove(n)
                placement[k].insert(0, n)
                per[t][giver] -= 1
                per[t][n] += 1
                total[giver] -= 1
                total[n] += 1
                actives[t, giver].remove(k)
                bisect.insort(actives.setdefault((t, n), []), k)
        if not stepped:
            return


def _trade_actives(keys: list[ReplicaKey], nodes: list[str], placement: dict[ReplicaKey, list[str]]) -> None:
    """Move an active from the node with the most to the one with the fewest, and a standby back."""
    for _ in range(len(keys) + 1):
        active = {n: 0 for n in nodes}
        total = {n: 0 for n in nodes}
        for k in keys:
            for i, n in enumerate(placement[k]):
                total[n] += 1
                active[n] += i == 0
        x = min(nodes, key=lambda n: (-active[n], n))
        y = min(nodes, key=lambda n: (active[n], n))
        if active[x] - active[y] <= 1:
            return
        give = next((k for k in keys if placement[k] and placement[k][0] == x and y not in placement[k]), None)
        if give is None:
            return
        take = None
        if total[y] >= total[x]:
            take = next((k for k in keys if y in placement[k][1:] and x not in placement[k]), None)
            if take is None:
                return
        placement[give].remove(x)
        placement[give].insert(0, y)
        if take is not None:
            ns = placement[take]
            ns[ns.index(y)] = x


class AssignorStore(Protocol):
    """The slice of :class:`freshroute.metadata.store.MetadataStore` the assignor loop needs."""

    def try_acquire_assignor(self, node_id: str, lease_ms: int, current: Any = UNREAD) -> int | None: ...
    def versions(self) -> tuple[bytes | None, bytes | None]: ...
    def tables(self) -> dict[str, TableSpec]: ...
    def poll(self, feed: NodeFeed) -> set[str]: ...
    def assignment(self) -> Assignment | None: ...
    def write_assignment(self, assignment: Assignment, node_id: str, generation: int,
                         previous: Assignment | None = None) -> bytes | None: ...
    def forget_nodes(self, node_ids: Iterable[str]) -> None: ...
    def release_assignor(self, node_id: str, generation: int) -> None: ...


class AssignorLoop:
    """Run by every node: takes the lease when it is free; the holder keeps the assignment current.

    A node is dead when it has not been heard from for ``node_expiry_ms``. The holder never
    judges itself (it is running), and never judges others right after it was itself
    stalled (a loaded machine, a paused process): heartbeats it could not read meanwhile
    are not evidence, so after a gap of more than ``stall_ms`` between two steps every node
    gets a full expiry period, counted from the resumption, to be heard from again.

    The holder reads only the reports that changed, and recomputes only when something the
    assignment depends on did: who is live, draining or where, which replicas each node
    hosts in which role and state and whether they are warm, the tables, or the assignment
    itself. A quiet cluster of a thousand nodes costs it a poll, not an assignment.
    """

    def __init__(self, store: AssignorStore, node_id: str, lease_ms: int, node_expiry_ms: int,
                 caught_up_threshold: int, settle_ms: int | None = None, stall_ms: int | None = None,
                 forget_after_ms: int | None = None) -> None:
        self._store = store
        self._node_id = node_id
        self._lease_ms = lease_ms
        self._expiry_ms = node_expiry_ms
        self._threshold = caught_up_threshold
        # With no assignment to start from (a new cluster, or Redis lost it) wait this long after
        # taking the lease, so that every live node has heartbeated: placing everything on the
        # first node seen would move it all again a moment later.
        self._settle_ms = node_expiry_ms if settle_ms is None else settle_ms
        self._stall_ms = max(1, node_expiry_ms // 2) if stall_ms is None else stall_ms
        # Nodes silent this long are removed from the cluster's membership altogether.
        self._forget_after_ms = 4 * node_expiry_ms if forget_after_ms is None else forget_after_ms
        self._acquired_at = 0
        self._last_step_ms: int | None = None
        self._resumed_at = 0
        self.generation: int | None = None
        self.computations = 0  # assignments computed: a quiet cluster adds none
        self.repairs = 0  # repairs published (see repair)
        self.feed = NodeFeed(Rejections(f"assignor on {node_id}"))
        self.liveness = Liveness()
        self._forget()

    def _forget(self) -> None:
        self._tables: tuple[bytes | None, dict[str, TableSpec]] | None = None
        self._previous: tuple[bytes | None, Assignment | None] | None = None
        self._judged: dict[str, tuple] = {}  # node → what the assignment depends on, as last computed
        self._computed_for: tuple | None = None

    def step(self, now_ms: int, lease: Any = UNREAD) -> Assignment | None:
        """Hold or take the lease; if held, recompute and write when the inputs changed. Returns what it wrote.

        ``lease`` is the lease's value if the caller has just read it."""
        last, self._last_step_ms = self._last_step_ms, now_ms
        if last is not None and now_ms - last > self._stall_ms:
            self._resumed_at = now_ms
            log.warning("node %s: membership stalled for %.1fs; no node is declared dead until it has had %.1fs "
                        "to heartbeat", self._node_id, (now_ms - last) / 1000, self._expiry_ms / 1000)
        try:
            return self._step(now_ms, lease)
        except BaseException:
            self.forget()
            raise

    @property
    def assignment_version(self) -> bytes | None:
        """The version of the assignment this loop last read or wrote."""
        return self._previous[0] if self._previous is not None else None

    def live(self, now_ms: int) -> list[NodeReport]:
        """Nodes heard from recently enough (measured from this loop's resumption), and this node."""
        since, heard = self._resumed_at, self.liveness.heard
        return [r for n, r in sorted(self.feed.reports.items())
                if n == self._node_id or (n in heard and now_ms - max(heard[n], since) <= self._expiry_ms)]

    def forget(self) -> None:
        """Redis failed: whatever lease comes back afterwards is a new one (a restarted, empty Redis
        hands out generation numbers from 1 again, and lost the assignment this one was based on)."""
        self.generation = None
        self._forget()

    def _step(self, now_ms: int, lease: Any) -> Assignment | None:
        generation = self._store.try_acquire_assignor(self._node_id, self._lease_ms, lease)
        if generation != self.generation:
            if generation is not None:
                self._acquired_at = now_ms
                log.info("node %s holds the assignor lease (generation %d)", self._node_id, generation)
            elif self.generation is not None:
                log.info("node %s lost the assignor lease (generation %d)", self._node_id, self.generation)
            self.generation = generation
            self._forget()
        if generation is None:
            return None
        tables_version, assignment_version = self._store.versions()
        if self._tables is None or self._tables[0] != tables_version:
            self._tables = (tables_version, self._store.tables())
        tables = self._tables[1]
        if not tables:
            # Nothing registered (yet, or Redis lost it until the pipeline re-registers): an empty
            # assignment would only tell every node to drop its replicas.
            return None
        if self._previous is None or self._previous[0] != assignment_version:
            self._previous = (assignment_version, self._store.assignment())
        previous = self._previous[1]
        if previous is None and now_ms - self._acquired_at < self._settle_ms:
            return None
        self._store.poll(self.feed)
        self.liveness.observe(self.feed.beats, now_ms)
        self._tidy(now_ms)
        live = self.live(now_ms)
        inputs = (tables_version, assignment_version, tuple((r.node_id, self._depends_on(r)) for r in live))
        if inputs == self._computed_for:
            return None
        self._computed_for = inputs
        self.computations += 1
        with _cycle_collection_paused():
            # Nodes died: publish their partitions' promotions and new replicas first, balance next step.
            proposed = repair(tables, live, previous, generation, self._threshold) if previous is not None else None
            repaired = proposed is not None
            if proposed is None:
                proposed = assign(tables, live, previous, generation, self._threshold)
            if previous is not None and previous.replicas == proposed.replicas:
                return None
            version = self._store.write_assignment(proposed, self._node_id, generation, previous)
        if version is None:
            log.info("node %s: assignment write fenced off (generation %d is no longer the lease)",
                     self._node_id, generation)
            self.generation = None
            return None
        self._previous = (version, proposed)
        self._computed_for = None if repaired else (tables_version, version, inputs[2])
        nodes = len({r.node_id for r in live if not r.draining})
        if repaired:
            self.repairs += 1
            log.info("assignment generation %d: dead nodes' partitions repaired, %d replica placements changed%s",
                     generation, _moves(previous, proposed),
                     _membership_change(previous, live, self.feed.reports, self.liveness, now_ms))
        elif previous is None:
            log.info("assignment generation %d: %d table-partitions on %d live nodes (no previous assignment: "
                     "built from what the nodes report hosting)", generation, len(proposed.replicas), nodes)
        else:
            log.info("assignment generation %d: %d table-partitions on %d live nodes; %d replica placements changed%s",
                     generation, len(proposed.replicas), nodes, _moves(previous, proposed),
                     _membership_change(previous, live, self.feed.reports, self.liveness, now_ms))
        return proposed

    def _depends_on(self, report: NodeReport) -> tuple:
        """What the assignment reads from a node's report: not its positions, only roles, states and warmth."""
        judged = self._judged.get(report.node_id)
        if judged is not None and judged[0] is report:
            return judged[1]
        threshold = self._threshold
        key = (report.draining, report.rack,
               tuple((r.table, r.partition, r.role, r.state, r.within(threshold)) for r in report.replicas))
        self._judged[report.node_id] = (report, key)
        return key

    def _tidy(self, now_ms: int) -> None:
        """Remove nodes silent for longer than any heartbeat lives: they are gone, not just dead."""
        since = max(self._resumed_at, self._acquired_at)
        gone = [n for n, heard in self.liveness.heard.items()
                if n != self._node_id and now_ms - max(heard, since) > self._forget_after_ms]
        if gone:
            self._store.forget_nodes(gone)
            for n in gone:
                self._judged.pop(n, None)

    def release(self) -> None:
        if self.generation is not None:
            self._store.release_assignor(self._node_id, self.generation)
            self.generation = None


@contextmanager
def _cycle_collection_paused() -> Iterator[None]:
    """No cycle collection while an assignment is computed: it allocates hundreds of thousands of
    objects that reference counting frees, and at a thousand nodes each full collection it would
    trigger walks the node's whole heap (tens of ms) while dead nodes' actives wait."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _membership_change(previous: Assignment, live: list[NodeReport], reports: Mapping[str, NodeReport],
                       liveness: Liveness, now_ms: int) -> str:
    """Why placements changed, for the operator: nodes that joined, and nodes that left and why."""
    serving = {r.node_id for r in live if not r.draining}
    before = {n for ns in previous.replicas.values() for n in ns}
    parts = []
    joined = sorted(serving - before)
    if joined:
        parts.append("joined: " + ", ".join(joined))
    left = []
    for n in sorted(before - serving):
        r = reports.get(n)
        if r is None:
            left.append(f"{n} (left the cluster)")
        elif r.draining:
            left.append(f"{n} (draining)")
        else:
            left.append(f"{n} (dead: last heartbeat {(liveness.age(n, now_ms) or 0) / 1000:.1f}s ago)")
    if left:
        parts.append("left: " + ", ".join(left))
    return "; " + "; ".join(parts) if parts else ""


def _moves(before: Assignment | None, after: Assignment) -> int:
    """Replica placements (partition, node, role) that differ between two assignments."""
    b = before.replicas if before is not None else {}
    moves = 0
    for k in after.differing(before):
        x, y = b.get(k, ()), after.replicas.get(k, ())
        moves += len({(n, i == 0) for i, n in enumerate(x)} ^ {(n, i == 0) for i, n in enumerate(y)})
    return moves

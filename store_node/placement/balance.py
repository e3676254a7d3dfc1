"""Evening out the actives of a placement: hand-overs to warm standbys, which move no data, until every node's count
of actives, and of each table's actives, is within one of every other's; and, where no chain of hand-overs can ever
do it, trades of an active for a standby between two nodes."""

from __future__ import annotations

import bisect
from collections import deque
from typing import Callable, Iterator

from store_node.placement.lags import ReplicaKey, ReportedLags


def balance_actives(keys: list[ReplicaKey], nodes: list[str], placement: dict[ReplicaKey, list[str]],
                    lags: ReportedLags, warm: Callable[[ReplicaKey, str], bool] | None = None) -> bool:
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


def spread_tables(keys: list[ReplicaKey], nodes: list[str], placement: dict[ReplicaKey, list[str]],
                  lags: ReportedLags) -> None:
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


def trade_actives(keys: list[ReplicaKey], nodes: list[str], placement: dict[ReplicaKey, list[str]]) -> None:
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

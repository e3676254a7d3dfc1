"""Who hosts what: the pure assignment function, and its urgent part when nodes die (repair).

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

The assignor loop (store_node/assignor.py) runs them under the assignor lease and publishes what they return.
"""

from __future__ import annotations

from typing import Container, Iterable, Mapping

from freshroute.metadata.assignment import Assignment
from freshroute.metadata.reports import NodeReport
from freshroute.metadata.roles import Role
from freshroute.metadata.tables import TableSpec
from store_node.placement.balance import balance_actives, spread_tables, trade_actives
from store_node.placement.lags import ReplicaKey, ReportedLags, lags_of
from store_node.placement.picker import Picker


def _quotas(total: int, nodes: list[str], current: Mapping[str, int]) -> dict[str, int]:
    """floor(total/n) each, +1 for ``total % n`` nodes: those already holding the most (then by id)."""
    base, extra = divmod(total, len(nodes))
    ranked = sorted(nodes, key=lambda n: (-current.get(n, 0), n))
    return {n: base + (1 if i < extra else 0) for i, n in enumerate(ranked)}


def _previous_from_reports(reports: Iterable[NodeReport],
                           lags: ReportedLags) -> dict[ReplicaKey, tuple[str, ...]]:
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
    lags = lags_of(reports.values(), caught_up_threshold)
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
    balance_actives(keys, nodes, placement, lags)

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
    if not balance_actives(keys, nodes, placement, lags):
        # Trade only if waiting for the standbys to catch up could never fix it.
        hypothetical = {k: list(ns) for k, ns in placement.items()}
        if not balance_actives(keys, nodes, hypothetical, lags, warm=lambda k, n: True):
            trade_actives(keys, nodes, placement)
    spread_tables(keys, nodes, placement, lags)

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
    lags = lags_of(live, caught_up_threshold, only=affected)
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
    empty then holds every table, and each table's actives can spread to it (``spread_tables``)."""
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


def _survivors(key: ReplicaKey, before: list[str], alive: Container[str], lags: ReportedLags) -> list[str]:
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


def _fill(placement: dict[ReplicaKey, list[str]], want: Mapping[ReplicaKey, int], keys: list[ReplicaKey],
          nodes: list[str], rack: Mapping[str, str | None], lags: ReportedLags, total: dict[str, int],
          active: dict[str, int], quota: Mapping[str, int]) -> Picker:
    """Fill the partitions among ``keys`` that are short of replicas; returns the picker it used (it
    keeps the counts up to date). Quotas count every partition ``want`` names."""
    active_quota = _quotas(len(want), nodes, active)
    table_active: dict[tuple[str, str], int] = {}
    for k, ns in placement.items():
        if ns:
            table_active[k[0], ns[0]] = table_active.get((k[0], ns[0]), 0) + 1
    pick = Picker(nodes, rack, lags, total, active, table_active, quota, active_quota)
    for key in sorted((k for k in keys if len(placement[k]) < want[k]), key=lambda k: (len(placement[k]), k)):
        ns = placement[key]
        while len(ns) < want[key]:
            ns.append(pick.for_active(key) if not ns else pick.for_standby(key, ns))
    return pick

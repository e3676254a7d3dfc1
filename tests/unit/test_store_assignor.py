import logging
import random
from collections import Counter
from dataclasses import replace

import pytest

from freshroute.metadata.assignment import Assignment
from freshroute.metadata.reports import NodeReport, ReplicaReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.tables import TableSpec
from store_node.assignor import AssignorLoop
from store_node.placement.assign import assign, repair


def spec(name="t", partitions=8, standby=1) -> TableSpec:
    return TableSpec(name, f"{name}.changelog", partitions, "k", standby_replicas=standby)


def node(node_id, rack=None, replicas=(), draining=False) -> NodeReport:
    return NodeReport(node_id, f"127.0.0.1:{abs(hash(node_id)) % 1000 + 7000}", 0, tuple(replicas), rack, draining)


def reports_for(assignment: Assignment, lag: dict | None = None, state=None) -> list[NodeReport]:
    """Node reports as the nodes would publish them under ``assignment``, all warm unless lag says otherwise."""
    lag = lag or {}
    by_node: dict[str, list[ReplicaReport]] = {}
    for (t, p), ns in assignment.replicas.items():
        for i, n in enumerate(ns):
            behind = lag.get((t, p, n), 0)
            role = Role.ACTIVE if i == 0 else Role.STANDBY
            st = state or (ReplicaState.ACTIVE if i == 0 else ReplicaState.STANDBY)
            by_node.setdefault(n, []).append(ReplicaReport(t, p, role, st, 1000 - behind, 1000, behind))
    return [node(n, replicas=r) for n, r in sorted(by_node.items())]


def with_nodes(reports: list[NodeReport], ids: list[str]) -> list[NodeReport]:
    have = {r.node_id: r for r in reports}
    return [have.get(i, node(i)) for i in ids]


def loads(a: Assignment) -> tuple[Counter, Counter]:
    total, active = Counter(), Counter()
    for ns in a.replicas.values():
        total.update(ns)
        active[ns[0]] += 1
    return total, active


def hosts(a: Assignment) -> set[str]:
    """The nodes an assignment places anything on."""
    return {n for ns in a.replicas.values() for n in ns}


def placements(a: Assignment) -> set[tuple]:
    return {(k, n) for k, ns in a.replicas.items() for n in ns}


def assert_valid(a: Assignment, tables: dict, nodes: list[str], warming: bool = False) -> None:
    """Distinct live nodes, as many as wanted (one more while a warm active waits for its successor)."""
    for name, s in tables.items():
        for p in range(s.partitions):
            ns = a.replicas[(name, p)]
            assert len(ns) == len(set(ns)), "replicas of one partition must be on distinct nodes"
            want = min(1 + s.standby_replicas, len(nodes))
            assert want <= len(ns) <= want + (1 if warming else 0)
            assert set(ns) <= set(nodes)


def assert_balanced(a: Assignment, nodes: list[str]) -> None:
    total, active = loads(a)
    assert max(total[n] for n in nodes) - min(total[n] for n in nodes) <= 1, total
    assert max(active[n] for n in nodes) - min(active[n] for n in nodes) <= 1, active


# A cluster's shape: (nodes, tables, partitions per table, standbys). The large one is the
# assignor at the scale of a real cluster, small enough to run in seconds.
SMALL, LARGE = (3, 1, 8, 1), (300, 10, 500, 2)


def cluster(shape) -> tuple[dict, list[str]]:
    nodes, tables, partitions, standby = shape
    if tables == 1:
        return {"t": spec(partitions=partitions, standby=standby)}, [chr(ord("a") + i) for i in range(nodes)]
    return ({f"t{i}": spec(f"t{i}", partitions, standby) for i in range(tables)},
            [f"n{i:03d}" for i in range(nodes)])


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["small", "large"])
def test_fresh_assignment_is_valid_and_balanced(shape):
    tables, ids = cluster(shape)
    a = assign(tables, [node(i) for i in ids], None, generation=7)
    assert a.generation == 7
    assert_valid(a, tables, ids)
    assert_balanced(a, ids)
    assert assign(tables, reports_for(a), a, 8).replicas == a.replicas  # a fixed point


def test_fewer_nodes_than_replicas_means_fewer_standbys():
    tables = {"t": spec(partitions=4, standby=2)}
    a = assign(tables, [node("a"), node("b")], None, 1)
    assert all(len(ns) == 2 for ns in a.replicas.values())
    assert assign(tables, [], None, 1).replicas == {}


def test_assignment_is_a_fixed_point():
    tables = {"t": spec(partitions=12, standby=1), "u": spec("u", partitions=5, standby=2)}
    ids = ["a", "b", "c", "d"]
    a = assign(tables, [node(i) for i in ids], None, 1)
    again = assign(tables, reports_for(a), a, 2)
    assert again.replicas == a.replicas


@pytest.mark.parametrize("shape,joining", [((3, 1, 8, 1), 1), (LARGE, 1), (LARGE, 150)],
                         ids=["small", "large", "large-wave"])
def test_adding_nodes_moves_only_their_share_and_no_cold_active(shape, joining):
    tables, ids = cluster(shape)
    a = assign(tables, [node(i) for i in ids], None, 1)
    new = [f"new{i:03d}" for i in range(joining)]
    ids = ids + new
    b = assign(tables, with_nodes(reports_for(a), ids), a, 2)
    assert_valid(b, tables, ids)
    total, active = loads(b)
    moved = len(placements(a) - placements(b))
    share = len(placements(a)) // len(ids)
    # Exactly the new nodes' fair shares move, nothing else.
    assert moved == sum(total[n] for n in new) and all(share <= total[n] <= share + 1 for n in new)
    # The new nodes' replicas are cold: they get no active until they catch up.
    assert sum(active[n] for n in new) == 0
    # Once they report caught up, actives even out without moving any more data.
    c = assign(tables, reports_for(b), b, 3)
    assert placements(c) == placements(b)
    assert_balanced(c, ids)


def per_table_actives(a: Assignment) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for (t, _), ns in a.replicas.items():
        out.setdefault(t, Counter())[ns[0]] += 1
    return out


def test_each_tables_actives_are_spread_by_hand_overs_alone():
    """Totals within one (5, 6, 5) yet n1 leads 5 of A's 8 partitions and none of B's: n1's death
    would cost A most of its actives. Warm standbys let roles be swapped without moving data."""
    tables = {"A": spec("A"), "B": spec("B")}
    ids = ["n1", "n2", "n3"]
    before = Assignment(1, {
        ("A", 0): ("n1", "n2"), ("A", 1): ("n1", "n3"), ("A", 2): ("n1", "n2"), ("A", 3): ("n1", "n3"),
        ("A", 4): ("n1", "n2"), ("A", 5): ("n2", "n3"), ("A", 6): ("n2", "n1"), ("A", 7): ("n2", "n3"),
        ("B", 0): ("n2", "n1"), ("B", 1): ("n2", "n3"), ("B", 2): ("n2", "n1"), ("B", 3): ("n3", "n1"),
        ("B", 4): ("n3", "n2"), ("B", 5): ("n3", "n1"), ("B", 6): ("n3", "n2"), ("B", 7): ("n3", "n1")})
    assert per_table_actives(before)["A"] == Counter({"n1": 5, "n2": 3})
    after = assign(tables, reports_for(before), before, 2)
    assert_valid(after, tables, ids)
    assert_balanced(after, ids)
    for table, counts in per_table_actives(after).items():
        assert max(counts[n] for n in ids) - min(counts[n] for n in ids) <= 1, (table, counts)
    assert placements(after) == placements(before)  # only roles changed
    assert assign(tables, reports_for(after), after, 3).replicas == after.replicas  # and it stays


def test_a_node_back_empty_takes_every_tables_share_and_then_leads_each():
    """n1 dies: n2 and n3 hold everything. It comes back empty: the replicas that move to it are each table's share,
    not all of one table's (the coldest-first order once took only the tables last in name order), so that once
    they are warm each table's actives spread to it too."""
    tables = {"area_counts": spec("area_counts"), "sensor_stats": spec("sensor_stats"),
              "sensor_windows": spec("sensor_windows")}
    ids = ["n1", "n2", "n3"]
    a = assign(tables, [node(n) for n in ids], None, 1)
    a = assign(tables, [r for r in reports_for(a) if r.node_id != "n1"], a, 2)
    assert hosts(a) == {"n2", "n3"}
    back = assign(tables, with_nodes(reports_for(a), ids), a, 3)
    held = Counter((t, n) for (t, _), ns in back.replicas.items() for n in ns)
    for table in tables:
        counts = [held[(table, n)] for n in ids]
        assert max(counts) - min(counts) <= 2, (table, counts)  # 16 replicas of each: 5 or 6 a node, within a move
    warm = assign(tables, reports_for(back), back, 4)  # the moved replicas caught up
    assert_balanced(warm, ids)
    for table, counts in per_table_actives(warm).items():
        assert min(counts[n] for n in ids) >= 2, (table, counts)


def test_a_table_is_not_spread_onto_a_standby_still_restoring():
    tables = {"A": spec("A", partitions=2), "B": spec("B", partitions=2)}
    before = Assignment(1, {("A", 0): ("n1", "n2"), ("A", 1): ("n1", "n2"),
                            ("B", 0): ("n2", "n1"), ("B", 1): ("n2", "n1")})
    cold = {("A", p, "n2"): 5000 for p in range(2)}
    after = assign(tables, reports_for(before, lag=cold), before, 2, caught_up_threshold=100)
    assert after.replicas == before.replicas  # n2's copies of A are far behind: n1 stays A's active
    warm = assign(tables, reports_for(before), before, 3)
    assert per_table_actives(warm) == {"A": Counter({"n1": 1, "n2": 1}), "B": Counter({"n1": 1, "n2": 1})}


def test_losing_a_node_promotes_the_most_caught_up_standby():
    tables = {"t": spec(partitions=6, standby=2)}
    ids = ["a", "b", "c", "d"]
    a = assign(tables, [node(i) for i in ids], None, 1)
    dead = a.replicas[("t", 0)][0]
    survivors = [n for n in a.replicas[("t", 0)] if n != dead]
    # The second standby is fresher than the first.
    lag = {("t", 0, survivors[0]): 500, ("t", 0, survivors[1]): 3}
    reports = [r for r in reports_for(a, lag) if r.node_id != dead]
    live = [i for i in ids if i != dead]
    b = assign(tables, with_nodes(reports, live), a, 2)
    assert b.replicas[("t", 0)][0] == survivors[1]
    assert_valid(b, tables, live)
    # Every partition whose active died now has a surviving replica as its active, and no data
    # moved away from a live node: only the dead node's replicas are re-created elsewhere.
    for key, ns in a.replicas.items():
        if ns[0] == dead:
            assert b.replicas[key][0] in ns
    assert {(k, n) for k, n in placements(a) if n != dead} <= placements(b)
    assert_balanced(b, live)


@pytest.mark.parametrize("shape", [(4, 1, 6, 2), LARGE], ids=["small", "large"])
def test_losing_any_node_recreates_only_its_replicas_and_promotes_warm_survivors(shape):
    tables, ids = cluster(shape)
    a = assign(tables, [node(i) for i in ids], None, 1)
    reports = reports_for(a)
    for dead in ids[:: max(1, len(ids) // 3)]:
        live = [i for i in ids if i != dead]
        b = assign(tables, [r for r in reports if r.node_id != dead], a, 2)
        assert_valid(b, tables, live)
        assert_balanced(b, live)
        lost = {(k, n) for k, n in placements(a) if n == dead}
        # Data moves only to replace the dead node's replicas; every active is a warm survivor.
        assert {(k, n) for k, n in placements(a) if n != dead} <= placements(b)
        assert len(placements(b) - placements(a)) == len(lost)
        assert all(b.replicas[k][0] in a.replicas[k] for k in b.replicas)


@pytest.mark.parametrize("shape", [(4, 1, 6, 2), LARGE], ids=["small", "large"])
def test_repair_after_a_death_touches_only_the_dead_nodes_partitions_and_the_next_assignment_only_hands_over(shape):
    tables, ids = cluster(shape)
    a = assign(tables, [node(i) for i in ids], None, 1)
    lag = {(k[0], k[1], ns[2]): 50 for k, ns in a.replicas.items() if len(ns) > 2}  # second standbys fresher
    lag |= {(k[0], k[1], ns[1]): 90 for k, ns in a.replicas.items() if len(ns) > 2}
    reports = reports_for(a, lag)
    for dead in ids[:: max(1, len(ids) // 3)]:
        live = [i for i in ids if i != dead]
        r = repair(tables, [x for x in reports if x.node_id != dead], a, 2)
        assert r is not None
        assert_valid(r, tables, live)
        for k, ns in a.replicas.items():
            if dead not in ns:
                assert r.replicas[k] == ns  # untouched
            elif ns[0] == dead:
                # The freshest survivor takes over.
                assert r.replicas[k][0] == (ns[2] if len(ns) > 2 else ns[1])
            else:
                assert r.replicas[k][0] == ns[0]
        assert len(placements(r) - placements(a)) == len({(k, n) for k, n in placements(a) if n == dead})
        total, _ = loads(r)
        assert max(total.values()) - min(total.values()) <= 1
        # Once the new replicas catch up, the full assignment evens out actives by hand-overs alone.
        c = assign(tables, reports_for(r), r, 3)
        assert placements(c) == placements(r)
        assert_balanced(c, live)


def test_repair_leaves_everything_else_to_the_full_assignment():
    tables = {"t": spec(partitions=6, standby=1)}
    a = assign(tables, [node(i) for i in "abc"], None, 1)
    reports = reports_for(a)
    assert repair(tables, reports, a, 2) is None  # nobody died
    assert repair(tables, [replace(reports[0], draining=True), reports[1]], a, 2) is None  # one drains too
    assert repair(tables | {"u": spec("u", 2)}, reports[:2], a, 2) is None  # a new table


def test_a_death_is_published_repaired_first_then_balanced():
    tables = {"t": spec(partitions=12, standby=1)}
    store = FakeLeaseStore(tables)
    loop = AssignorLoop(store, "a", 1000, 1000, 100, settle_ms=0)
    a = assign(tables, [node(i) for i in "abcd"], None, 1)
    store.stored, store.version = a, 1
    for r in reports_for(a):
        store.reports[r.node_id] = replace(r, heartbeat_ms=10_000)
    now, repaired = 10_000, None
    while repaired is None and now < 12_000:  # d falls silent; the others beat every 100 ms
        now += 100
        for n in "abc":
            store.reports[n] = replace(store.reports[n], heartbeat_ms=now)
        repaired = loop.step(now)
    assert repaired is not None and now == 11_100  # one expiry after d's last beat
    assert loop.repairs == 1
    assert all("d" not in ns for ns in repaired.replicas.values())
    assert {k for k, ns in a.replicas.items() if "d" not in ns} == \
        {k for k, ns in repaired.replicas.items() if ns == a.replicas[k]}
    for r in reports_for(repaired):
        store.reports[r.node_id] = replace(r, heartbeat_ms=now + 100)
    balanced = loop.step(now + 100)
    assert balanced is not None and placements(balanced) == placements(repaired)
    assert_balanced(balanced, ["a", "b", "c"])
    assert loop.step(now + 200) is None
    assert loop.repairs == 1


def test_restoring_standby_ranks_below_a_serving_one():
    tables = {"t": spec(partitions=1, standby=2)}
    prev = Assignment(1, {("t", 0): ("a", "b", "c")})
    reports = [
        node("b", replicas=[ReplicaReport("t", 0, Role.STANDBY, ReplicaState.RESTORING, 999, 1000, 10)]),
        node("c", replicas=[ReplicaReport("t", 0, Role.STANDBY, ReplicaState.STANDBY, 900, 1000, 50)]),
    ]
    b = assign(tables, reports, prev, 2)
    assert b.replicas[("t", 0)][0] == "c"


def test_draining_nodes_get_nothing():
    tables = {"t": spec(partitions=4, standby=1)}
    a = assign(tables, [node(i) for i in "abc"], None, 1)
    reports = reports_for(a)
    reports = [NodeReport(r.node_id, r.address, 0, r.replicas, None, r.node_id == "a") for r in reports]
    b = assign(tables, reports, a, 2)
    assert "a" not in hosts(b)
    assert_valid(b, tables, ["b", "c"])


@pytest.mark.parametrize("shape", [(4, 1, 8, 1), (300, 10, 500, 2)], ids=["small", "large"])
def test_racks_are_honoured_when_possible(shape):
    tables, ids = cluster(shape)
    rack = {n: f"r{i % 3}" for i, n in enumerate(ids)} if len(ids) > 4 else dict(zip(ids, ["r1", "r1", "r2", "r2"]))
    a = assign(tables, [node(n, rack[n]) for n in ids], None, 1)
    for ns in a.replicas.values():
        assert len({rack[n] for n in ns}) == len(ns)
    assert_balanced(a, ids)


def test_lost_assignment_is_rebuilt_from_node_reports():
    tables = {"t": spec(partitions=8, standby=1)}
    a = assign(tables, [node(i) for i in "abc"], None, 1)
    rebuilt = assign(tables, reports_for(a), None, 5)
    assert rebuilt.replicas == a.replicas


def test_lowering_standbys_drops_replicas_not_actives():
    a = assign({"t": spec(partitions=6, standby=2)}, [node(i) for i in "abc"], None, 1)
    b = assign({"t": spec(partitions=6, standby=1)}, reports_for(a), a, 2)
    for key, ns in b.replicas.items():
        assert len(ns) == 2 and ns[0] == a.replicas[key][0]
    assert_balanced(b, list("abc"))


@pytest.mark.parametrize("seed", range(30))
def test_random_histories_stay_valid_and_converge_to_balance(seed):
    rng = random.Random(seed)
    tables = {f"t{i}": spec(f"t{i}", partitions=rng.randint(1, 12), standby=rng.randint(0, 2))
              for i in range(rng.randint(1, 3))}
    pool = [f"n{i}" for i in range(8)]
    ids = sorted(rng.sample(pool, rng.randint(1, 5)))
    a = assign(tables, [node(i) for i in ids], None, 1)
    for gen in range(2, 8):
        # A node joins or leaves, then nodes catch up and the assignor runs a few more rounds.
        if rng.random() < 0.5 and len(ids) > 1:
            ids.remove(rng.choice(ids))
        else:
            ids = sorted(set(ids) | {rng.choice(pool)})
        reports = [r for r in reports_for(a) if r.node_id in ids]
        repaired = repair(tables, with_nodes(reports, ids), a, gen)
        if repaired is not None:  # a node left: its partitions alone are repaired
            assert_valid(repaired, tables, ids)
            assert all(repaired.replicas[k] == ns for k, ns in a.replicas.items() if set(ns) <= set(ids))
        a = assign(tables, with_nodes(reports, ids), a, gen)
        assert_valid(a, tables, ids, warming=True)
        for _ in range(3):
            a = assign(tables, reports_for(a), a, gen)
        assert_valid(a, tables, ids)
        assert_balanced(a, ids)


class FakeLeaseStore:
    """The assignor's view of Redis: one lease with a fencing generation, versions, and node reports
    whose report time is also their beat."""

    def __init__(self, tables):
        self._tables = tables
        self.holder: tuple[str, int] | None = None
        self.generation = 0
        self.stored: Assignment | None = None
        self.version = 0
        self.reports: dict[str, NodeReport] = {}
        self.forgotten: list[str] = []

    def try_acquire_assignor(self, node_id, lease_ms, current=None):
        if self.holder is None:
            self.generation += 1
            self.holder = (node_id, self.generation)
            return self.generation
        return self.holder[1] if self.holder[0] == node_id else None

    def versions(self):
        return b"tables", str(self.version).encode()

    def tables(self):
        return dict(self._tables)

    def poll(self, feed):
        changed = {n for n, r in self.reports.items() if feed.reports.get(n) != r} | (set(feed.reports) - set(self.reports))
        feed.beats = {n: r.heartbeat_ms for n, r in self.reports.items()}
        feed.reports = dict(self.reports)
        return changed

    def assignment(self):
        return self.stored

    def write_assignment(self, assignment, node_id, generation, previous=None):
        if self.holder != (node_id, generation):
            return None
        self.stored = assignment
        self.version += 1
        return str(self.version).encode()

    def forget_nodes(self, node_ids):
        self.forgotten.extend(node_ids)
        for n in node_ids:
            self.reports.pop(n, None)

    def release_assignor(self, node_id, generation):
        if self.holder == (node_id, generation):
            self.holder = None


def test_only_the_lease_holder_writes_and_a_deposed_holder_is_fenced():
    store = FakeLeaseStore({"t": spec(partitions=4)})
    store.reports = {n: NodeReport(n, "x:1", 1000) for n in "ab"}
    a = AssignorLoop(store, "a", 2000, 2000, 100, settle_ms=0)
    b = AssignorLoop(store, "b", 2000, 2000, 100, settle_ms=0)
    assert a.step(1000) is not None and a.generation == 1
    assert b.step(1000) is None and b.generation is None
    assert a.step(1000) is None  # nothing changed: no rewrite

    # a's lease expires (a paused); b takes over with a higher generation.
    store.holder = None
    store.reports["c"] = NodeReport("c", "x:1", 1000)
    written = b.step(1000)
    assert written is not None and written.generation == 2
    # a wakes up thinking it still holds generation 1: its write is fenced off.
    stale = assign(store.tables(), [store.reports["a"]], None, 1)
    assert not store.write_assignment(stale, "a", 1)
    assert a.step(1000) is None and a.generation is None
    assert store.stored.generation == 2


def test_expired_nodes_are_not_live():
    store = FakeLeaseStore({"t": spec(partitions=4)})
    store.reports = {"a": NodeReport("a", "x:1", 10_000), "b": NodeReport("b", "x:2", 7_000)}
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=2000, caught_up_threshold=100, settle_ms=0)
    written = loop.step(10_500)
    assert hosts(written) == {"a"}


def test_partition_without_standbys_moves_through_a_warm_up_replica():
    tables = {"t": spec(partitions=4, standby=0)}
    a = assign(tables, [node("a")], None, 1)
    b = assign(tables, with_nodes(reports_for(a), ["a", "b"]), a, 2)
    moving = [k for k, ns in b.replicas.items() if len(ns) == 2]
    assert len(moving) == 2
    for k in moving:
        assert b.replicas[k] == ("a", "b")  # a keeps serving as active while b restores
    # b still restoring: nothing changes.
    lag = {(k[0], k[1], "b"): 10_000 for k in moving}
    assert assign(tables, reports_for(b, lag), b, 3).replicas == b.replicas
    # b caught up: the active moves and a's copy is dropped.
    c = assign(tables, reports_for(b), b, 4)
    assert all(c.replicas[k] == ("b",) for k in moving)
    assert_valid(c, tables, ["a", "b"])
    assert_balanced(c, ["a", "b"])


def test_without_a_previous_assignment_the_holder_waits_for_heartbeats():
    store = FakeLeaseStore({"t": spec(partitions=4)})
    store.reports = {"a": NodeReport("a", "x:1", 10_000)}
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=2000, caught_up_threshold=100)
    assert loop.step(10_000) is None and loop.generation == 1  # holds the lease, but waits
    store.reports["b"] = NodeReport("b", "x:2", 11_000)
    assert loop.step(11_000) is None
    written = loop.step(12_000)
    assert hosts(written) == {"a", "b"}


def test_no_tables_no_assignment():
    store = FakeLeaseStore({})
    store.reports = {"a": NodeReport("a", "x:1", 10_000)}
    store.stored = Assignment(1, {("t", 0): ("a",)})
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=2000, caught_up_threshold=100, settle_ms=0)
    assert loop.step(10_000) is None
    assert store.stored.replicas == {("t", 0): ("a",)}


def test_a_restoring_active_in_place_is_not_demoted_for_a_warmer_standby():
    tables = {"t": spec(partitions=2, standby=1)}
    prev = Assignment(1, {("t", 0): ("a", "b"), ("t", 1): ("b", "a")})
    reports = [
        node("a", replicas=[ReplicaReport("t", 0, Role.ACTIVE, ReplicaState.RESTORING, 10, 1000, 10**9),
                            ReplicaReport("t", 1, Role.STANDBY, ReplicaState.STANDBY, 1000, 1000, 0)]),
        node("b", replicas=[ReplicaReport("t", 0, Role.STANDBY, ReplicaState.STANDBY, 1000, 1000, 0),
                            ReplicaReport("t", 1, Role.ACTIVE, ReplicaState.RESTORING, 10, 1000, 10**9)]),
    ]
    assert assign(tables, reports, prev, 2).replicas == prev.replicas


def test_a_redis_failure_voids_the_lease():
    store = FakeLeaseStore({"t": spec(partitions=4)})
    store.reports = {"a": NodeReport("a", "x:1", 10_000)}
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=2000, caught_up_threshold=100, settle_ms=0)
    loop.step(10_000)
    assert loop.generation == 1

    def down(*args):
        raise ConnectionError("redis down")
    store.versions = down
    with pytest.raises(ConnectionError):
        loop.step(10_100)
    assert loop.generation is None


def test_the_holder_never_declares_itself_dead():
    store = FakeLeaseStore({"t": spec(partitions=4)})
    # Its own heartbeat reached Redis late (a slow write): it is running, so it is alive.
    store.reports = {"a": NodeReport("a", "x:1", 9_000), "b": NodeReport("b", "x:2", 10_000)}
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=1000, caught_up_threshold=100, settle_ms=0)
    written = loop.step(10_500)
    assert hosts(written) == {"a", "b"}


def test_a_stalled_assignor_gives_every_node_a_full_expiry_before_declaring_it_dead():
    store = FakeLeaseStore({"t": spec(partitions=4)})
    store.reports = {n: NodeReport(n, "x:1", 10_000) for n in "abc"}
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=1000, caught_up_threshold=100, settle_ms=0)
    first = loop.step(10_000)
    assert hosts(first) == {"a", "b", "c"}

    # a stalls for 3 s (so did everyone: the machine was overloaded); b heartbeats right after,
    # c only 800 ms later. Neither is dead: both were heard from within an expiry of the resumption.
    store.reports["a"] = NodeReport("a", "x:1", 13_000)
    assert loop.step(13_000) is None
    store.reports["b"] = NodeReport("b", "x:2", 13_100)
    assert loop.step(13_100) is None
    store.reports["c"] = NodeReport("c", "x:3", 13_800)
    assert loop.step(13_800) is None
    # Then c stops heartbeating for good: it is declared dead one expiry after its last heartbeat.
    for t in range(13_900, 14_800, 100):
        store.reports["a"] = NodeReport("a", "x:1", t)
        store.reports["b"] = NodeReport("b", "x:2", t)
        assert loop.step(t) is None
    store.reports["a"] = NodeReport("a", "x:1", 14_900)
    store.reports["b"] = NodeReport("b", "x:2", 14_900)
    written = loop.step(14_900)
    assert written is not None and hosts(written) == {"a", "b"}


def test_a_node_silent_since_before_the_stall_is_dead_one_expiry_after_the_resumption():
    store = FakeLeaseStore({"t": spec(partitions=4)})
    store.reports = {n: NodeReport(n, "x:1", 10_000) for n in "ab"}
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=1000, caught_up_threshold=100, settle_ms=0)
    loop.step(10_000)
    store.reports["a"] = NodeReport("a", "x:1", 15_000)
    assert loop.step(15_000) is None  # b looks 5 s old, but a was not watching
    for t in range(15_100, 16_100, 100):
        store.reports["a"] = NodeReport("a", "x:1", t)
        assert loop.step(t) is None
    store.reports["a"] = NodeReport("a", "x:1", 16_100)
    written = loop.step(16_100)
    assert hosts(written) == {"a"}


def test_the_assignment_log_names_nodes_that_joined_and_left(caplog):
    store = FakeLeaseStore({"t": spec(partitions=4)})
    store.reports = {n: NodeReport(n, "x:1", 10_000) for n in "ab"}
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=1000, caught_up_threshold=100, settle_ms=0)
    loop.step(10_000)
    store.reports["a"] = NodeReport("a", "x:1", 10_100)
    store.reports["c"] = NodeReport("c", "x:3", 10_100, draining=True)
    store.reports["d"] = NodeReport("d", "x:4", 10_100)
    with caplog.at_level(logging.INFO, logger="store_node.assignor"):
        loop.step(10_100)
        for t in range(10_200, 11_200, 100):
            store.reports["a"] = NodeReport("a", "x:1", t)
            store.reports["d"] = NodeReport("d", "x:4", t)
            loop.step(t)
    lines = " | ".join(r.getMessage() for r in caplog.records)
    assert "joined: d" in lines
    assert "left: b (dead: last heartbeat 1.1s ago)" in lines


def test_a_quiet_cluster_costs_a_poll_not_an_assignment(monkeypatch):
    import store_node.assignor as assignor_module
    runs = []
    monkeypatch.setattr(assignor_module, "assign", lambda *a, **k: runs.append(1) or assign(*a, **k))
    store = FakeLeaseStore({"t": spec(partitions=4)})
    store.reports = {n: NodeReport(n, "x:1", 10_000) for n in "ab"}
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=1000, caught_up_threshold=100, settle_ms=0)
    first = loop.step(10_000)

    def hosting(t, behind=0):
        return {r.node_id: NodeReport(r.node_id, "x:1", t, tuple(
            replace(x, applied=x.applied + t - (behind if r.node_id == "b" else 0), end=x.end + t)
            for x in r.replicas)) for r in reports_for(first)}
    store.reports = hosting(10_050)
    loop.step(10_050)
    runs.clear()
    for t in range(10_100, 11_000, 100):
        store.reports = hosting(t)  # beats and positions move; nothing the assignment depends on does
        assert loop.step(t) is None
    assert runs == []
    store.reports = hosting(11_000, behind=1000)  # b's replicas are no longer warm: an input changed
    loop.step(11_000)
    assert runs == [1]


def test_a_dead_node_with_a_clock_ahead_is_dead_one_expiry_after_its_last_beat():
    store = FakeLeaseStore({"t": spec(partitions=4)})
    # b's clock is a minute ahead: its beats look like they come from the future.
    store.reports = {"a": NodeReport("a", "x:1", 10_000), "b": NodeReport("b", "x:2", 70_000)}
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=1000, caught_up_threshold=100, settle_ms=0)
    first = loop.step(10_000)
    assert hosts(first) == {"a", "b"}
    store.reports["b"] = NodeReport("b", "x:2", 70_100)
    loop.step(10_100)  # b's last beat, heard at 10,100; then b dies
    for t in range(10_200, 11_200, 100):
        store.reports["a"] = NodeReport("a", "x:1", t)
        assert loop.step(t) is None
    store.reports["a"] = NodeReport("a", "x:1", 11_200)
    written = loop.step(11_200)
    assert written is not None and hosts(written) == {"a"}


def test_nodes_silent_past_the_report_lifetime_are_removed_from_the_membership():
    store = FakeLeaseStore({"t": spec(partitions=4)})
    store.reports = {"a": NodeReport("a", "x:1", 10_000), "b": NodeReport("b", "x:2", 10_000)}
    loop = AssignorLoop(store, "a", 2000, node_expiry_ms=1000, caught_up_threshold=100, settle_ms=0,
                        forget_after_ms=5000)
    for t in range(10_000, 15_001, 100):
        store.reports["a"] = NodeReport("a", "x:1", t)
        loop.step(t)
    assert store.forgotten == []
    store.reports["a"] = NodeReport("a", "x:1", 15_100)
    loop.step(15_100)
    assert store.forgotten == ["b"]

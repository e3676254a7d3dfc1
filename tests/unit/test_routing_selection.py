import random
from dataclasses import replace

from freshroute.bound import Bound
from freshroute.position import Position
from freshroute.metadata.reports import NodePositions
from freshroute.metadata.roles import ReplicaState, Role

from freshroute.routing.selection import FreshestFirst, LoadTracker
from freshroute.routing.snapshot import LagOverlay, MovedPositions, ReplicaView

NOW = 1_000_000


def replica(node, lag=0, staleness=0, applied=100, role=Role.STANDBY, alive=True, observed=NOW, reported=True,
            draining=False):
    state = (ReplicaState.ACTIVE if role is Role.ACTIVE else ReplicaState.STANDBY) if reported else None
    return ReplicaView(node, f"{node}:1", "t", 0, role, state, applied, applied + lag, staleness, observed, alive,
                       draining)


def selector(**kw):
    load = LoadTracker(failure_backoff_ms=1000, clock_ms=lambda: NOW)
    return FreshestFirst(load, LagOverlay(), clock_ms=lambda: NOW, rng=random.Random(7), **kw)


def order(sel, replicas, bound=Bound()):
    return [c.replica.node for c in sel.select(replicas, bound).candidates]


def test_freshest_offset_lag_first_then_staleness():
    sel = selector()
    reps = [replica("a", lag=5), replica("b", lag=0), replica("c", lag=2)]
    assert order(sel, reps) == ["b", "c", "a"]
    reps = [replica("a", lag=1, staleness=900), replica("b", lag=1, staleness=100)]
    assert order(sel, reps) == ["b", "a"]


def test_bound_excludes_replicas_the_recent_view_puts_beyond_it():
    sel = selector()
    reps = [replica("a", lag=50), replica("b", lag=3), replica("c", lag=80)]
    result = sel.select(reps, Bound(max_lag=10))
    assert [c.replica.node for c in result.candidates] == ["b"]
    assert result.freshest.replica.node == "b" and result.freshest.lag_offsets == 3
    # staleness bound
    assert order(sel, [replica("a", lag=1, staleness=6000), replica("b", lag=1, staleness=10)],
                 Bound(max_staleness_ms=5000)) == ["b"]
    # min_position: a replica the view has below it comes last, but is not excluded — the caller's
    # position came from an answer, so the view is what is behind (the store checks the bound)
    at_100 = Bound(min_position=Position("t", {0: 100}))
    assert order(sel, [replica("a", applied=90), replica("b", applied=120)], at_100) == ["b", "a"]
    assert order(sel, [replica("a", applied=120), replica("b", applied=90)], at_100) == ["a", "b"]
    # ... unless its lag or staleness puts it outside the bound too
    assert order(sel, [replica("a", applied=90, lag=50), replica("b", applied=120)],
                 Bound(max_lag=10, min_position=Position("t", {0: 100}))) == ["b"]


def test_no_replica_within_bound_reports_the_freshest():
    sel = selector()
    result = sel.select([replica("a", lag=50), replica("b", lag=80)], Bound(max_lag=10))
    assert result.candidates == []
    assert (result.freshest.replica.node, result.freshest.lag_offsets) == ("a", 50)
    assert result.live == 2


def test_old_view_never_excludes_but_orders_last():
    sel = selector(view_trust_ms=1000)
    old = replica("a", lag=50, observed=NOW - 5000)
    fresh = replica("b", lag=3)
    # "a" looks beyond max_lag=10, but that view is 5 s old: the store will decide.
    assert order(sel, [old, fresh], Bound(max_lag=10)) == ["b", "a"]


def test_lagging_replica_gets_staler_with_time():
    sel = selector()
    c, age = sel.estimate(replica("a", lag=4, staleness=100, observed=NOW - 300), NOW)
    assert (c.lag_offsets, c.staleness_ms, age) == (4, 400, 300)
    c, _ = sel.estimate(replica("b", lag=0, staleness=0, observed=NOW - 300), NOW)
    assert c.staleness_ms == 0  # caught up stays caught up


def test_piggybacked_lag_overrides_an_older_heartbeat():
    sel = selector()
    r = replica("a", lag=50, observed=NOW - 100)
    sel.overlay.observe("a", "t", 0, applied=200, end=200, staleness_ms=0, observed_ms=NOW - 10)
    c, _ = sel.estimate(r, NOW)
    assert (c.lag_offsets, c.applied) == (0, 200)
    # An overlay older than the heartbeat is ignored.
    sel.overlay.observe("a", "t", 0, applied=1, end=500, staleness_ms=0, observed_ms=NOW - 1000)
    assert sel.estimate(r, NOW)[0].lag_offsets == 50


def test_the_newest_of_report_positions_published_since_and_piggybacked_lag_wins():
    from dataclasses import replace

    sel = selector()
    moved = MovedPositions()
    r = replace(replica("a", lag=50, observed=NOW - 300), moved=moved, slot=1)
    moved.latest = NodePositions(NOW - 300, NOW - 100, (0, 0, 0, 160, 170, 0))  # the node's heartbeat since
    c, _ = sel.estimate(r, NOW)
    assert (c.applied, c.lag_offsets) == (160, 10)
    sel.overlay.observe("a", "t", 0, applied=150, end=150, staleness_ms=0, observed_ms=NOW - 200)  # older: ignored
    assert sel.estimate(r, NOW)[0].applied == 160
    sel.overlay.observe("a", "t", 0, applied=175, end=175, staleness_ms=0, observed_ms=NOW - 50)  # newer: wins
    assert sel.estimate(r, NOW)[0].applied == 175


def test_equally_fresh_replicas_least_loaded_first():
    sel = selector()
    reps = [replica("a", role=Role.ACTIVE), replica("b")]
    for _ in range(3):
        sel.load.started("a")
    assert order(sel, reps) == ["b", "a"]
    for _ in range(3):
        sel.load.finished("a", 1.0)
    sel.load.started("b")
    assert order(sel, reps) == ["a", "b"]


def test_equally_fresh_idle_replicas_share_load():
    sel = selector()
    reps = [replica("a", role=Role.ACTIVE), replica("b")]
    firsts = [order(sel, reps)[0] for _ in range(200)]
    assert 60 < firsts.count("a") < 140 and firsts.count("a") + firsts.count("b") == 200


def test_idle_replicas_share_by_latency_and_the_slow_one_still_gets_some():
    sel = selector()
    reps = [replica("a"), replica("b")]
    sel.load.of("a").ewma_ms = 1.0
    sel.load.of("b").ewma_ms = 3.0
    firsts = [order(sel, reps)[0] for _ in range(400)]
    # weights 1 : 1/3 → "a" first about 75% of the time
    assert 250 < firsts.count("a") < 350 and firsts.count("b") > 50


def test_load_does_not_beat_freshness_unless_within_tolerance():
    strict = selector()
    reps = [replica("a", lag=0), replica("b", lag=2)]
    for _ in range(10):
        strict.load.started("a")
    assert order(strict, reps) == ["a", "b"]
    tolerant = selector(tolerance_offsets=2)
    for _ in range(10):
        tolerant.load.started("a")
    assert order(tolerant, reps) == ["b", "a"]


def test_dead_and_unreported_replicas_are_not_candidates():
    sel = selector()
    reps = [replica("a", alive=False), replica("b", lag=9), replica("c", reported=False)]
    result = sel.select(reps, Bound())
    assert [c.replica.node for c in result.candidates] == ["b"]
    assert result.live == 1


def test_with_no_live_replica_the_dead_looking_ones_are_still_tried():
    sel = selector()
    reps = [replica("a", alive=False, lag=3), replica("b", alive=False, lag=1)]
    result = sel.select(reps, Bound())
    assert [c.replica.node for c in result.candidates] == ["b", "a"]
    assert result.live == 0


def test_recently_failed_and_draining_nodes_go_to_the_back():
    sel = selector()
    reps = [replica("a", lag=0), replica("b", lag=5), replica("c", lag=9, draining=True)]
    sel.load.failed("a")
    assert order(sel, reps) == ["b", "a", "c"]
    sel.load.finished("a", 1.0)  # an answer clears the failure
    assert order(sel, reps)[0] == "a"


def test_a_restoring_replica_goes_after_serving_ones_however_fresh_it_looks():
    # A replica restoring from its changelog that has not learnt the end yet: its offset lag is unknown.
    sel = selector()
    restoring = replace(replica("new", staleness=10**12, applied=0), state=ReplicaState.RESTORING, end=None)
    serving = replica("old", lag=5, staleness=200, role=Role.ACTIVE)
    for reps in ([restoring, serving], [serving, restoring]):
        assert order(sel, reps) == ["old", "new"]
    # Still a candidate within the bound when the serving one cannot answer, and last among three.
    other = replica("other", lag=40, staleness=900)
    assert order(sel, [restoring, other, serving]) == ["old", "other", "new"]
    sel.load.failed("old")
    assert order(sel, [restoring, serving]) == ["new", "old"]  # a failing node still goes to the very back


def test_an_unknown_offset_lag_is_never_preferred_and_never_meets_max_lag():
    sel = selector()
    unknown = replace(replica("u", staleness=0), end=None)  # serving, but its end offset not learnt yet
    behind = replica("b", lag=500, staleness=3000)
    for reps in ([unknown, behind], [behind, unknown]):
        assert order(sel, reps) == ["b", "u"]
    assert order(sel, [unknown, behind, replica("c", lag=2)]) == ["c", "b", "u"]
    result = sel.select([unknown], Bound(max_lag=1_000_000))
    assert result.candidates == [] and result.freshest.lag_offsets is None
    # Without an offset bound it may still answer, labelled as unknown.
    only = sel.select([unknown], Bound(max_staleness_ms=10)).candidates
    assert [(c.replica.node, c.lag_offsets, c.end) for c in only] == [("u", None, None)]
    # The freshest for an error's details is a known lag before an unknown one.
    assert sel.select([unknown, behind], Bound(max_lag=0)).freshest.replica.node == "b"


def test_a_failed_replica_is_never_asked_even_when_it_looks_freshest():
    sel = selector()
    failed = replace(replica("a", lag=0), state=ReplicaState.FAILED, failure="no space left on the device")
    assert order(sel, [failed, replica("b", lag=40)]) == ["b"]
    assert order(sel, [failed, replace(replica("b"), alive=False)]) == ["b"]  # nor as the last resort
    assert order(sel, [failed]) == []

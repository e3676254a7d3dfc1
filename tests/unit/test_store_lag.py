from store_node.replica import LagTracker


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def tracker(clock: Clock, applied: int = 0, caught_up_at: int = 0, window: int = 1000) -> LagTracker:
    return LagTracker(applied, caught_up_at, clock, window)


def test_unknown_end_is_not_caught_up():
    clock = Clock()
    lag = tracker(clock, applied=10, caught_up_at=clock.now - 5000)
    snap = lag.snapshot()
    assert snap.end is None and snap.lag_offsets is None
    assert not snap.caught_up
    assert snap.staleness_ms == 5000


def test_caught_up_with_fresh_evidence_has_zero_staleness():
    clock = Clock()
    lag = tracker(clock, applied=100)
    lag.observe_end(100, clock.now)
    clock.now += 500
    snap = lag.snapshot()
    assert snap.caught_up and snap.staleness_ms == 0 and snap.lag_offsets == 0


def test_lag_is_end_minus_applied_never_negative():
    clock = Clock()
    lag = tracker(clock, applied=40)
    lag.observe_end(100, clock.now)
    assert lag.snapshot().lag_offsets == 60
    lag.advance(100)
    assert lag.snapshot().lag_offsets == 0


def test_staleness_grows_when_evidence_stops():
    """Broker unreachable: no new evidence, so the replica cannot claim to be caught up."""
    clock = Clock()
    lag = tracker(clock, applied=100, window=1000)
    lag.observe_end(100, clock.now)
    last_evidence = clock.now
    clock.now += 999
    assert lag.staleness_ms() == 0
    clock.now += 2
    assert lag.staleness_ms() == clock.now - last_evidence
    clock.now += 10_000
    assert lag.staleness_ms() == clock.now - last_evidence


def test_offset_lag_is_unknown_when_evidence_stops():
    """Cut off from the broker, a replica cannot know how far behind it is: its last end offset is no measurement."""
    clock = Clock()
    lag = tracker(clock, applied=40, window=1000)
    lag.observe_end(100, clock.now)
    clock.now += 1000
    assert lag.snapshot().lag_offsets == 60 and lag.figures(clock.now) == (40, 100, clock.now - 0)
    clock.now += 1
    snap = lag.snapshot()
    assert snap.end is None and snap.lag_offsets is None and not snap.caught_up
    assert lag.figures(clock.now)[1] is None
    lag.observe_end(120, clock.now)  # the broker answers again: measured again
    assert lag.snapshot().lag_offsets == 80


def test_catching_up_dates_the_replica_to_when_the_end_was_seen():
    clock = Clock()
    lag = tracker(clock, applied=0, caught_up_at=clock.now - 60_000)
    t1 = clock.now
    lag.observe_end(50, t1)
    clock.now += 100
    t2 = clock.now
    lag.observe_end(80, t2)
    clock.now += 100
    lag.advance(60)  # has everything the broker had at t1, not yet at t2
    assert lag.caught_up_at_ms == t1
    assert lag.staleness_ms() == clock.now - t1
    lag.advance(80)
    assert lag.caught_up_at_ms == t2
    assert lag.staleness_ms() == 0  # caught up, and the evidence is fresh


def test_same_end_seen_again_moves_the_date_forward():
    clock = Clock()
    lag = tracker(clock, applied=0)
    lag.observe_end(50, clock.now)
    clock.now += 300
    lag.observe_end(50, clock.now)
    lag.advance(50)
    assert lag.caught_up_at_ms == clock.now


def test_steady_writes_keep_staleness_small_though_never_exactly_caught_up():
    clock = Clock()
    lag = tracker(clock, applied=0)
    end = 0
    for _ in range(100):
        end += 10
        lag.observe_end(end, clock.now)
        clock.now += 20
        lag.advance(end - 5)  # always trailing the latest end by a few offsets
    assert lag.snapshot().lag_offsets == 5
    assert lag.staleness_ms() <= 40


def test_caught_up_at_after_previews_advance():
    clock = Clock()
    lag = tracker(clock)
    lag.observe_end(10, 111)
    lag.observe_end(20, 222)
    assert lag.caught_up_at_after(15) == 111
    assert lag.caught_up_at_after(25) == 222
    assert lag.caught_up_at_ms == 0


def test_within_threshold():
    clock = Clock()
    lag = tracker(clock, applied=95)
    lag.observe_end(100, clock.now)
    assert lag.within(5) and not lag.within(4)
    clock.now += 5000
    assert not lag.within(5)  # evidence too old


def test_reset_forgets_everything():
    clock = Clock()
    lag = tracker(clock, applied=100)
    lag.observe_end(100, clock.now)
    lag.reset()
    snap = lag.snapshot()
    assert snap.applied == 0 and snap.end is None and not snap.caught_up
    assert snap.staleness_ms == clock.now

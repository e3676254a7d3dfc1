"""How far a version building has got and when it will have caught up (freshroute.metadata.catch_up): the rate its
input lag falls at, from the pipeline's samples (a falling lag gives an estimate; a flat or rising one, or too few
samples, none); its progress over the input the broker holds; what the pipeline publishes of them."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import orjson
import pytest

from freshroute.metadata.catch_up import (MIN_SAMPLES, SAMPLES_KEPT, UNKNOWN, WINDOW_MS, CatchUp, LagTrend,
                                          caught_up_in, catch_up, falling_rate, progress_of, version_figures)
from freshroute.metadata.progress import PIPELINE_EXPIRY_MS, InputEnds, InputLag
from freshroute.metadata.table_versions import VersionedTable
from freshroute.metadata.tables import TableSpec

NOW = 1_800_000_000_000


def samples(records: list[int], every_ms: int = 1_000, start: int = NOW) -> list[tuple[int, int]]:
    return [(start + i * every_ms, r) for i, r in enumerate(records)]


# ---- the rate -----------------------------------------------------------------------------------------------------

def test_a_falling_lag_gives_the_rate_it_falls_at():
    assert falling_rate(samples([10_000, 9_000, 8_000, 7_000])) == pytest.approx(1_000)
    # Noise around a steady fall: the least-squares line, not the last step.
    assert falling_rate(samples([10_000, 9_400, 8_100, 7_300, 5_900, 5_100])) == pytest.approx(980, rel=0.05)
    # Input arriving meanwhile is in the samples: it is the net fall that counts.
    assert falling_rate(samples([5_000, 4_900, 4_800], every_ms=2_000)) == pytest.approx(50)


@pytest.mark.parametrize("records", [[5_000, 5_000, 5_000, 5_000], [5_000, 5_100, 5_300, 5_600]],
                         ids=["flat", "rising"])
def test_a_flat_or_rising_lag_gives_no_rate(records):
    assert falling_rate(samples(records)) is None


def test_too_few_samples_or_too_short_a_span_give_no_rate():
    assert falling_rate([]) is None
    assert falling_rate(samples([10_000, 5_000])) is None  # MIN_SAMPLES
    assert MIN_SAMPLES == 3
    assert falling_rate(samples([10_000, 9_000, 8_000], every_ms=500)) is None  # over 1 s only


def test_the_trend_keeps_one_sample_a_second_the_latest_ones_and_none_older_than_its_window():
    trend = LagTrend()
    for i in range(8):  # observed four times a second: two kept
        trend.add(NOW + i * 250, 10_000 - i * 250)
    assert len(trend) == 2 and trend.falling_per_s() is None
    trend.add(NOW + 2_000, 8_000)
    assert trend.falling_per_s() == pytest.approx(1_000)
    for i in range(SAMPLES_KEPT * 2):
        trend.add(NOW + 3_000 + i * 1_000, 7_000)
    assert len(trend) == SAMPLES_KEPT and trend.falling_per_s() is None  # flat for the last minute: no longer falling
    late = NOW + 3_000 + SAMPLES_KEPT * 2_000 + WINDOW_MS + 1
    trend.add(late, 6_000)
    assert len(trend) == 1  # the others are older than the window
    trend.add(late - 10_000, 5_000)  # the clock went back: start again
    assert len(trend) == 1


# ---- progress and the estimate ------------------------------------------------------------------------------------

def test_progress_is_what_was_read_past_the_log_start_over_that_and_what_is_left():
    assert progress_of({0: 400, 1: 200}, {0: 100, 1: 0}, behind=900) == pytest.approx(500 / 1400, abs=1e-4)
    assert progress_of({0: 50}, {0: 100}, behind=10) == 0.0  # its position deleted by retention: nothing counted
    assert progress_of({0: 100}, {0: 100}, behind=0) == 1.0  # an empty input: nothing to do
    assert progress_of({0: 500}, {0: 0}, behind=0) == 1.0
    assert progress_of({}, {0: 0}, behind=5) is None  # no position yet
    assert progress_of({0: 5}, {}, behind=5) is None  # the log starts unknown
    assert progress_of({0: 5, 1: 5}, {0: 0}, behind=5) is None  # a partition's unknown


def test_the_estimate_is_the_records_beyond_switch_lag_at_the_rate_they_fall():
    assert caught_up_in(10_000, 1_000.0, 1_000) == 9_000
    assert caught_up_in(1_001, 3.0, 1_000) == 334  # rounded up
    assert caught_up_in(1_000, None, 1_000) == 0  # within switch_lag: caught up, whatever the rate
    assert caught_up_in(10_000, None, 1_000) is None  # not falling: unknown, never 0
    assert caught_up_in(10_000, 0.0, 1_000) is None


def lag(records: int, offsets: dict[int, int], falling: float | None = 100.0, switch_lag: int | None = 100,
        alive: int = NOW) -> InputLag:
    return InputLag(records, NOW - 5_000, NOW, offsets, alive, falling, switch_lag)


def test_a_versions_catch_up_from_what_the_pipeline_published_and_where_the_input_ends():
    ends = InputEnds({0: 1_000, 1: 500}, NOW, {0: 100, 1: 0})
    way = catch_up(lag(900, {0: 400, 1: 200}), ends, NOW)
    assert way == CatchUp(pytest.approx(0.3571, abs=1e-4), 8_000)  # (900 − 100) records at 100 a second
    assert way.to_dict() == {"progress": way.progress, "caught_up_in_ms": 8_000}
    # Against another switch_lag than the pipeline's; and the default where the pipeline said none.
    assert catch_up(lag(900, {0: 400, 1: 200}), ends, NOW, switch_lag=400).caught_up_in_ms == 5_000
    assert catch_up(lag(900, {0: 400, 1: 200}, switch_lag=None), ends, NOW).caught_up_in_ms == 0  # 900 ≤ 1000
    # The input's ends are fresher than the pipeline's word: they say how much is left.
    grown = InputEnds({0: 2_000, 1: 500}, NOW, {0: 100, 1: 0})
    assert catch_up(lag(900, {0: 400, 1: 200}), grown, NOW).caught_up_in_ms == 18_000
    # No log starts (an older store node): no progress; the estimate all the same.
    assert catch_up(lag(900, {0: 400, 1: 200}), InputEnds({0: 1_000, 1: 500}, NOW), NOW) == CatchUp(None, 8_000)


def test_unknown_stays_null_never_0():
    ends = InputEnds({0: 1_000}, NOW, {0: 0})
    assert catch_up(None, ends, NOW) == UNKNOWN == CatchUp(None, None)  # nothing published of it
    assert catch_up(lag(900, {0: 100}, falling=None), ends, NOW).caught_up_in_ms is None  # not falling
    # A pipeline gone silent is not catching up, whatever its last rate said.
    silent = lag(900, {0: 100}, alive=NOW - PIPELINE_EXPIRY_MS - 1)
    assert catch_up(silent, ends, NOW).caught_up_in_ms is None
    assert catch_up(silent, ends, NOW).progress == pytest.approx(0.1)


def test_each_versions_figures_from_the_metadata():
    record = VersionedTable.first("t", "fp1", 1_000).begun("fp2", 2_000)[0]
    specs = {n: TableSpec(n, f"{n}-changelog", 2, "k", input_topic="in") for n in ("t", "t-v2")}
    ends = {"in": InputEnds({0: 1_000, 1: 500}, NOW, {0: 100, 1: 0})}
    lags = {"t": lag(0, {0: 1_000, 1: 500}), "t-v2": lag(900, {0: 400, 1: 200})}
    input_lags, ways = version_figures(record, specs, lags, ends, NOW)
    assert input_lags == {1: (0, 0), 2: (900, 5_000)}
    assert set(ways) == {2} and ways[2].caught_up_in_ms == 8_000  # the building one's alone
    # Its spec not registered yet: no input lag listed, the pipeline's word for the estimate, and no progress.
    input_lags, ways = version_figures(record, {"t": specs["t"]}, lags, ends, NOW)
    assert input_lags == {1: (0, 0)} and ways[2] == CatchUp(None, 8_000)


def test_the_new_figures_are_left_out_of_the_json_when_unknown_and_read_back():
    plain = InputLag(5, NOW, NOW, {0: 3}, NOW)
    assert set(orjson.loads(plain.to_json())) == {"records", "caught_up_ms", "at_ms", "offsets", "alive_ms"}
    assert InputLag.from_json(plain.to_json()) == plain
    full = InputLag(5, NOW, NOW, {0: 3}, NOW, 12.5, 1_000)
    assert InputLag.from_json(full.to_json()) == full
    ends = InputEnds({0: 7}, NOW)
    assert set(orjson.loads(ends.to_json())) == {"ends", "at_ms"} and InputEnds.from_json(ends.to_json()) == ends
    with_starts = InputEnds({0: 7}, NOW, {0: 2})
    assert InputEnds.from_json(with_starts.to_json()) == with_starts


# ---- the pipeline publishes the rate ------------------------------------------------------------------------------

class Store:
    def __init__(self) -> None:
        self.written: dict[str, InputLag] = {}

    def publish_input_lag(self, table: str, lag: InputLag) -> None:
        self.written[table] = lag


def progress(latest: int, end: int) -> SimpleNamespace:
    offset = lambda o: orjson.dumps({"readings": {"0": o}}).decode()  # noqa: E731
    return SimpleNamespace(timestamp="2026-11-27T06:00:00.000Z",
                           sources=[SimpleNamespace(latestOffset=offset(latest), endOffset=offset(end))])


def test_the_pipeline_publishes_the_rate_a_tables_lag_falls_at_and_its_switch_lag(monkeypatch):
    import pipeline.input_lag as input_lag

    clock = {"ms": NOW}
    monkeypatch.setattr(input_lag, "now_ms", lambda: clock["ms"])
    store, stop = Store(), threading.Event()
    publisher = input_lag.InputLagPublisher(store, stop, "redis://x", switch_lag=500)
    publisher.start()
    try:
        seen = []
        for i, end in enumerate((1_000, 3_000, 5_000, 7_000)):  # 2,000 records read a batch, a batch a second
            clock["ms"] = NOW + i * 1_000
            seen.append(publisher.observe("t-v2", progress(10_000, end)))
        assert [s.falling_per_s for s in seen] == [None, None, 2_000.0, 2_000.0]  # from the third sample
        assert all(s.switch_lag == 500 for s in seen)
        # Real-time tables' positions, as their output is read back: the same.
        for i, reached in enumerate((100, 600, 1_100)):
            clock["ms"] = NOW + i * 1_000
            rt = publisher.observe_positions("rt", {0: reached}, {0: 2_000}, clock["ms"])
        assert rt.falling_per_s == 500.0 and rt.switch_lag == 500
        deadline = time.monotonic() + 5
        while store.written.get("t-v2") != seen[-1] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert InputLag.from_json(store.written["t-v2"].to_json()).falling_per_s == 2_000.0
    finally:
        stop.set()
        publisher.join(5)

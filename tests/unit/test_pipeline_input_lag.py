"""Where a table's query is in its input, from its progress, and its way to Redis; the input lag routers and clients
work out from it and the input's ends."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import orjson

from freshroute.metadata.progress import input_lag_at, InputEnds, InputLag
from pipeline.input_lag import InputLagPublisher, records_behind, source_offsets


def progress(latest: dict[int, int], end: dict[int, int], started: str = "2026-11-27T06:00:00.000Z"):
    def offset(positions: dict[int, int]) -> str:
        return orjson.dumps({"readings": {str(p): o for p, o in positions.items()}}).decode()

    return SimpleNamespace(timestamp=started,
                           sources=[SimpleNamespace(latestOffset=offset(latest), endOffset=offset(end))])


STARTED_MS = 1_795_759_200_000  # 2026-11-27T06:00:00Z


def test_records_behind_are_the_latest_offsets_minus_the_batchs_end():
    assert records_behind(progress({0: 500, 1: 700}, {0: 400, 1: 700})) == 100
    assert records_behind(progress({0: 500}, {0: 500})) == 0
    assert records_behind(SimpleNamespace(sources=[])) is None
    assert records_behind(SimpleNamespace(sources=[SimpleNamespace(latestOffset=None, endOffset="{}")])) is None
    assert source_offsets('{"readings": {"0": 5, "1": 7}}') == {0: 5, 1: 7}


class Store:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.written = fail, {}

    def publish_input_lag(self, table: str, lag: InputLag) -> None:
        if self.fail:
            raise ConnectionError("Redis is down")
        self.written[table] = lag


def test_behind_since_the_last_batch_that_caught_up_and_published_once_redis_answers():
    store, stop = Store(fail=True), threading.Event()
    publisher = InputLagPublisher(store, stop, "redis://x")
    publisher.start()
    try:
        first = publisher.observe("t", progress({0: 10}, {0: 10}))
        assert first.records == 0 and first.ms(first.at_ms + 5000) == 0  # caught up: no lag however late it is read
        assert first.caught_up_ms == STARTED_MS and first.offsets == {0: 10}  # caught up as of the batch's start
        time.sleep(0.01)
        behind = publisher.observe("t", progress({0: 900}, {0: 300}, "2026-11-27T06:00:01.000Z"))
        assert behind.records == 600 and behind.caught_up_ms == first.caught_up_ms  # behind since the batch before
        assert behind.ms(first.caught_up_ms + 2500) == 2500
        time.sleep(0.5)
        assert store.written == {}  # Redis down: nothing lost, kept for later
        store.fail = False
        deadline = time.monotonic() + 5
        while "t" not in store.written and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.written["t"] == behind
    finally:
        stop.set()
        publisher.join(5)


def test_a_running_tables_figures_are_published_again_every_second_and_a_stopped_ones_are_not():
    store, stop = Store(), threading.Event()
    publisher = InputLagPublisher(store, stop, "redis://x")
    publisher.start()
    try:
        for table in ("running", "stopped"):
            publisher.observe(table, progress({0: 10}, {0: 10}))
        first = {t: publisher.latest[t].alive_ms for t in ("running", "stopped")}
        publisher.running(["running"])
        time.sleep(1.6)
        assert store.written["running"].alive_ms >= first["running"] + 1000  # said again, as alive now
        assert store.written["stopped"].alive_ms == first["stopped"]
        assert store.written["running"].caught_up_ms == STARTED_MS  # nothing else changes
    finally:
        stop.set()
        publisher.join(5)


def test_input_lag_round_trips_through_json_and_reads_what_an_older_pipeline_wrote():
    lag = InputLag(12, 1_000, 2_000, {0: 5, 3: 9}, 2_500)
    assert InputLag.from_json(lag.to_json()) == lag and lag.ms(1_750) == 750
    assert InputLag.from_json(b'{"records": 1, "caught_up_ms": 10, "at_ms": 20}') == InputLag(1, 10, 20, {}, 20)
    ends = InputEnds({0: 40, 1: 7}, 3_000)
    assert InputEnds.from_json(ends.to_json()) == ends


def test_the_input_lag_at_a_moment_is_the_inputs_ends_beyond_what_the_pipeline_read():
    lag = InputLag(0, 10_000, 10_100, {0: 100, 1: 50}, 10_100)  # caught up as of 10,000
    assert input_lag_at(lag, InputEnds({0: 100, 1: 50}, 10_200), 10_300) == (0, 0)
    # Input arrived since: behind by it, since the last catch-up — whatever the pipeline last said.
    assert input_lag_at(lag, InputEnds({0: 130, 1: 60}, 10_400), 10_500) == (40, 500)
    # The pipeline stopped at 10,100 and the input keeps growing: both grow with nothing from the pipeline.
    assert input_lag_at(lag, InputEnds({0: 400, 1: 60}, 14_900), 15_000) == (310, 5_000)
    # The pipeline read further than the ends last read say (they are older than its batch): not negative.
    assert input_lag_at(lag, InputEnds({0: 90, 1: 50}, 10_050), 10_300) == (0, 0)


def test_without_fresh_input_ends_a_running_pipeline_is_taken_at_its_word_and_a_silent_one_is_never_fresh():
    lag = InputLag(0, 10_000, 10_100, {0: 100}, 12_000)
    stale = InputEnds({0: 500}, 5_000)
    assert input_lag_at(lag, None, 13_000) == (0, 0)  # alive (spoke at 12,000), caught up by its account
    assert input_lag_at(lag, stale, 13_000) == (0, 0)  # ends too old to go by
    assert input_lag_at(lag, None, 16_000) == (0, 6_000)  # silent since 12,000: as old as its last catch-up
    assert input_lag_at(None, None, 16_000) == (0, 0)  # no query publishes for the table (not a pipeline's)

"""How far a table is behind its input, from its query's progress, and its way to Redis."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import orjson

from freshroute.metadata import InputLag
from pipeline.input_lag import InputLagPublisher, records_behind


def progress(latest: dict[int, int], end: dict[int, int], jvm: bool = False):
    def offset(positions: dict[int, int]) -> str:
        parts = {str(p): o for p, o in positions.items()}
        return orjson.dumps({"readings": parts} if jvm else {"topic_id": "abc", "partitions": parts}).decode()

    return SimpleNamespace(sources=[SimpleNamespace(latestOffset=offset(latest), endOffset=offset(end))])


def test_records_behind_are_the_latest_offsets_minus_the_batchs_end_in_either_sources_format():
    assert records_behind(progress({0: 500, 1: 700}, {0: 400, 1: 700})) == 100
    assert records_behind(progress({0: 500}, {0: 500}, jvm=True)) == 0
    assert records_behind(SimpleNamespace(sources=[])) is None
    assert records_behind(SimpleNamespace(sources=[SimpleNamespace(latestOffset=None, endOffset="{}")])) is None


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
        time.sleep(0.01)
        behind = publisher.observe("t", progress({0: 900}, {0: 300}))
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


def test_input_lag_round_trips_through_json():
    lag = InputLag(12, 1_000, 2_000)
    assert InputLag.from_json(lag.to_json()) == lag and lag.ms(1_750) == 750

"""Window definitions, how windows are keyed in the changelog, and when one is final or expired."""

from __future__ import annotations

import datetime as dt

import pytest

from freshroute.metadata.tables import TableSpec
from freshroute.windows import (WATERMARK_KEY, WindowSpec, duration_ms, hopping, key_range, live_starts,
                                split_window_key, tumbling, window_key, windows_of)


def test_durations_in_every_accepted_form():
    assert duration_ms(250, "x") == 250
    assert duration_ms("10s", "x") == duration_ms("10 seconds", "x") == 10_000
    assert duration_ms("5 min", "x") == 300_000 and duration_ms("1h", "x") == 3_600_000
    assert duration_ms(dt.timedelta(seconds=1.5), "x") == 1500
    for bad in ("ten seconds", "10 fortnights", 1.5, True, None):
        with pytest.raises(ValueError, match="x must be a duration"):
            duration_ms(bad, "x")


def test_a_window_definition_that_cannot_work_is_refused():
    with pytest.raises(ValueError, match="slide .* must not exceed its size"):
        hopping("10s", "20s")
    with pytest.raises(ValueError, match="size must be positive"):
        tumbling(0)
    with pytest.raises(ValueError, match="negative"):
        tumbling("10s", grace=-1)
    assert tumbling("10s").tumbling and not hopping("10s", "5s").tumbling


def test_window_keys_sort_by_key_then_start_and_split_back():
    keys = [window_key(k, s) for k, s in ((b"a", 20_000), (b"a!", 0), (b"a", 10_000), (b"", 5))]
    assert [split_window_key(k) for k in sorted(keys)] == [(b"", 5), (b"a", 10_000), (b"a", 20_000), (b"a!", 0)]
    assert all(k.decode("utf-8") for k in keys)  # valid UTF-8, as every changelog key is
    assert split_window_key(WATERMARK_KEY) is None and split_window_key(b"plain") is None
    lo, hi = key_range(b"a", 10_000, 20_000)
    assert [k for k in sorted(keys) if lo <= k < hi] == [window_key(b"a", 10_000)]


def test_final_at_the_end_and_expired_after_retention():
    w = tumbling("10s", grace="5s", retention="1m")
    assert not w.final(0, 9_999) and w.final(0, 10_000)
    assert not w.expired(0, 69_999) and w.expired(0, 70_000)
    assert w.windows_in(0, 10_000) == 1 and w.windows_in(0, 10_001) == 2 and w.windows_in(5, 5) == 0
    assert hopping("10s", "2s").windows_in(0, 10_000) == 5


def test_live_starts_keep_windows_in_range_that_have_not_expired():
    keep = live_starts(10_000, 40_000, 20_000, watermark_ms=45_000)  # life = size 10 s + retention 10 s
    assert [s for s in (0, 10_000, 20_000, 30_000, 40_000) if keep(window_key(b"k", s))] == [30_000]
    assert not keep(WATERMARK_KEY) and live_starts(0, 10, 1, None)(window_key(b"k", 0))


def test_windows_of_a_key_skip_other_keys_sharing_its_range_bytes():
    w = tumbling("10s", retention="1h")
    rows = [(window_key(b"k", 0), b'{"n":1}'), (b"k\x00" + b"0" * 15 + b"x\x00" + b"0" * 16, b'{"n":9}'),
            (window_key(b"k", 10_000), b'{"n":2}')]
    got = list(windows_of(w, b"k", rows, 12_000))
    assert [(x.start, x.end, x.final) for x in got] == [(0, 10_000, True), (10_000, 20_000, False)]


def test_a_table_spec_carries_its_window_through_json_and_ignores_fields_it_does_not_know():
    spec = TableSpec("w", "w-changelog", 4, "sensor", {"count": "bigint"}, window=hopping("1m", "10s", grace="5s"))
    assert TableSpec.from_json(spec.to_json()) == spec
    assert TableSpec.from_json(b'{"name":"t","topic":"t-c","partitions":2,"key_column":"k","added_later":1}').window is None
    assert WindowSpec.from_dict(spec.window.to_dict()) == spec.window

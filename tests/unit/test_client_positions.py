"""Monotonic reads: the bound a read sends is at least as fresh as every answer seen of its table."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from freshroute.bound import NO_BOUND, Bound
from freshroute.client.positions import Positions
from freshroute.errors import InvalidArgument
from freshroute.position import Position


def answer(table: str, partition: int, applied: int) -> SimpleNamespace:
    return SimpleNamespace(table=table, partition=partition, applied_offset=applied)


def test_a_read_of_no_bound_sends_the_position_seen_and_a_newer_answer_moves_it():
    p = Positions()
    assert p.bound("t", None, {}) is NO_BOUND  # nothing seen yet
    p.saw([answer("t", 0, 5), answer("t", 1, 7), answer("u", 0, 9)])
    first = p.bound("t", None, {})
    assert first == Bound(min_position=Position("t", {0: 5, 1: 7}))
    assert p.bound("t", None, {}) is first  # kept while nothing moves
    p.saw([answer("t", 0, 4)])  # older than what was seen: nothing moves
    assert p.bound("t", None, {}) is first
    p.saw([answer("t", 1, 8)])
    assert p.bound("t", None, {}) == Bound(min_position=Position("t", {0: 5, 1: 8}))
    assert p.bound("u", None, {}) == Bound(min_position=Position("u", {0: 9}))


def test_a_batch_notes_each_partitions_highest_answer_whatever_their_order_and_its_errors():
    p = Positions()
    batch = [answer("t", 1, 5), answer("t", 1, 9), answer("t", 2, 3), answer("t", 1, 5), answer("t", 2, 3)]
    assert p.seen_all(batch) is batch
    assert p.bound("t", None, {}) == Bound(min_position=Position("t", {1: 9, 2: 3}))
    p.seen_all([answer("t", 2, 6), InvalidArgument("no key"), answer("t", 1, 4)])  # an error has no position
    assert p.bound("t", None, {}) == Bound(min_position=Position("t", {1: 9, 2: 6}))


def test_a_callers_bound_and_shorthands_keep_their_limits_and_merge_their_position():
    p = Positions()
    p.saw([answer("t", 0, 5), answer("t", 1, 7)])
    assert p.bound("t", None, {"max_lag": 3}) == Bound(max_lag=3, min_position=Position("t", {0: 5, 1: 7}))
    mine = Bound(max_staleness_ms=100, min_position=Position("t", {0: 9}))
    assert p.bound("t", mine, {}) == Bound(max_staleness_ms=100, min_position=Position("t", {0: 9, 1: 7}))
    # A position of another table is the caller's mistake, left for the table's check to refuse.
    other = Bound(min_position=Position("u", {0: 1}))
    assert p.bound("t", other, {}) is other


def test_a_client_without_monotonic_reads_keeps_nothing():
    p = Positions(keep=False)
    p.saw([answer("t", 0, 5)])
    assert p.bound("t", None, {}) is NO_BOUND


def test_no_thread_is_sent_a_position_older_than_one_it_saw():
    p = Positions()
    stale: list[tuple[int, int]] = []

    def reader(partition: int) -> None:
        for applied in range(1, 2001):
            p.saw([answer("t", partition, applied)])
            sent = p.bound("t", None, {}).min_position
            if sent is None or sent.offset_for(partition) < applied:
                stale.append((partition, applied))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert stale == []
    assert p.bound("t", None, {}).min_position == Position("t", {i: 2000 for i in range(4)})


def test_a_table_answered_by_another_version_is_sent_that_versions_position():
    positions = Positions()
    positions.saw([answer("t", 0, 10)])
    positions.saw([answer("t-v2", 0, 3)])  # switched: version 2 answers reads of t now
    assert positions.bound("t", None, {}).min_position == Position("t-v2", {0: 3})
    positions.saw([answer("t", 0, 11)])  # rolled back
    assert positions.bound("t", None, {}).min_position == Position("t", {0: 11})

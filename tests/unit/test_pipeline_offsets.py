"""Offset math of the pipeline's Kafka source: checkpoint form, batch ranges, admission control, data loss."""

from __future__ import annotations

import json
import random

import pytest

from pipeline import offsets as off
from pipeline.offsets import InputDataLost, SourceOffset, TopicSnapshot


def so(positions: dict[int, int], topic_id: str = "tid") -> SourceOffset:
    return SourceOffset(topic_id, positions)


# checkpoint form

def test_offset_serializes_with_string_partition_keys_in_partition_order():
    d = so({10: 5, 2: 7, 0: 1}).to_dict()
    assert d == {"topic_id": "tid", "partitions": {"0": 1, "2": 7, "10": 5}}
    assert list(d["partitions"]) == ["0", "2", "10"]  # numeric order, not "10" < "2"


def test_offset_survives_the_checkpoint_json_round_trip_unchanged():
    d = so({3: 30, 1: 10, 0: 0}).to_dict()
    text = json.dumps(d)
    back = SourceOffset.from_dict(json.loads(text))
    assert back == so({0: 0, 1: 10, 3: 30})
    # Spark compares offsets by their JSON: the same positions give the same text.
    assert json.dumps(back.to_dict()) == text


def test_offset_from_foreign_checkpoint_fails_clearly():
    with pytest.raises(InputDataLost, match="not a freshroute Kafka offset"):
        SourceOffset.from_dict({"0": 5})
    with pytest.raises(InputDataLost):
        SourceOffset.from_dict({"topic_id": "x", "partitions": {"a": 1}})


def test_missing_topic_id_reads_as_empty():
    assert SourceOffset.from_dict({"partitions": {"1": 4}}) == SourceOffset("", {1: 4})


# ranges and grouping

def test_ranges_are_non_empty_and_half_open():
    start = so({0: 10, 1: 20, 2: 5})
    end = so({0: 15, 1: 20, 2: 9})
    assert off.ranges(start, end) == [(0, 10, 15), (2, 5, 9)]
    assert off.total_rows(start, end) == 5 + 4


def test_a_partition_new_in_the_end_contributes_nothing_to_this_batch():
    start = so({0: 10})
    end = so({0: 15, 1: 7})
    assert off.ranges(start, end) == [(0, 10, 15)]
    assert off.total_rows(start, end) == 5


def test_group_ranges_packs_into_at_most_tasks_balanced_groups():
    parts = [(0, 0, 100), (1, 0, 90), (2, 0, 10), (3, 0, 5), (4, 0, 1)]
    groups = off.group_ranges(parts, 2)
    assert len(groups) == 2
    flat = sorted(r for g in groups for r in g)
    assert flat == sorted(parts)
    loads = sorted(sum(hi - lo for _, lo, hi in g) for g in groups)
    assert loads == [101, 105]
    assert all(list(g) == sorted(g) for g in groups)  # each task reads its partitions in order


def test_group_ranges_never_makes_empty_groups():
    assert off.group_ranges([], 4) == []
    assert off.group_ranges([(0, 0, 3)], 4) == [((0, 0, 3),)]


# what is available

def test_available_takes_each_end_and_new_partitions_join_at_their_log_start():
    snap = TopicSnapshot("tid", low={0: 0, 1: 0, 2: 7}, end={0: 50, 1: 40, 2: 9})
    latest = off.available(so({0: 10, 1: 40}), snap)
    assert latest == so({0: 50, 1: 40, 2: 7})
    # ... and are read from there by the next batch.
    assert off.available(latest, snap) == so({0: 50, 1: 40, 2: 9})
    assert off.ranges(latest, off.available(latest, snap)) == [(2, 7, 9)]


def test_available_never_moves_a_position_back_on_an_uncertain_end():
    snap = TopicSnapshot("tid", low={0: 0}, end={0: 3}, uncertain=frozenset({0}))
    assert off.available(so({0: 10}), snap) == so({0: 10})


def test_available_now_target_caps_every_partition():
    snap = TopicSnapshot("tid", low={0: 0, 1: 0}, end={0: 500, 1: 500})
    latest = off.available(so({0: 10, 1: 300}), snap, target={0: 100, 1: 200})
    # Partition 1 is already past its target: it stays where it is, never goes back.
    assert latest == so({0: 100, 1: 300})


# data loss

def test_end_below_checkpoint_is_reported_not_skipped():
    snap = TopicSnapshot("tid", low={0: 0, 1: 0}, end={0: 100, 1: 3})
    with pytest.raises(InputDataLost, match=r"partition 1 of input topic readings ends at offset 3, below the "
                                            r"checkpoint's 40.*delete /ck"):
        off.check_progress(so({0: 10, 1: 40}), snap, "readings", "delete /ck")


def test_uncertain_end_below_checkpoint_is_not_data_loss():
    snap = TopicSnapshot("tid", low={0: 0}, end={0: 3}, uncertain=frozenset({0}))
    off.check_progress(so({0: 40}), snap, "readings")


def test_recreated_topic_is_data_loss_even_when_its_ends_are_higher():
    snap = TopicSnapshot("new-id", low={0: 0}, end={0: 10_000})
    with pytest.raises(InputDataLost, match="recreated"):
        off.check_progress(so({0: 40}, topic_id="old-id"), snap, "readings")


def test_topic_recreated_before_anything_was_read_is_adopted():
    snap = TopicSnapshot("new-id", low={0: 0}, end={0: 10})
    start = so({0: 0}, topic_id="old-id")
    off.check_progress(start, snap, "readings")
    assert off.available(start, snap) == so({0: 10}, topic_id="new-id")


def test_vanished_partition_with_progress_is_data_loss_but_unread_one_is_not():
    snap = TopicSnapshot("tid", low={0: 0}, end={0: 10})
    with pytest.raises(InputDataLost, match="partition 1 .* disappeared"):
        off.check_progress(so({0: 1, 1: 5}), snap, "readings")
    off.check_progress(so({0: 1, 1: 0}), snap, "readings")


def test_records_deleted_before_they_were_read_is_data_loss():
    snap = TopicSnapshot("tid", low={0: 50}, end={0: 100})
    with pytest.raises(InputDataLost, match="deleted before they were read"):
        off.check_progress(so({0: 20}), snap, "readings")


def test_healthy_progress_passes():
    snap = TopicSnapshot("tid", low={0: 0, 1: 0}, end={0: 10, 1: 20})
    off.check_progress(so({0: 10, 1: 5}), snap, "readings")


# admission control

def test_split_budget_shares_evenly_when_every_partition_has_enough():
    assert off.split_budget({0: 100, 1: 100, 2: 100, 3: 100}, 40) == {0: 10, 1: 10, 2: 10, 3: 10}


def test_split_budget_gives_small_backlogs_everything_and_shares_the_rest():
    assert off.split_budget({0: 2, 1: 100, 2: 100}, 30) == {0: 2, 1: 14, 2: 14}


def test_split_budget_remainder_goes_to_lowest_partitions():
    assert off.split_budget({0: 100, 1: 100, 2: 100}, 10) == {0: 4, 1: 3, 2: 3}


def test_split_budget_smaller_than_partitions_still_makes_progress():
    assert off.split_budget({0: 0, 1: 5, 2: 5, 3: 5}, 2) == {0: 0, 1: 1, 2: 1, 3: 0}


def test_split_budget_never_exceeds_backlog_or_budget():
    rng = random.Random(7)
    for _ in range(500):
        backlog = {p: rng.choice([0, 1, 2, rng.randrange(1000)]) for p in range(rng.randrange(1, 9))}
        budget = rng.randrange(0, 3000)
        take = off.split_budget(backlog, budget)
        assert all(0 <= take[p] <= backlog[p] for p in backlog)
        assert sum(take.values()) == min(budget, sum(backlog.values()))
        assert take == off.split_budget(dict(reversed(list(backlog.items()))), budget)  # deterministic


def test_limit_cuts_the_batch_to_max_rows_from_start():
    start = so({0: 100, 1: 0, 2: 50})
    latest = so({0: 1100, 1: 10, 2: 1050})
    end = off.limit(start, latest, 500)
    assert end == so({0: 345, 1: 10, 2: 295})
    assert off.total_rows(start, end) == 500


def test_limit_without_max_rows_reads_everything():
    start, latest = so({0: 1}), so({0: 10_000})
    assert off.limit(start, latest, None) == latest


def test_repeated_limited_batches_reach_latest_exactly():
    start = so({0: 0, 1: 0, 2: 0, 3: 0})
    latest = so({0: 1234, 1: 17, 2: 999, 3: 0})
    seen = 0
    for _ in range(100):
        end = off.limit(start, latest, 300)
        seen += off.total_rows(start, end)
        if end == start:
            break
        start = end
    assert start == latest
    assert seen == 1234 + 17 + 999

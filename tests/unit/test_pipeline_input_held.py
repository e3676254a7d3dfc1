"""How far back an input goes on the broker, as a new table version's refusal names it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.input_held import HeldInput, held_input
from pipeline.tables import sql_table


class Message:
    def __init__(self, partition: int, ms: int) -> None:
        self._partition, self._ms = partition, ms

    def error(self):
        return None

    def partition(self) -> int:
        return self._partition

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ms)


class Consumer:
    """A topic's partitions as (low, high) watermarks, and the time of each partition's first record held."""

    def __init__(self, marks: dict[int, tuple[int, int]], first_ms: dict[int, int]) -> None:
        self.marks, self.first_ms = marks, first_ms
        self.assigned: list = []

    def list_topics(self, topic, timeout):
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=dict.fromkeys(self.marks))})

    def get_watermark_offsets(self, tp, timeout, cached):
        return self.marks[tp.partition]

    def assign(self, tps):
        self.assigned = [(tp.partition, tp.offset) for tp in tps]

    def unassign(self):
        self.assigned = []

    def consume(self, num_messages, timeout):
        return [Message(p, self.first_ms[p]) for p, _offset in self.assigned]


def test_an_input_the_broker_holds_whole_is_not_expired_and_is_not_read():
    c = Consumer({0: (0, 10), 1: (0, 0)}, {})
    held = held_input(c, "readings")
    assert held == HeldInput("readings", 2, 0, 0, None) and not held.expired


def test_an_input_retention_has_cut_says_how_far_back_it_goes():
    # 1_764_583_200_000: 2025-12-01 10:00:00 UTC; partition 1 is whole, partition 2 cut to nothing.
    c = Consumer({0: (40, 100), 1: (0, 50), 2: (7, 7), 3: (3, 9)}, {0: 1_764_583_100_000, 1: 1_764_583_000_000,
                                                                    3: 1_764_583_200_000})
    held = held_input(c, "readings")
    assert held == HeldInput("readings", 4, 50, 3, 1_764_583_200_000) and held.expired and c.assigned == []
    assert held.refusal() == (
        "its input has expired from the broker: topic readings holds every record only from 2025-12-01 10:00:00 UTC "
        "on, 50 "
        "record(s) of 3 of its 4 partition(s) are gone (retention or a deletion), so a version computed from it "
        "would lack them; declare the table with versions_from=\"held\" to compute it from what the broker holds")
    assert "holds no record of them now" in HeldInput("readings", 1, 5, 1, None).refusal()


def test_versions_from_takes_beginning_or_held():
    assert sql_table("t", "k", "s", "SELECT k, 1 AS n FROM s", versions_from="held").versions_from == "held"
    with pytest.raises(ValueError, match="table 't': versions_from must be one of 'beginning', 'held', not 'now'"):
        sql_table("t", "k", "s", "SELECT k, 1 AS n FROM s", versions_from="now")

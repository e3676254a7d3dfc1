"""How far back a source's input goes on the broker. A new table version is computed from the input's beginning
(:mod:`pipeline.versions`); where retention, or a deletion of records, has taken that beginning away, the version
would lack rows the served one was computed from, so it is refused before it starts, naming how far back the input
goes — unless its table says to be computed from what the broker holds (``versions_from="held"``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any


@dataclass(frozen=True)
class HeldInput:
    """What the broker holds of an input topic."""

    topic: str
    partitions: int
    deleted: int  # records before the first one held, over every partition
    cut: int  # partitions that have lost records
    whole_from_ms: int | None  # from when it holds every record: the latest first record of a partition cut (None:
    # no record held there, or none read in time)

    @property
    def expired(self) -> bool:
        return self.deleted > 0

    def refusal(self) -> str:
        """Why a version computed from the input's beginning is refused."""
        since = ("holds no record of them now" if self.whole_from_ms is None
                 else f"holds every record only from {_utc(self.whole_from_ms)} on")
        return (f"its input has expired from the broker: topic {self.topic} {since}, {self.deleted:,} record(s) of "
                f"{self.cut} of its {self.partitions} partition(s) are gone (retention or a deletion), so a version "
                f"computed from it would lack them; declare the table with versions_from=\"held\" to compute it from "
                f"what the broker holds")


def held_input(consumer: Any, topic: str, timeout_s: float = 10.0) -> HeldInput:
    """What the broker holds of ``topic``, read with ``consumer`` (its assignment is taken and given back)."""
    from confluent_kafka import TopicPartition

    meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
    if meta.error is not None:
        raise RuntimeError(f"topic {topic}: {meta.error}")
    marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s, cached=False)
             for p in sorted(meta.partitions)}
    cut = {p: low for p, (low, _high) in marks.items() if low > 0}
    firsts = {p: low for p, low in cut.items() if low < marks[p][1]}
    return HeldInput(topic, len(marks), sum(cut.values()), len(cut), _whole_from_ms(consumer, topic, firsts, timeout_s))


def _whole_from_ms(consumer: Any, topic: str, firsts: dict[int, int], timeout_s: float) -> int | None:
    """The latest time among the first records held of the partitions cut (``firsts``: partition → their offsets)."""
    from confluent_kafka import TopicPartition

    if not firsts:
        return None
    consumer.assign([TopicPartition(topic, p, offset) for p, offset in firsts.items()])
    seen: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(seen) < len(firsts) and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=100, timeout=0.2):
                if m.error() is None:
                    seen.setdefault(m.partition(), m.timestamp()[1])
    finally:
        consumer.unassign()
    return max(seen.values()) if seen else None


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

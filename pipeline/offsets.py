"""Offset math of the Kafka source: positions kept in Spark's checkpoint, batch ranges, admission control.

Spark stores each micro-batch's offsets verbatim as JSON, so an offset here is a plain
dict: ``{"topic_id": "…", "partitions": {"0": 120, "1": 97}}``. Partition numbers are
string keys because JSON object keys are strings: a dict with int keys would come back
from the checkpoint with string keys and no longer compare equal. A position is the next
offset to read, so a batch covers ``[start, end)`` of every partition.

Nothing here does I/O; the source feeds it what the broker said.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from freshroute.errors import FatalError


class InputDataLost(FatalError):
    """The input topic no longer holds offsets the checkpoint says were there (or are still to be read)."""

    code = "INPUT_DATA_LOST"


@dataclass(frozen=True)
class TopicSnapshot:
    """What the broker says about the input topic right now."""

    topic_id: str
    low: Mapping[int, int]  # log start offset per partition
    end: Mapping[int, int]  # end offset per partition (never above the true end)
    # Partitions whose end is only a lower bound (the broker did not confirm the true end
    # in time): they may not prove data loss, only bound what can be read.
    uncertain: frozenset[int] = frozenset()


@dataclass(frozen=True)
class SourceOffset:
    """Next offset to read per partition of one topic, as kept in Spark's checkpoint."""

    topic_id: str
    positions: Mapping[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # Canonical order: Spark compares offsets by their JSON, so the same positions
        # must always serialize the same way or an empty batch would look like new data.
        return {"topic_id": self.topic_id,
                "partitions": {str(p): int(self.positions[p]) for p in sorted(self.positions)}}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "SourceOffset":
        try:
            parts = raw["partitions"]
            return cls(str(raw.get("topic_id", "")), {int(p): int(o) for p, o in parts.items()})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InputDataLost(f"checkpointed source offset {dict(raw)!r} is not a freshroute Kafka offset: {e}") from None


def total_rows(start: SourceOffset, end: SourceOffset) -> int:
    """Offsets between two positions (an upper bound of records: compaction and markers leave gaps)."""
    return sum(max(0, end.positions[p] - start.positions.get(p, end.positions[p])) for p in end.positions)


def ranges(start: SourceOffset, end: SourceOffset) -> list[tuple[int, int, int]]:
    """Non-empty ``(partition, from, until)`` ranges of one batch, in partition order."""
    out = []
    for p in sorted(end.positions):
        hi = end.positions[p]
        lo = start.positions.get(p, hi)  # a partition new in this batch joins at ``hi``
        if hi > lo:
            out.append((p, lo, hi))
    return out


def group_ranges(parts: list[tuple[int, int, int]], tasks: int) -> list[tuple[tuple[int, int, int], ...]]:
    """Pack ranges into at most ``tasks`` groups of similar size (largest first onto the lightest group).

    Each Spark task has a fixed cost well above reading a few thousand records, so a batch
    is read by about as many tasks as there are cores rather than one per partition.
    """
    if not parts:
        return []
    n = max(1, min(tasks, len(parts)))
    groups: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    load = [0] * n
    for r in sorted(parts, key=lambda r: (-(r[2] - r[1]), r[0])):
        i = min(range(n), key=lambda j: (load[j], j))
        groups[i].append(r)
        load[i] += r[2] - r[1]
    return [tuple(sorted(g)) for g in groups if g]


def check_progress(start: SourceOffset, snapshot: TopicSnapshot, topic: str, hint: str = "") -> None:
    """Raise :class:`InputDataLost` when the broker lost data the checkpoint still points into.

    A memory-only broker that restarted, a topic deleted and recreated, or retention that
    deleted records not read yet: each would otherwise make the pipeline skip or re-read
    records without a word.
    """
    suffix = f" {hint}" if hint else ""
    progressed = any(pos > 0 for pos in start.positions.values())
    # A topic recreated before anything was read from it lost nothing: the new one is adopted.
    if progressed and start.topic_id and snapshot.topic_id and start.topic_id != snapshot.topic_id:
        raise InputDataLost(f"input topic {topic} was recreated (topic id {start.topic_id} in the checkpoint, "
                            f"{snapshot.topic_id} now): the records the checkpoint refers to are gone.{suffix}",
                            topic=topic)
    for p, pos in sorted(start.positions.items()):
        if p not in snapshot.end:
            if pos > 0:
                raise InputDataLost(f"partition {p} of input topic {topic} disappeared while the checkpoint is at "
                                    f"offset {pos}.{suffix}", topic=topic, partition=p)
            continue
        if snapshot.end[p] < pos and p not in snapshot.uncertain:
            raise InputDataLost(f"partition {p} of input topic {topic} ends at offset {snapshot.end[p]}, below the "
                                f"checkpoint's {pos}: the broker lost data (a memory-only broker restarted?).{suffix}",
                                topic=topic, partition=p, end=snapshot.end[p], checkpoint=pos)
        if snapshot.low.get(p, 0) > pos:
            raise InputDataLost(f"partition {p} of input topic {topic} starts at offset {snapshot.low[p]}, above the "
                                f"checkpoint's {pos}: records were deleted before they were read.{suffix}",
                                topic=topic, partition=p, low=snapshot.low[p], checkpoint=pos)


def available(start: SourceOffset, snapshot: TopicSnapshot, target: Mapping[int, int] | None = None) -> SourceOffset:
    """Everything readable now: each partition's end, capped at ``target``.

    A partition the start does not know yet joins at its log start and contributes no
    records to this batch (Spark plans the batch from the start dict, which has no position
    for it); the next batch reads it from there.
    """
    positions: dict[int, int] = {}
    for p, end in snapshot.end.items():
        if p not in start.positions:
            positions[p] = snapshot.low.get(p, 0)
            continue
        pos = start.positions[p]
        end = max(end, pos)  # an end not yet known precisely never moves a position back
        if target is not None:
            end = min(end, max(target.get(p, pos), pos))
        positions[p] = end
    for p, pos in start.positions.items():
        positions.setdefault(p, pos)
    return SourceOffset(snapshot.topic_id or start.topic_id, positions)


def split_budget(backlog: Mapping[int, int], budget: int) -> dict[int, int]:
    """Share ``budget`` records among partitions with ``backlog`` records each, as evenly as possible.

    Water-filling: partitions with less backlog than an even share take all of it and the
    rest is shared among the others; what does not divide evenly goes to the lowest
    partition numbers, so the split is deterministic. Every partition with backlog gets at
    least one record while the budget lasts, so a small budget never stalls a partition.
    """
    take = {p: 0 for p in backlog}
    remaining = max(0, budget)
    pending = sorted((p for p, n in backlog.items() if n > 0), key=lambda p: (backlog[p], p))
    while pending and remaining > 0:
        share = remaining // len(pending)
        if share == 0:
            for p in sorted(pending)[:remaining]:
                take[p] += 1
            break
        smallest = pending[0]
        need = backlog[smallest] - take[smallest]
        if need <= share:
            # The smallest backlog fits: give it all and re-share the rest.
            take[smallest] += need
            remaining -= need
            pending.pop(0)
            continue
        for p in pending:
            take[p] += share
        remaining -= share * len(pending)
        pending = [p for p in pending if take[p] < backlog[p]]
    return take


def limit(start: SourceOffset, latest: SourceOffset, max_rows: int | None) -> SourceOffset:
    """The end of the next batch: ``latest``, or fewer than ``max_rows`` offsets past ``start`` when set."""
    if max_rows is None:
        return latest
    backlog = {p: max(0, latest.positions[p] - start.positions.get(p, latest.positions[p])) for p in latest.positions}
    take = split_budget(backlog, max_rows)
    positions = {p: latest.positions[p] - backlog[p] + take[p] for p in latest.positions}
    return SourceOffset(latest.topic_id, positions)

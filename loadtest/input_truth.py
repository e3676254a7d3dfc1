"""Check (f), input-lag labels are true: an answer's ``input_lag.ms`` never claims more of the input than the table's
changelog had reflected.

An answer sent at ``t`` (the recording's ``ts_ms``) labelled ``input_lag.ms = I`` claims that the table had reflected
every input record that was in its input at ``t − I``. What a table has reflected is read off its changelog as the
pipeline's follower reads it: a row's input position header holds, per input partition, the offset of the latest input
record folded into it (the record's own offset, not the next one: the follower takes ``offset + 1`` as where the table
has got, and (d)'s ``input_position.reflects`` holds a write at offset ``o`` reflected by a header ``>= o``). So by time
T the table has reflected, in input partition ``p``, every record up to the largest ``p`` offset of the headers of the
changelog records appended by T (their timestamps: the pipeline's changelogs keep ``LogAppendTime``).

A record that produces no row (filtered, or rejected to a dead letter) moves no header, and the follower may get past it
by a checkpoint or a dead letter this checker does not read, long before any later record's row appears; so an
unreflected record refutes a label only if it itself produced a row (its offset is a header value somewhere in the
changelog read), because the query flushes a record's rows before it checkpoints past it. That is tighter than "a later
record of its partition was reflected eventually": such a later record may have arrived only after ``t − I``, while the
checkpoint had already, and rightly, taken the table past the filtered one.

A record is refuted when its input timestamp is at least ``I`` plus a slack before the request (the store's input ends
may be a moment old, and an input timestamp set by its producer precedes its append) and no changelog record appended by
the time the answer came back reflects it. A changelog record that compaction removed may have reflected it in that
time; where the read shows such a gap, the label is counted as unverifiable rather than refuted. A null ``input_lag.ms``
(unknown) claims nothing and is never refuted.
"""

from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

from freshroute import input_position
from loadtest.label_truth import LABEL_SLACK_MS, Timeline


class Changelog(Protocol):
    """What (f) reads of the changelog read back (:class:`loadtest.consistency.Changelog`)."""

    partitions: int
    end_offsets: dict[int, int]

    def present(self, partition: int) -> Sequence[int]: ...

    def timeline(self, partition: int) -> Timeline | None: ...

    def positions(self) -> Iterator[tuple[int, int, bytes]]: ...

_NEVER = 1 << 62  # later than any time: an interval open at its end


@dataclass
class InputLog:
    """A table's input topic as read back: per input partition its offsets in order, each with its record timestamp."""

    topic: str
    offsets: dict[int, array[int]] = field(default_factory=dict)
    timestamps: dict[int, array[int]] = field(default_factory=dict)

    @classmethod
    def from_records(cls, topic: str, records: Iterable[tuple[int, int, int | None]]) -> "InputLog":
        """Build from ``(partition, offset, timestamp ms)``; a record without a timestamp cannot date anything and is
        left out."""
        log = cls(topic)
        for p, offset, ms in sorted(records, key=lambda r: (r[0], r[1])):
            if ms is not None:
                log.offsets.setdefault(p, array("q")).append(offset)
                log.timestamps.setdefault(p, array("q")).append(ms)
        return log

    def timestamp_of(self, partition: int, offset: int) -> int | None:
        """The record's timestamp; None when the read holds no such record (retention deleted it, or it had none)."""
        offsets = self.offsets.get(partition)
        if offsets is None:
            return None
        i = bisect.bisect_left(offsets, offset)
        return self.timestamps[partition][i] if i < len(offsets) and offsets[i] == offset else None


def read_input(bootstrap: str, topic: str, timeout_s: float = 120.0, kafka_config: dict[str, Any] | None = None,
               progress: Callable[[int, int, int], None] | None = None) -> InputLog:
    """Read every partition of the input ``topic`` from offset 0 to its end, as ``read_changelog`` reads a changelog."""
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

    from freshroute.changelog_reader import consume_to_end

    rows: list[tuple[int, int, int | None]] = []

    def keep(m: Any) -> None:
        kind, ms = m.timestamp()
        rows.append((m.partition(), m.offset(), None if kind == TIMESTAMP_NOT_AVAILABLE else ms))

    consume_to_end(bootstrap, topic, keep, timeout_s, kafka_config, progress)
    return InputLog.from_records(topic, rows)


@dataclass
class _Partition:
    """One input partition: how far the changelog reflected it over time, and the records that produced rows."""

    times: array[int] = field(default_factory=lambda: array("q"))  # when the reflected offset rose, ascending
    reached: array[int] = field(default_factory=lambda: array("q"))  # the largest offset reflected from then on
    # The input records that produced a row (a header's value), with input timestamps, in offset order; and for each
    # index the oldest of the records from there on (timestamp, offset), so that one bisect finds the oldest record
    # past a reflected offset.
    produced: array[int] = field(default_factory=lambda: array("q"))
    oldest_ms: array[int] = field(default_factory=lambda: array("q"))
    oldest_offset: array[int] = field(default_factory=lambda: array("q"))

    def reflected_by(self, ms: int) -> int:
        """The largest input offset reflected by changelog records appended by ``ms`` (-1: none)."""
        i = bisect.bisect_right(self.times, ms)
        return self.reached[i - 1] if i else -1

    def first_reflecting(self, offset: int) -> int | None:
        """When the changelog first reflected the input record at ``offset`` (None: never, in the read)."""
        i = bisect.bisect_left(self.reached, offset)
        return self.times[i] if i < len(self.times) else None

    def oldest_unreflected(self, reflected: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the oldest record past ``reflected`` that produced a row (None: none)."""
        i = bisect.bisect_right(self.produced, reflected)
        return (self.oldest_ms[i], self.oldest_offset[i]) if i < len(self.produced) else None


@dataclass
class InputTruth:
    """What a table's changelog says it had reflected of its input, and when: built once, one bisect per answer."""

    partitions: dict[int, _Partition]
    # Disjoint, ascending time intervals in which a changelog record the read lacks (compaction) was appended.
    unknown_from: list[int]
    unknown_to: list[int]

    @classmethod
    def of(cls, changelog: Changelog, inputs: InputLog) -> "InputTruth | None":
        """None when a changelog record has no timestamp: then when it reflected its input is not known."""
        dated: dict[int, tuple[array[int], array[int]]] = {}
        intervals: list[tuple[int, int]] = []
        for c in range(changelog.partitions):
            present = changelog.present(c)
            timeline = changelog.timeline(c)
            if present and (timeline is None or len(timeline.offsets) != len(present)):
                return None
            end = changelog.end_offsets.get(c, 0)
            if timeline is None:
                if end:
                    intervals.append((-_NEVER, _NEVER))
                continue
            dated[c] = (timeline.offsets, timeline.there_by_ms)
            offsets, times = timeline.offsets, timeline.there_by_ms
            if offsets[0] > 0:
                intervals.append((-_NEVER, times[0]))
            for i in range(1, len(offsets)):
                if offsets[i] - offsets[i - 1] > 1:
                    intervals.append((times[i - 1], times[i]))
            if end > offsets[-1] + 1:
                intervals.append((times[-1], _NEVER))
        events: dict[int, list[tuple[int, int]]] = {}  # input partition → (appended ms, offset reflected)
        for c, offset, header in changelog.positions():
            position = input_position.decode(header)
            if position is None or c not in dated:
                continue
            offsets, times = dated[c]
            appended = times[bisect.bisect_left(offsets, offset)]
            for p, o in enumerate(position):
                if o is not None:
                    events.setdefault(p, []).append((appended, o))
        partitions: dict[int, _Partition] = {}
        for p, seen in events.items():
            part = partitions[p] = _Partition()
            for appended, o in sorted(seen):
                if not part.reached or o > part.reached[-1]:
                    if part.times and part.times[-1] == appended:
                        part.reached[-1] = o
                    else:
                        part.times.append(appended)
                        part.reached.append(o)
            produced = sorted({o for _, o in seen})
            stamped = [(o, ms) for o in produced if (ms := inputs.timestamp_of(p, o)) is not None]
            oldest = (_NEVER, -1)
            suffix: list[tuple[int, int]] = []
            for o, ms in reversed(stamped):
                oldest = min(oldest, (ms, o))
                suffix.append(oldest)
            suffix.reverse()
            part.produced.extend(o for o, _ in stamped)
            part.oldest_ms.extend(ms for ms, _ in suffix)
            part.oldest_offset.extend(o for _, o in suffix)
        intervals.sort()
        merged: list[list[int]] = []
        for lo, hi in intervals:
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        return cls(partitions, [lo for lo, _ in merged], [hi for _, hi in merged])

    def unknown_between(self, from_ms: int, to_ms: int) -> bool:
        """Whether a changelog record the read lacks may have been appended between ``from_ms`` and ``to_ms``."""
        i = bisect.bisect_left(self.unknown_to, from_ms)
        return i < len(self.unknown_to) and self.unknown_from[i] <= to_ms


def check_input_label(rec: dict[str, Any], truth: InputTruth | None,
                      slack_ms: int = LABEL_SLACK_MS) -> tuple[int, int, list[tuple[str, str]]]:
    """(1 if the answer's input-lag label was checked, 1 if compaction left it undecided, (kind, message) of its
    refutation).

    An answer without a send time or an input-lag label, or a table whose changelog or input was read without what
    dates them (``truth`` None), leaves nothing to check.
    """
    sent_ms = rec.get("ts_ms")
    behind_ms = (rec.get("input_lag") or {}).get("ms")
    if truth is None or sent_ms is None or behind_ms is None:
        return 0, 0, []
    # The label was worked out between sending and the answer's return: what was appended by then may back it.
    answered_ms = sent_ms + math.ceil(rec.get("latency_ms") or 0)
    cutoff_ms = sent_ms - behind_ms - slack_ms
    worst: tuple[int, int, int] | None = None  # (timestamp, input partition, offset) of the oldest refuting record
    undecided = False
    for p, part in truth.partitions.items():
        oldest = part.oldest_unreflected(part.reflected_by(answered_ms))
        if oldest is None or oldest[0] > cutoff_ms:
            continue
        ms, offset = oldest
        # A row reflecting it comes after the record is in the input: only a gap from then may hide one.
        if truth.unknown_between(ms - slack_ms, answered_ms):
            undecided = True
        elif worst is None or (ms, p) < worst[:2]:
            worst = (ms, p, offset)
    if worst is None:
        return (0, 1, []) if undecided else (1, 0, [])
    ms, p, offset = worst
    first = truth.partitions[p].first_reflecting(offset)
    later = f", which reflects it only from {first - sent_ms} ms after the request" if first is not None else ""
    return 1, 0, [("input_lag_label", f"labelled {behind_ms} ms behind its input, but input partition {p}'s record at "
                                      f"offset {offset} ({sent_ms - ms} ms before the request) was not yet reflected "
                                      f"by the table's changelog{later}")]

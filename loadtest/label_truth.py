"""Check (e), labels are true: an answer's lag label never claims more freshness than the changelog allows.

An answer sent at ``t`` (the recording's ``ts_ms``) at position ``pos`` of its partition claims, with
``lag.offsets = k``, that at most ``k`` changelog records lay past ``pos``, and with ``lag.ms = S``, that its replica
held every record that was in the changelog at ``t − S``. The records' broker timestamps refute either claim: the
offsets label when more than ``k`` records at or past ``pos`` were in the changelog by ``t − slack``, the staleness
label when any was by ``t − S − slack``.

A record's timestamp says when it was in the changelog only where the broker set it: the changelogs the pipeline
creates keep ``LogAppendTime``. (Under CreateTime a record held up in its producer's buffer, by a broker's failover,
would be dated to before it existed, and refute true labels.) Even so it says when the leader appended it, not when
it could be read: a consumer reads up to the high watermark, which passes a record only once every in-sync replica has
it. A record appended while a killed broker was still in sync waits for the cluster to fence that broker (seconds,
more on a loaded machine or when the killed broker was the active controller); until then "0 behind" is the truth of
what anyone can read. A run that killed a broker gives those windows (:meth:`Timeline.held`), as measured.

``LABEL_SLACK_MS`` is how long a label may trail the truth: a replica's end offset is evidence up to its evidence
window old (1 s by default), it learns the end from fetches and statistics a hundred ms apart, and the answer takes
its time to travel.

Counting records rather than subtracting offsets only undercounts: transaction markers and records that compaction
removed make the true lag larger, never smaller. A null label (unknown) claims nothing and is never refuted.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Sequence

# How long a lag label may trail the truth before the changelog refutes it.
LABEL_SLACK_MS = 2000


@dataclass
class Timeline:
    """One partition's records (of any key) in offset order, each with the time by which it was in the changelog.

    That time is the running maximum of the records' timestamps: it keeps the times sorted for ``bisect``, and it
    only ever moves a record later, so a clock that stepped back never makes a record count as there early.
    """

    offsets: array[int] = field(default_factory=lambda: array("q"))
    there_by_ms: array[int] = field(default_factory=lambda: array("q"))

    def append(self, offset: int, timestamp_ms: int) -> None:
        """Add the next record; records come in offset order."""
        self.offsets.append(offset)
        self.there_by_ms.append(max(timestamp_ms, self.there_by_ms[-1]) if self.there_by_ms else timestamp_ms)

    def held(self, windows: Sequence[tuple[int, int]], shown: Sequence[tuple[int, int]] = ()) -> "Timeline":
        """This timeline with each record appended within a window ``(from_ms, until_ms)`` in the changelog only by
        ``until_ms`` (the window's records waited for a dead replica to leave the in-sync set), or by the time an
        answer ``shown`` (position, ms) was past it, if earlier: a replica applies only what could be read."""
        ordered = sorted(shown)
        positions = [position for position, _ in ordered]
        # earliest[i]: the first time an answer was at ordered[i]'s position or past it
        earliest = list(accumulate(reversed([ms for _, ms in ordered]), min))[::-1]
        out = Timeline(array("q", self.offsets))
        for offset, ms in zip(self.offsets, self.there_by_ms):
            there = max([until for start, until in windows if start <= ms <= until], default=ms)
            past = bisect.bisect_right(positions, offset)  # the first answer past the record
            if past < len(earliest):
                there = max(ms, min(there, earliest[past]))
            out.there_by_ms.append(max(there, out.there_by_ms[-1]) if out.there_by_ms else there)
        return out

    def past(self, position: int, by_ms: int) -> tuple[int, int | None]:
        """How many records at or past ``position`` were in the changelog by ``by_ms``, and when the first of them
        was (None when there are none)."""
        first = bisect.bisect_left(self.offsets, position)
        end = bisect.bisect_right(self.there_by_ms, by_ms)
        if end <= first:
            return 0, None
        return end - first, self.there_by_ms[first]


def check_labels(rec: dict[str, Any], position: int, timeline: Timeline | None,
                 slack_ms: int = LABEL_SLACK_MS) -> tuple[int, list[tuple[str, str]]]:
    """(how many of the answer's lag labels were checked, (kind, message) of each the changelog refutes).

    ``position`` is the answer's offset in its partition and ``timeline`` that partition's; an answer without a send
    time, or a partition read without timestamps, leaves nothing to check against.
    """
    lag = rec.get("lag") or {}
    sent_ms = rec.get("ts_ms")
    if timeline is None or sent_ms is None:
        return 0, []
    checked = 0
    refuted: list[tuple[str, str]] = []
    behind = lag.get("offsets")
    if behind is not None:
        checked += 1
        n, _ = timeline.past(position, sent_ms - slack_ms)
        if n > behind:
            refuted.append(("lag_label", f"labelled {behind} offsets behind, but {n} records past its position were "
                                         f"in the changelog {slack_ms} ms before the request"))
    stale_ms = lag.get("ms")
    if stale_ms is not None:
        checked += 1
        n, first_ms = timeline.past(position, sent_ms - stale_ms - slack_ms)
        if n > 0 and first_ms is not None:
            refuted.append(("staleness_label", f"labelled {stale_ms} ms stale, but {n} records past its position "
                                               f"were in the changelog {stale_ms + slack_ms} ms before the request "
                                               f"(the first of them {sent_ms - first_ms} ms before)"))
    return checked, refuted

"""What the cluster's heartbeats say, read incrementally: which nodes exist, when each was
last heard from, and their latest reports.

A reader (a router, the assignor) keeps a :class:`NodeFeed`. Each poll reads every node's
beat time (an id and a number each) and the ids whose report changed since the last poll,
then only those reports: at a thousand nodes a poll moves kilobytes, not megabytes. A bad
report — malformed, of an unknown version, too large, or naming another node — is skipped
and counted, with at most one warning per reason per interval: one broken node never
stalls a reader, and never floods its log.

Liveness is judged on the reader's clock (:class:`Liveness`): a beat stamped in the future
(a node whose clock is ahead) counts as heard now, so such a node, once dead, is dead one
expiry after its last beat like any other.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any, Callable, Iterable, Mapping

import orjson

from freshroute.metadata import MAX_REPORT_BYTES, Keys, NodeReport, OversizedReport, UnknownReportVersion, text

log = logging.getLogger("freshroute.heartbeats")


class Rejections:
    """Bad heartbeats skipped, by reason: counted always, warned about at most once per interval per reason."""

    def __init__(self, reader: str, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.counts: Counter[str] = Counter()
        self._reader = reader
        self._interval_s = interval_s
        self._clock = clock
        self._unwarned: Counter[str] = Counter()
        self._warned_at: dict[str, float] = {}

    def count(self, reason: str, node: str, detail: str) -> None:
        self.counts[reason] += 1
        self._unwarned[reason] += 1
        now = self._clock()
        if now - self._warned_at.get(reason, float("-inf")) >= self._interval_s:
            log.warning("%s: skipped %d %s heartbeat(s) in the last %.0fs; latest from node %s: %s",
                        self._reader, self._unwarned[reason], reason, self._interval_s, node, detail[:200])
            self._unwarned[reason] = 0
            self._warned_at[reason] = now


class Liveness:
    """When each node was last heard from, on the reader's clock: a beat in the future counts as heard now."""

    def __init__(self) -> None:
        self._beats: dict[str, int] = {}
        self.heard: dict[str, int] = {}

    def observe(self, beats: Mapping[str, int], now: int) -> None:
        for node, beat in beats.items():
            if self._beats.get(node) != beat:
                self._beats[node] = beat
                self.heard[node] = min(beat, now)
        for node in [n for n in self._beats if n not in beats]:
            del self._beats[node]
            del self.heard[node]

    def age(self, node: str, now: int) -> int | None:
        heard = self.heard.get(node)
        return None if heard is None else max(0, now - heard)


class NodeFeed:
    """Every node's latest beat and report, kept current by reading only what changed.

    Used in two steps so that a reader can put its own commands in the same round trips:
    :meth:`ask_changes` / :meth:`changed_ids`, then :meth:`ask_reports` / :meth:`absorb`.
    """

    def __init__(self, rejections: Rejections) -> None:
        self.rejections = rejections
        self.beats: dict[str, int] = {}
        self.reports: dict[str, NodeReport] = {}
        self._seq = 0
        self._next_seq = 0

    def ask_changes(self, pipe: Any, keys: Keys) -> None:
        pipe.hgetall(keys.beats)
        pipe.zrangebyscore(keys.reports, f"({self._seq}", "+inf", withscores=True)

    def changed_ids(self, raw_beats: Mapping[Any, Any], raw_changed: Iterable[tuple[Any, float]]) -> list[str]:
        """Take the beats; returns the nodes whose report must be read."""
        beats: dict[str, int] = {}
        for k, v in raw_beats.items():
            node = text(k)
            try:
                beats[node] = int(v)
            except ValueError:
                self.rejections.count("malformed", node, f"beat {v!r} is not a time in ms")
        self.beats = beats
        ids = []
        for member, score in raw_changed:
            ids.append(text(member))
            self._next_seq = max(self._next_seq, int(score))
        return [i for i in ids if i in beats]

    def ask_reports(self, pipe: Any, keys: Keys, ids: list[str]) -> None:
        for node in ids:
            # Never more than the limit is transferred, whatever a broken node wrote.
            pipe.getrange(keys.node(node), 0, MAX_REPORT_BYTES)

    def absorb(self, ids: list[str], raws: list[bytes]) -> set[str]:
        """Take the reports read; returns the nodes whose report changed or is gone."""
        changed = set()
        for node, raw in zip(ids, raws):
            if not raw:  # expired or removed meanwhile
                if self.reports.pop(node, None) is not None:
                    changed.add(node)
                continue
            report = self._decode(node, raw)
            if report is not None and report != self.reports.get(node):
                self.reports[node] = report
                changed.add(node)
        for node in [n for n in self.reports if n not in self.beats]:
            del self.reports[node]
            changed.add(node)
        self._seq = self._next_seq
        return changed

    def _decode(self, node: str, raw: bytes) -> NodeReport | None:
        try:
            report = NodeReport.from_json(raw)
        except (ValueError, KeyError, TypeError, AttributeError, orjson.JSONDecodeError) as e:
            reason = "oversized" if isinstance(e, OversizedReport) else \
                "unknown-version" if isinstance(e, UnknownReportVersion) else "malformed"
            self.rejections.count(reason, node, f"{type(e).__name__}: {e}")
            return None
        if report.node_id != node:
            self.rejections.count("malformed", node, f"report names node {report.node_id!r}")
            return None
        return report

    def poll(self, redis: Any, keys: Keys) -> set[str]:
        """Read what changed, with a synchronous client; returns the nodes whose report changed or is gone."""
        pipe = redis.pipeline(transaction=False)
        self.ask_changes(pipe, keys)
        ids = self.changed_ids(*pipe.execute())
        raws: list[bytes] = []
        if ids:
            pipe = redis.pipeline(transaction=False)
            self.ask_reports(pipe, keys, ids)
            raws = pipe.execute()
        return self.absorb(ids, raws)

"""What the cluster's heartbeats say, read incrementally: which nodes exist, when each was
last heard from, and their latest reports.

A reader (a router, the assignor) keeps a :class:`NodeFeed`. Each poll reads every node's
beat time (an id and a number each) and the ids whose report changed since the last poll,
then only those reports: at a thousand nodes a poll moves kilobytes, not megabytes. A reader
that routes by lag also follows the positions nodes publish between reports, kept packed
(:class:`freshroute.metadata.reports.NodePositions`) for the views that read them. A bad
report — malformed, of an unknown version, too large, or naming another node — is skipped
and counted, with at most one warning per reason per interval: one broken node never
stalls a reader, and never floods its log.

Liveness is judged on the reader's clock (:class:`Liveness`): a beat stamped in the future
(a node whose clock is ahead) counts as heard now, so such a node, once dead, is dead one
expiry after its last beat like any other.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import orjson

from freshroute.declared import setting
from freshroute.metadata.reports import (MAX_REPORT_BYTES, NODE_ID_PATTERN, NodePositions, NodeReport, OversizedReport,
                                         UnknownReportVersion)
from freshroute.metadata.schema import Keys

log = logging.getLogger("freshroute.heartbeats")

_NODE_ID = re.compile(NODE_ID_PATTERN)

# Many values in one command, never more than the limit of each, whatever a broken node wrote
# (a missing key reads as empty). The node ids go as two space-separated lists and the keys are
# their prefix and id: one argument where there could be a thousand keys to encode.
_READ_BOUNDED = """
local out = {}
for i = 0, 1 do
    for id in string.gmatch(ARGV[3 + 2 * i], '%S+') do
        out[#out + 1] = redis.call('GETRANGE', ARGV[2 + 2 * i] .. id, 0, ARGV[1])
    end
end
return out
"""


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


@dataclass(frozen=True)
class NodeExpiry:
    """When a node is dead: one fact of a deployment, by which routers, clients and the store nodes' assignor all read
    the heartbeats (each embeds this setting)."""

    # Six store-node heartbeats: a node must miss five in a row (a stall of about a second) to be declared dead.
    node_expiry_ms: int = setting(1200, "a node whose heartbeat is older is dead", ge=100)


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
    """Every node's latest beat and report (and, with ``positions``, the positions it published
    since), kept current by reading only what changed.

    Used in two steps so that a reader can put its own commands in the same round trips:
    :meth:`ask_changes` / :meth:`changed_ids`, then :meth:`ask_reports` / :meth:`absorb`.
    """

    def __init__(self, rejections: Rejections, positions: bool = False) -> None:
        self.rejections = rejections
        self.follows_positions = positions
        self.beats: dict[str, int] = {}
        self.reports: dict[str, NodeReport] = {}
        self.positions: dict[str, NodePositions] = {}
        self._seq = 0  # both change logs count in one sequence
        self._next_seq = 0
        self._moved: list[str] = []
        self._moved_since: set[str] = set()  # nodes with new positions not yet taken
        self._names: dict[Any, str] = {}  # node ids as Redis returns them → as text, valid ones only

    def ask_changes(self, pipe: Any, keys: Keys) -> int:
        """Queue the reads of what changed; returns how many replies they make."""
        # The sequence first: everything logged up to it is in the logs read next; what is
        # logged meanwhile may be read twice, never missed.
        pipe.get(keys.reports_seq)
        pipe.hgetall(keys.beats)
        pipe.zrangebyscore(keys.reports, f"({self._seq}", "+inf")
        if self.follows_positions:
            pipe.zrangebyscore(keys.positions, f"({self._seq}", "+inf")
        return 4 if self.follows_positions else 3

    def changed_ids(self, raw_seq: Any, raw_beats: Mapping[Any, Any], raw_changed: Iterable[Any],
                    raw_moved: Iterable[Any] = ()) -> list[str]:
        """Take the beats; returns the nodes whose report must be read."""
        beats: dict[str, int] = {}
        names = self._names
        for k, v in raw_beats.items():
            node = names.get(k)
            if node is None:
                node = k.decode(errors="replace") if isinstance(k, bytes) else k
                if not _NODE_ID.fullmatch(node):
                    self.rejections.count("malformed", node[:100], "a beat under a name that is not a node id")
                    continue
                names[k] = node
            try:
                beats[node] = int(v)
            except ValueError:
                self.rejections.count("malformed", node, f"beat {v!r} is not a time in ms")
        if len(names) > 2 * len(raw_beats) + 64:  # forget the names of nodes long gone
            self._names = {k: names[k] for k in raw_beats if k in names}
        self.beats = beats
        self._next_seq = int(raw_seq or 0)
        self._moved = [n for n in map(names.get, raw_moved) if n in beats]
        return [n for n in map(names.get, raw_changed) if n in beats]

    def ask_reports(self, pipe: Any, keys: Keys, ids: list[str]) -> int:
        """Queue the reads of these reports and of the positions that moved, as one command;
        returns how many replies it makes (0 or 1)."""
        if not ids and not self._moved:
            return 0
        pipe.eval(_READ_BOUNDED, 0, MAX_REPORT_BYTES, keys.node(""), " ".join(ids), keys.node_positions(""),
                  " ".join(self._moved))
        return 1

    def absorb(self, ids: list[str], replies: list[Any]) -> set[str]:
        """Take the reply :meth:`ask_reports` asked for; returns the nodes whose report changed or is gone."""
        raws: list[bytes] = replies[0] if replies else []
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
        for node, raw in zip(self._moved, raws[len(ids):]):
            if raw:
                positions = self._decode_positions(node, raw)
                if positions is not None:
                    self.positions[node] = positions
                    self._moved_since.add(node)
        for node in [n for n in self.reports if n not in self.beats]:
            del self.reports[node]
            changed.add(node)
        for node in [n for n in self.positions if n not in self.beats]:
            del self.positions[node]
        self._seq = self._next_seq
        self._moved = []
        return changed

    def take_moved(self) -> set[str]:
        """The nodes whose positions changed since the last call."""
        moved, self._moved_since = self._moved_since, set()
        return moved

    def _decode(self, node: str, raw: bytes) -> NodeReport | None:
        try:
            report = NodeReport.from_json(raw)
        except (ValueError, KeyError, TypeError, AttributeError, orjson.JSONDecodeError) as e:
            self._reject(node, e)
            return None
        if report.node_id != node:
            self.rejections.count("malformed", node, f"report names node {report.node_id!r}")
            return None
        return report

    def _decode_positions(self, node: str, raw: bytes) -> NodePositions | None:
        try:
            return NodePositions.from_bytes(raw)
        except ValueError as e:
            self._reject(node, e)
            return None

    def _reject(self, node: str, e: Exception) -> None:
        reason = "oversized" if isinstance(e, OversizedReport) else \
            "unknown-version" if isinstance(e, UnknownReportVersion) else "malformed"
        self.rejections.count(reason, node, f"{type(e).__name__}: {e}")

    def poll(self, redis: Any, keys: Keys) -> set[str]:
        """Read what changed, with a synchronous client; returns the nodes whose report changed or is gone."""
        pipe = redis.pipeline(transaction=False)
        self.ask_changes(pipe, keys)
        ids = self.changed_ids(*pipe.execute())
        replies: list[Any] = []
        pipe = redis.pipeline(transaction=False)
        if self.ask_reports(pipe, keys, ids):
            replies = pipe.execute()
        return self.absorb(ids, replies)

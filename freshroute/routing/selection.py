"""Which replicas to ask, in which order: freshest first, then least loaded (:class:`FreshestFirst`).

The router's view of a replica's lag may be a few hundred milliseconds old. It is used to order replicas and to
skip those it knows cannot meet the caller's bound, but a replica is never excluded by a view older than
``view_trust_ms``, nor by a position alone: the caller's ``min_position`` came from an answer, often through another
router or a client whose view was newer, so a view behind it proves only that the view is old. The store node
checks the bound itself and refuses a read it cannot serve, so asking costs one round trip, never a wrong answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol, Sequence

from freshroute.bound import Bound
from freshroute.lag import now_ms, rank_lag
from freshroute.metadata.roles import ReplicaState
from freshroute.routing.snapshot import LagOverlay, ReplicaView

_RESTORING, _FAILED = ReplicaState.RESTORING, ReplicaState.FAILED


class Candidate(NamedTuple):
    """A replica with its best-known lag at selection time (a tuple: several are built per lookup)."""

    replica: ReplicaView
    lag_offsets: int | None  # None: the replica has not learnt its changelog's end offset yet
    staleness_ms: int
    applied: int

    @property
    def end(self) -> int | None:
        return None if self.lag_offsets is None else self.applied + self.lag_offsets

    @property
    def freshness(self) -> tuple[int, int]:
        """Sort key, freshest first: offset lag (unknown last), then staleness."""
        return rank_lag(self.lag_offsets), self.staleness_ms


class Selection(NamedTuple):
    """Replicas to try in order, and the freshest live replica seen (for error details).

    A tuple, like :class:`Candidate`: one is built per lookup.
    """

    candidates: list[Candidate]
    freshest: Candidate | None
    live: int
    # Live replicas the view puts outside the bound: worth asking once every candidate has
    # failed, since the view may be behind the replica and the store checks the bound itself.
    fallback: list[Candidate]


class ReplicaSelector(Protocol):
    """Orders the replicas of one partition for a read with the given bound."""

    def select(self, replicas: Sequence[ReplicaView], bound: Bound) -> Selection: ...


@dataclass(slots=True)
class NodeLoad:
    """Requests outstanding on a node, its latency EWMA, and until when it counts as failing."""

    in_flight: int = 0
    ewma_ms: float = 1.0
    failing_until_ms: int = 0


class LoadTracker:
    """Per-node load, fed by every attempt; one per router."""

    def __init__(self, failure_backoff_ms: int = 1000, alpha: float = 0.2,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        self._nodes: dict[str, NodeLoad] = {}
        self._backoff_ms = failure_backoff_ms
        self._alpha = alpha
        self._clock_ms = clock_ms

    def of(self, node: str) -> NodeLoad:
        load = self._nodes.get(node)
        if load is None:
            load = self._nodes[node] = NodeLoad()
        return load

    def started(self, node: str) -> None:
        self.of(node).in_flight += 1

    def finished(self, node: str, latency_ms: float | None) -> None:
        """An attempt ended; ``latency_ms`` is given when the node answered (any status)."""
        load = self.of(node)
        load.in_flight = max(0, load.in_flight - 1)
        if latency_ms is not None:
            load.ewma_ms += self._alpha * (latency_ms - load.ewma_ms)
            load.failing_until_ms = 0

    def failed(self, node: str) -> None:
        """The node could not be reached: move it to the back of the line for a while."""
        self.of(node).failing_until_ms = self._clock_ms() + self._backoff_ms

    def snapshot(self) -> dict[str, NodeLoad]:
        return dict(self._nodes)


@dataclass
class FreshestFirst:
    """Freshest replicas first (offset lag, then staleness); equally fresh ones by load.

    Load is requests in flight first (least outstanding wins), then, among equally busy
    replicas, a random pick weighted by the inverse of their latency EWMA.
    """

    load: LoadTracker
    overlay: LagOverlay = field(default_factory=LagOverlay)
    tolerance_offsets: int = 0
    tolerance_ms: int = 0
    view_trust_ms: int = 1000
    clock_ms: Callable[[], int] = now_ms
    rng: random.Random = field(default_factory=random.Random)

    def estimate(self, r: ReplicaView, now: int) -> tuple[Candidate, int]:
        """The replica's best-known lag (its heartbeats' or a newer response's) and that view's age."""
        applied, end, staleness, observed = r.latest()
        o = self.overlay.get(r.node, r.table, r.partition)
        if o is not None and o.observed_ms >= observed:
            applied, end, staleness, observed = o.applied, o.end, o.staleness_ms, o.observed_ms
        lag = None if end is None else end - applied if end > applied else 0
        age = now - observed if now > observed else 0
        # A replica that was behind (or does not know how far) keeps getting staler until it catches up.
        if lag != 0:
            staleness += age
        return Candidate(r, lag, staleness, applied), age

    def select(self, replicas: Sequence[ReplicaView], bound: Bound) -> Selection:
        now = self.clock_ms()
        # A replica not reported yet cannot serve, nor can a FAILED one.
        usable = [r for r in replicas if r.state is not None and r.state is not _FAILED]
        live = [r for r in usable if r.alive]
        # Liveness is a view too: with no replica believed alive, the dead-looking ones are
        # still worth one try each rather than a certain failure.
        pool = live or usable
        unbounded = bound.unbounded
        within: list[Candidate] = []
        unsure: list[Candidate] = []
        behind: list[Candidate] = []
        freshest: Candidate | None = None
        for r in pool:
            c, age = self.estimate(r, now)
            if freshest is None or c.freshness < freshest.freshness:
                freshest = c
            if unbounded or bound.refusal(r.partition, c.applied, c.end, c.staleness_ms) is None:
                within.append(c)
            elif age > self.view_trust_ms or bound.behind_position_only(r.partition, c.applied, c.end, c.staleness_ms):
                unsure.append(c)
            elif r.alive:
                behind.append(c)
        ordered = self._order(within, now)
        if unsure:
            ordered.extend(self._order(unsure, now))
        return Selection(ordered, freshest, len(live), self._order(behind, now) if behind else [])

    @staticmethod
    def _rank(c: Candidate, load: NodeLoad, lag_cut: int, ms_cut: int, now: int) -> tuple[bool, bool, int, int, int, int]:
        """Sort key: replicas backing off last, restoring ones after serving ones, then fresher first
        (an unknown offset lag after every known one); equally fresh ones by requests in flight."""
        backoff = c.replica.draining or load.failing_until_ms > now
        restoring = c.replica.state is _RESTORING
        lag = rank_lag(c.lag_offsets)
        if lag <= lag_cut and c.staleness_ms <= ms_cut:
            return (backoff, restoring, 0, 0, 0, load.in_flight)
        return (backoff, restoring, 1, lag, c.staleness_ms, load.in_flight)

    def _order(self, cands: list[Candidate], now: int) -> list[Candidate]:
        n = len(cands)
        if n < 2:
            return cands
        if n == 2:  # the usual case (one standby), with each node's load looked up once
            a, b = cands
            la, lb = self.load.of(a.replica.node), self.load.of(b.replica.node)
            lag_cut = min(rank_lag(a.lag_offsets), rank_lag(b.lag_offsets)) + self.tolerance_offsets
            ms_cut = min(a.staleness_ms, b.staleness_ms) + self.tolerance_ms
            ka, kb = self._rank(a, la, lag_cut, ms_cut, now), self._rank(b, lb, lag_cut, ms_cut, now)
            if ka != kb:
                return [a, b] if ka < kb else [b, a]
            wa = 1.0 / max(la.ewma_ms, 0.01)
            wb = 1.0 / max(lb.ewma_ms, 0.01)
            return [a, b] if self.rng.random() * (wa + wb) < wa else [b, a]
        lag_cut = min(rank_lag(c.lag_offsets) for c in cands) + self.tolerance_offsets
        ms_cut = min(c.staleness_ms for c in cands) + self.tolerance_ms
        keyed = sorted(((self._rank(c, self.load.of(c.replica.node), lag_cut, ms_cut, now), c) for c in cands),
                       key=lambda t: t[0])
        out: list[Candidate] = []
        i = 0
        while i < n:
            j = i + 1
            while j < n and keyed[j][0] == keyed[i][0]:
                j += 1
            run = [t[1] for t in keyed[i:j]]
            out.extend(run if len(run) == 1 else self._shuffle_by_latency(run))
            i = j
        return out

    def _shuffle_by_latency(self, run: list[Candidate]) -> list[Candidate]:
        """Equally fresh, equally busy: a random order, faster replicas more likely first.

        Randomness (rather than "lowest EWMA first") keeps every replica's latency estimate
        current: a replica that is never picked would keep a stale estimate forever.
        """
        items = list(run)
        out: list[Candidate] = []
        while len(items) > 1:
            weights = [1.0 / max(self.load.of(c.replica.node).ewma_ms, 0.01) for c in items]
            x = self.rng.random() * sum(weights)
            pick = len(items) - 1
            for k, w in enumerate(weights):
                x -= w
                if x < 0:
                    pick = k
                    break
            out.append(items.pop(pick))
        out.extend(items)
        return out

"""Which replicas to ask and in which order, and the one attempt engine: which to ask next, when to retry or
hedge, and what to say when none answers.

**Selection** (:class:`FreshestFirst`): freshest first, then least loaded. The router's view of a
replica's lag may be a few hundred milliseconds old. It is used to order replicas and to skip those
it knows cannot meet the caller's bound, but a replica is never excluded by a view older than
``view_trust_ms``, nor by a position alone: the caller's ``min_position`` came from an answer, often
through another router or a client whose view was newer, so a view behind it proves only that the
view is old. The store node checks the bound itself and refuses a read it cannot serve, so asking
costs one round trip, never a wrong answer.

**Attempts.** An :class:`AttemptPlan` holds the decisions for one read of one partition and does no
I/O: a driver asks it for the attempts due now (:meth:`AttemptPlan.launch`), waits until an answer
arrives or :meth:`AttemptPlan.wake_at`, and hands every outcome back (:meth:`AttemptPlan.settle`).
Point gets, a batch's partition groups and a scan's partitions all run through it, under :func:`run`
(asyncio; :func:`run_many` for a batch's groups at once) or the client's blocking driver, so they
retry, hedge and fail in exactly the same way.

The rules: candidates in the selector's order; the next one joins when the current attempt
fails, is refused, is slower than the attempt timeout, or — once per read, within a token
budget, and unless it is still restoring — slower than the recent p9x of its kind (a hedge);
whichever answers first wins.
Replicas the view put behind the bound are asked only after every candidate failed without
saying it was too stale. A replica that refused only because it has not reached the caller's
position yet (it is within every other limit) is asked again after a short, growing wait: it
tails the changelog and will get there, typically within milliseconds — a session reading on
through a failover waits for the survivor instead of failing. What is left at the deadline is a
timeout; a read every replica refused is :class:`NoReplicaWithinBound` with the freshest lag
they reported.
"""

from __future__ import annotations

import asyncio
import random
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, NamedTuple, Protocol, Sequence, TypeVar

from freshroute.errors import (FreshrouteError, LookupTimeout, NoReplicaWithinBound, NotYetVisible, ReplicaUnavailable,
                               WriteRejected)
from freshroute.freshness import Bound, now_ms, rank_lag
from freshroute.metadata import ReplicaState
from freshroute.routing.snapshot import LagOverlay, ReplicaView
from freshroute.wire import ReadStatus, ReplicaStatus

# Timers may fire a hair early; a wake-up this close to its time counts as on time.
TIMER_SLACK_S = 0.0005

_RETRY_REASON = {ReadStatus.TOO_STALE: "too_stale", ReadStatus.NOT_HOSTED: "not_hosted", ReadStatus.ERROR: "error",
                 ReadStatus.NOT_YET_VISIBLE: "not_yet_visible"}
_OK, _NOT_FOUND, _TOO_STALE, _NOT_YET_VISIBLE = (ReadStatus.OK, ReadStatus.NOT_FOUND, ReadStatus.TOO_STALE,
                                                 ReadStatus.NOT_YET_VISIBLE)
_RESTORING, _FAILED = ReplicaState.RESTORING, ReplicaState.FAILED


# ---- selection ---------------------------------------------------------------------------------------


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
    def _rank(c: Candidate, load: NodeLoad, lag_cut: int, ms_cut: int, now: int) -> tuple:
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


# ---- attempts ----------------------------------------------------------------------------------------


class Answer(Protocol):
    """What one attempt returns: a status, the answering replica's lag, and a message."""

    status: ReadStatus
    replica: ReplicaStatus | None
    message: str


A = TypeVar("A", bound=Answer)


class LatencyWindow:
    """Recent attempt latencies of one kind of read, for the hedging threshold (a quantile recomputed every few samples)."""

    def __init__(self, quantile: float, size: int = 512, every: int = 64, min_samples: int = 32) -> None:
        self._q = quantile
        self._buf = [0.0] * size
        self._n = 0
        self._every = every
        self._min = min_samples
        self.value_ms: float | None = None

    def record(self, ms: float) -> None:
        self._buf[self._n % len(self._buf)] = ms
        self._n += 1
        if self._n >= self._min and self._n % self._every == 0:
            filled = sorted(self._buf[: min(self._n, len(self._buf))])
            self.value_ms = filled[min(len(filled) - 1, int(self._q * len(filled)))]


@dataclass(frozen=True, slots=True)
class AttemptPolicy:
    """How long attempts may take and when a second replica joins."""

    attempt_timeout_ms: int = 500
    hedge: bool = True
    hedge_quantile: float = 0.95
    hedge_min_ms: float = 5.0
    hedge_budget: float = 0.1


class NoMetrics:
    """The metrics seam of the routing core, counting nothing."""

    def lookup(self, outcome: str, role: str, seconds: float, count: int = 1) -> None:
        pass

    def retry(self, reason: str) -> None:
        pass


# What the lookup counters are labelled by.
OUTCOMES = ("ok", "not_found", "no_replica", "unavailable", "timeout", "invalid", "table_not_found", "not_yet_visible",
            "write_rejected", "error")
ROLES = ("active", "standby", "none")
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
RETRY_REASONS = ("unavailable", "too_stale", "not_hosted", "error", "slow", "hedge", "position", "not_yet_visible",
                 "after")


class LookupCounts:
    """The metrics seam counting: one routing thread's counts in plain ints (only that thread updates them), added up
    at a scrape by :class:`freshroute.routing.lookup_metrics.LookupMetrics`."""

    __slots__ = ("lookups", "buckets", "sum_s", "retries")

    def __init__(self) -> None:
        self.lookups = {(o, r): 0 for o in OUTCOMES for r in ROLES}
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.sum_s = 0.0
        self.retries = dict.fromkeys(RETRY_REASONS, 0)

    def lookup(self, outcome: str, role: str, seconds: float, count: int = 1) -> None:
        """``count`` lookups that ended alike (a batch group's keys) after ``seconds``."""
        self.lookups[(outcome, role)] += count
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += count
        self.sum_s += seconds * count

    def retry(self, reason: str) -> None:
        self.retries[reason] += 1


class Attempts:
    """What every read of one routing core shares: node load, the lag overlay, latency windows, the hedge budget."""

    def __init__(self, policy: AttemptPolicy, load: LoadTracker, overlay: LagOverlay,
                 clock_ms: Callable[[], int], metrics: Any = None) -> None:
        self.policy = policy
        self.load = load
        self.overlay = overlay
        self.clock_ms = clock_ms
        self.metrics = metrics if metrics is not None else NoMetrics()
        self.attempt_s = policy.attempt_timeout_ms / 1000
        self.hedge_tokens = 0.0

    def window(self) -> LatencyWindow:
        """A latency window for one kind of read (gets, groups and scans take different times)."""
        return LatencyWindow(self.policy.hedge_quantile)

    def plan(self, table: str, partition: int, bound: Bound, selection: Selection, timeout_s: float,
             latency: LatencyWindow, now: float) -> "AttemptPlan":
        """The plan of one read; ``now`` on the driver's monotonic clock (seconds)."""
        self.hedge_tokens = min(10.0, self.hedge_tokens + self.policy.hedge_budget)
        return AttemptPlan(self, table, partition, bound, selection, now, timeout_s, latency)

    def hedge_delay_s(self, latency: LatencyWindow) -> float:
        if not self.policy.hedge or latency.value_ms is None:
            return self.attempt_s
        return min(max(self.policy.hedge_min_ms, latency.value_ms) / 1000, self.attempt_s)


class AttemptPlan:
    """The decisions of one read of one partition (sans I/O: the driver sends, waits and reports back)."""

    __slots__ = ("_attempts", "table", "partition", "bound", "selection", "_cands", "_latency", "deadline",
                 "_hedge_after", "_launched", "_last_launch", "_hedged", "_fallback_used", "inflight", "stale",
                 "failures", "last_reason", "_catching_up", "_retry_at", "_retries", "_retry_limit", "_retry_first_s",
                 "_retry_max_s", "unseen", "rejected")

    def __init__(self, attempts: Attempts, table: str, partition: int, bound: Bound, selection: Selection,
                 now: float, timeout_s: float, latency: LatencyWindow) -> None:
        self._attempts = attempts
        self.table = table
        self.partition = partition
        self.bound = bound
        self.selection = selection
        self._cands = selection.candidates
        self._latency = latency
        self.deadline = now + timeout_s
        self._hedge_after = attempts.hedge_delay_s(latency)
        self._launched = 0
        self._last_launch = now
        self._hedged = False
        self._fallback_used = False
        self.inflight = 0
        self.stale: list[ReplicaStatus] = []
        self.failures: list[dict[str, str]] = []
        self.last_reason = "unavailable"
        self._catching_up: list[tuple[int, Candidate]] = []  # (applied, candidate) refused for the position alone
        self._retry_at = 0.0  # when the next of them is asked again (0: no wait under way)
        self._retries = 0
        if bound.read_after is None:
            self._retry_limit, self._retry_first_s, self._retry_max_s = (POSITION_RETRIES, POSITION_RETRY_FIRST_S,
                                                                         POSITION_RETRY_MAX_S)
        else:  # events on their way through the pipeline: asked again every few ms until the deadline
            self._retry_limit = int(timeout_s / AFTER_RETRY_MAX_S) + 8
            self._retry_first_s, self._retry_max_s = AFTER_RETRY_FIRST_S, AFTER_RETRY_MAX_S
        self.unseen = ""  # why the last replica asked did not yet have the events the read is after
        self.rejected = ""  # why the pipeline rejected one of them: the read ends

    # ---- the driver's questions --------------------------------------------------------

    def launch(self, now: float) -> Candidate | None:
        """The next replica to ask now, counted in its node's load; None while no attempt is due."""
        cands = self._cands
        if now >= self.deadline:
            return None
        if not self.inflight:
            if self._launched == len(cands) and self._catching_up and self._retries < self._retry_limit:
                return self._ask_again(now)
            if self._launched == len(cands):
                if self.stale or self._fallback_used or not cands or not self.selection.fallback:
                    return None
                # Every candidate failed without saying it was too stale: the view may be
                # behind the replicas it put outside the bound, and they check it themselves.
                self._fallback_used = True
                cands = self._cands = [*cands, *self.selection.fallback]
            return self._launch(now, self.last_reason if self._launched else None)
        if self._launched < len(cands):
            now += TIMER_SLACK_S
            if now >= self._last_launch + self._attempts.attempt_s:
                return self._launch(now, "slow")
            if self._may_hedge() and now >= self._last_launch + self._hedge_after:
                self._hedged = True
                self._attempts.hedge_tokens -= 1.0
                return self._launch(now, "hedge")
        return None

    @property
    def waiting(self) -> bool:
        """Nothing in flight, but a replica catching up with the position is asked again at :meth:`wake_at`."""
        return self._retry_at > 0.0

    def wake_at(self) -> float:
        """When the driver must ask :meth:`launch` again if no answer arrives first."""
        if self._retry_at:
            return min(self._retry_at, self.deadline)
        if self._launched < len(self._cands):
            at = self._last_launch + self._attempts.attempt_s
            if self._may_hedge():
                at = min(at, self._last_launch + self._hedge_after)
            return min(at, self.deadline)
        return self.deadline

    def settle(self, cand: Candidate, outcome: A | BaseException, latency_ms: float) -> A | None:
        """Account for one finished attempt; the answer if it ends the read, else None."""
        self.inflight -= 1
        attempts = self._attempts
        node = cand.replica.node
        if isinstance(outcome, BaseException):
            attempts.load.finished(node, None)
            attempts.load.failed(node)
            if isinstance(outcome, ReplicaUnavailable):
                self.failures.append({"node": node, "reason": outcome.message})
                self.last_reason = "unavailable"
            else:  # a store client's bug must not fail the whole read
                self.failures.append({"node": node, "reason": f"{type(outcome).__name__}: {outcome}"})
                self.last_reason = "error"
            return None
        attempts.load.finished(node, latency_ms)
        rep = outcome.replica
        if rep is not None:
            attempts.overlay.observe(node, self.table, self.partition, rep.applied, rep.end, rep.staleness_ms,
                                     attempts.clock_ms(), rep.state)
        status = outcome.status
        if status is _OK or status is _NOT_FOUND:
            self._latency.record(latency_ms)
            return outcome
        if status is _TOO_STALE and rep is not None:
            self.stale.append(rep)
            if self.bound.behind_position_only(self.partition, rep.applied, rep.end, rep.staleness_ms):
                self._catching_up.append((rep.applied, cand))
        elif status is _NOT_YET_VISIBLE and rep is not None:
            self.unseen = outcome.message
            self._catching_up.append((rep.applied, cand))
        else:
            self.failures.append({"node": node, "reason": f"{status.name}: {outcome.message}"})
        self.last_reason = _RETRY_REASON.get(status, "error")
        return None

    def abandon(self, cand: Candidate) -> None:
        """An attempt given up on (another answered first, or the deadline passed)."""
        self.inflight -= 1
        self._attempts.load.finished(cand.replica.node, None)

    def error(self, now: float) -> FreshrouteError:
        """Why the read ended without an answer."""
        table, partition = self.table, self.partition
        if self.rejected:
            return WriteRejected(self.rejected, table=table, partition=partition)
        if self.unseen:
            after = self.bound.read_after
            return NotYetVisible(f"{table}/{partition}: {self.unseen}", table=table, partition=partition,
                                 after=after.to_dict() if after is not None else None)
        if not self.selection.candidates:
            return self.no_replica([])
        if self.inflight or (now >= self.deadline and self._launched < len(self._cands)):
            return LookupTimeout(f"no replica of {table}/{partition} answered in time", table=table,
                                 partition=partition, attempts=[f["node"] for f in self.failures])
        if self.stale:
            return self.no_replica(self.stale)
        last = f" (last: {self.failures[-1]['reason']})" if self.failures else ""
        return ReplicaUnavailable(f"no replica of {table}/{partition} could answer{last}", table=table,
                                  partition=partition, attempts=self.failures)

    def no_replica(self, stale: list[ReplicaStatus]) -> NoReplicaWithinBound:
        """The bound error, with the freshest lag available: what replicas just said, else the view."""
        if stale:
            views = [(s.lag_offsets, s.staleness_ms, s.node, s.role.value) for s in stale]
        else:
            f = self.selection.freshest
            views = [(f.lag_offsets, f.staleness_ms, f.replica.node, f.replica.role.value)] if f else []
        freshest = None
        if views:
            lag, ms, node, role = min(views, key=lambda v: (rank_lag(v[0]), v[1:]))
            freshest = {"offsets": lag, "ms": ms, "node": node, "role": role}
        return NoReplicaWithinBound(
            f"no live replica of {self.table}/{self.partition} is within the bound", table=self.table,
            partition=self.partition, bound=self.bound.to_dict(), freshest_lag=freshest,
            live_replicas=self.selection.live)

    @property
    def passes(self) -> int:
        """Enough driver passes for every attempt to launch, settle and time out (a loop bound)."""
        asked = len(self.selection.candidates) + len(self.selection.fallback)
        return 4 * asked + 8 + self._retry_limit * (asked + 2)  # a wait for the position: a pass, then each again

    def _ask_again(self, now: float) -> Candidate | None:
        """Once the wait is over (it doubles each time), the replicas catching up again, nearest the position first."""
        if not self._retry_at:
            after = self.bound.read_after
            if after is not None:
                why = after.rejection()
                if why is not None:
                    self.rejected = why
                    self._catching_up.clear()
                    return None
            self._retry_at = now + min(self._retry_max_s, self._retry_first_s * (1 << min(self._retries, 16)))
            return None
        if now < self._retry_at:
            return None
        again = [cand for _, cand in sorted(self._catching_up, key=lambda t: -t[0])]
        self._catching_up.clear()
        self._retry_at = 0.0
        self._retries += 1
        self._cands = [*self._cands, *again]
        return self._launch(now, "position" if self.bound.read_after is None else "after")

    def _launch(self, now: float, reason: str | None) -> Candidate:
        cand = self._cands[self._launched]
        self._launched += 1
        self._last_launch = now
        self.inflight += 1
        self._attempts.load.started(cand.replica.node)
        if reason is not None:
            self._attempts.metrics.retry(reason)
        return cand

    def _may_hedge(self) -> bool:
        # A hedge trades nothing but load for latency: never to a replica still restoring, whose answer
        # (often "no such key" from a store still filling) is far staler than the slow one's. It is still
        # tried when the attempt times out or fails.
        return (self._attempts.policy.hedge and not self._hedged and self.inflight == 1
                and self._attempts.hedge_tokens >= 1.0 and self._cands[self._launched].replica.state is not _RESTORING)


# A replica behind the caller's position is asked again after 5 ms, 10, 20, … at most 100 ms apart, up to 20
# times (about 1.5 s) or until the read's deadline: a replica tailing its changelog reaches a position another
# replica has just served within milliseconds; one that does not in that time is not catching up.
POSITION_RETRY_FIRST_S = 0.005
POSITION_RETRY_MAX_S = 0.1
POSITION_RETRIES = 20
# A replica within the bound whose rows do not include the events a read is after yet is asked again after 2 ms,
# then every 4 ms until the read's deadline: a Real-time query brings an event in tens of ms, and a read costs
# the node some 100 µs.
AFTER_RETRY_FIRST_S = 0.002
AFTER_RETRY_MAX_S = 0.004


# ---- the asyncio driver ---------------------------------------------------------------------


async def _first_done(loop: asyncio.AbstractEventLoop, futs: Any, timeout_s: float) -> list[asyncio.Future[Any]]:
    """Futures done after at most ``timeout_s``; returns at once if any already is.

    A lean ``asyncio.wait(FIRST_COMPLETED)``: that one costs about as much as the rest of a lookup.
    """
    done = [f for f in futs if f.done()]
    if done or timeout_s <= 0:
        return done
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(timeout_s, wake)
    for f in futs:
        f.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        for f in futs:
            f.remove_done_callback(wake)
    return [f for f in futs if f.done()]


def _outcome(fut: asyncio.Future[Any]) -> Any:
    if fut.cancelled():
        return ReplicaUnavailable("attempt cancelled")
    return fut.exception() or fut.result()


async def run(plan: AttemptPlan, start: Callable[[Candidate], Awaitable[A]]) -> tuple[Candidate, A]:
    """Drive ``plan`` on the running loop; ``start`` sends one attempt to a replica. Raises the plan's error."""
    now = time.monotonic()
    first = plan.launch(now)
    if first is None:
        raise plan.error(now)
    fut = start(first)
    if not isinstance(fut, asyncio.Future):
        fut = asyncio.ensure_future(fut)
    # The future's loop, not asyncio.get_running_loop(): on Python 3.11 that one makes a
    # getpid() system call on every lookup.
    loop = fut.get_loop()
    inflight: dict[asyncio.Future[A], tuple[Candidate, float]] = {fut: (first, now)}
    try:
        # The usual case, kept lean because it is most of the work per lookup: the first
        # replica answers before a retry or a hedge is due.
        if not fut.done():
            await _first_done(loop, (fut,), plan.wake_at() - now)
        if fut.done():
            del inflight[fut]
            answer = plan.settle(first, _outcome(fut), (time.monotonic() - now) * 1000)
            if answer is not None:
                return first, answer
        return await _keep_trying(plan, start, loop, inflight)
    finally:
        for pending, (cand, _) in inflight.items():
            _drop(pending)
            plan.abandon(cand)


async def _keep_trying(plan: AttemptPlan, start: Callable[[Candidate], Awaitable[A]], loop: asyncio.AbstractEventLoop,
                       inflight: dict[asyncio.Future[A], tuple[Candidate, float]]) -> tuple[Candidate, A]:
    """After the first attempt: retries, hedges and the fallback, until an answer or the deadline.

    Attempts left in ``inflight`` when this returns or raises are the caller's to cancel.
    """
    # Bounded: each pass launches an attempt, settles one, or ends at the deadline.
    for _ in range(plan.passes):
        now = time.monotonic()
        while (cand := plan.launch(now)) is not None:
            fut = start(cand)
            inflight[fut if isinstance(fut, asyncio.Future) else asyncio.ensure_future(fut)] = (cand, now)
        if (not inflight and not plan.waiting) or now >= plan.deadline:
            break
        for fut in await _first_done(loop, inflight, plan.wake_at() - now):
            cand, t0 = inflight.pop(fut)
            answer = plan.settle(cand, _outcome(fut), (time.monotonic() - t0) * 1000)
            if answer is not None:
                return cand, answer
    raise plan.error(time.monotonic())


def launch_due(plans: list[AttemptPlan], out: list[Any], now: float, send: Callable[[int, Candidate], None],
               end: Callable[[int], None]) -> float | None:
    """One pass of a driver of several plans: each plan not done yet sends the attempts due ``now``
    (``send(i, candidate)``); one that can do no more gets its error in ``out`` and ``end(i)`` drops
    its attempts. The earliest wake-up of the plans still running; None when none is."""
    wake = None
    for i, plan in enumerate(plans):
        if out[i] is not None:
            continue
        while (cand := plan.launch(now)) is not None:
            send(i, cand)
        if (not plan.inflight and not plan.waiting) or now >= plan.deadline:
            out[i] = plan.error(now)
            end(i)
        else:
            at = plan.wake_at()
            wake = at if wake is None else min(wake, at)
    return wake


async def run_many(plans: list[AttemptPlan], start: Callable[[int, Candidate], Awaitable[A]]
                   ) -> list[tuple[Candidate, A] | FreshrouteError]:
    """Drive several plans at once on the running loop (a batch's partition groups); ``start(i, candidate)`` sends
    one attempt of plan ``i``. Each plan's answer, or its error, in order.

    One coroutine, one wait and one timer for all of them — the shape of the client's blocking
    driver — rather than a task, a waiter and a timer per plan, which cost a batch more than its reads.
    """
    out: list[tuple[Candidate, A] | FreshrouteError | None] = [None] * len(plans)
    inflight: dict[asyncio.Future[A], tuple[int, Candidate, float]] = {}
    loop: asyncio.AbstractEventLoop | None = None
    now = time.monotonic()

    def send(i: int, cand: Candidate) -> None:
        fut = start(i, cand)
        inflight[fut if isinstance(fut, asyncio.Future) else asyncio.ensure_future(fut)] = (i, cand, now)

    try:
        # Bounded: each pass launches, settles, or waits until the next plan's wake-up.
        for _ in range(sum(plan.passes for plan in plans)):
            now = time.monotonic()
            wake = launch_due(plans, out, now, send, lambda i: _abandon(inflight, plans[i], i))
            if wake is None:
                break
            if loop is None:
                # The futures' loop, not asyncio.get_running_loop() (a getpid() call on Python 3.11).
                loop = next(iter(inflight)).get_loop()
            for fut in await _first_done(loop, list(inflight), wake - now):
                if fut not in inflight:
                    continue  # its plan was answered by another replica in this pass
                i, cand, t0 = inflight.pop(fut)
                got = plans[i].settle(cand, _outcome(fut), (time.monotonic() - t0) * 1000)
                if got is not None:
                    out[i] = (cand, got)
                    _abandon(inflight, plans[i], i)
    finally:
        for fut, (i, cand, _) in inflight.items():
            _drop(fut)
            plans[i].abandon(cand)
    return [r if r is not None else plans[i].error(time.monotonic()) for i, r in enumerate(out)]


def _drop(fut: asyncio.Future[Any]) -> None:
    """An attempt no longer wanted: cancelled, or its failure retrieved (a loser's failure is expected)."""
    if not fut.done():
        fut.cancel()
    elif not fut.cancelled():
        fut.exception()


def _abandon(inflight: dict[asyncio.Future[Any], tuple[int, Candidate, float]], plan: AttemptPlan, index: int) -> None:
    for fut in [f for f, (i, _, _) in inflight.items() if i == index]:
        _, cand, _ = inflight.pop(fut)
        _drop(fut)
        plan.abandon(cand)

"""The one attempt engine: which replica to ask next, when to retry or hedge, and what to say when none answers.

An :class:`AttemptPlan` holds the decisions for one read of one partition and does no I/O: a driver asks it for the
attempts due now (:meth:`AttemptPlan.launch`), waits until an answer arrives or :meth:`AttemptPlan.wake_at`, and
hands every outcome back (:meth:`AttemptPlan.settle`). Point gets, a batch's partition groups and a scan's
partitions all run through it, under the asyncio drivers (:mod:`freshroute.routing.drivers`) or the client's
blocking one, so they retry, hedge and fail in exactly the same way. The candidates and their order come from the
selection (:mod:`freshroute.routing.selection`).

The rules: candidates in the selector's order; the next one joins when the current attempt
fails, is refused, is slower than the attempt timeout, or — once per read, within a token
budget, and unless it is still restoring — slower than the recent p9x of its kind (a hedge);
whichever answers first wins.
Replicas the view put behind the bound are asked only after every candidate failed without
saying it was too stale. A replica that refused only because it has not reached the caller's
position yet (it is within every other limit), or does not yet hold the events a read after a write token waits
for, is asked again after a short wait: it tails the changelog and will get there, typically within milliseconds —
a session reading on through a failover waits for the survivor instead of failing. What is left at the deadline is a
timeout; a read every replica refused is :class:`NoReplicaWithinBound` with the freshest lag
they reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, TypeVar

from freshroute.errors import (FreshrouteError, LookupTimeout, NoReplicaWithinBound, NotYetVisible, ReplicaUnavailable,
                               WriteRejected)
from freshroute.bound import Bound
from freshroute.lag import known_staleness, rank_lag
from freshroute.metadata.roles import ReplicaState
from freshroute.routing.counts import Metrics, NoMetrics
from freshroute.routing.selection import Candidate, LoadTracker, Selection
from freshroute.routing.snapshot import LagOverlay
from freshroute.wire import ReadStatus, ReplicaStatus

# Timers may fire early: uvloop's (libuv's) count whole milliseconds, so a wake-up up to one before its time counts as
# on time; waited for to the microsecond, each early wake-up would be another pass of the driver's bounded loop.
TIMER_SLACK_S = 0.001

_RETRY_REASON = {ReadStatus.TOO_STALE: "too_stale", ReadStatus.NOT_HOSTED: "not_hosted", ReadStatus.ERROR: "error",
                 ReadStatus.NOT_YET_VISIBLE: "not_yet_visible"}
_OK, _NOT_FOUND, _TOO_STALE, _NOT_YET_VISIBLE = (ReadStatus.OK, ReadStatus.NOT_FOUND, ReadStatus.TOO_STALE,
                                                 ReadStatus.NOT_YET_VISIBLE)
_RESTORING = ReplicaState.RESTORING


# ---- attempts ----------------------------------------------------------------------------------------


class Answer(Protocol):
    """What one attempt returns: a status, the answering replica's lag, and a message (read-only: the answers are
    named tuples)."""

    @property
    def status(self) -> ReadStatus: ...

    @property
    def replica(self) -> ReplicaStatus | None: ...

    @property
    def message(self) -> str: ...


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


class Attempts:
    """What every read of one routing core shares: node load, the lag overlay, latency windows, the hedge budget."""

    def __init__(self, policy: AttemptPolicy, load: LoadTracker, overlay: LagOverlay,
                 clock_ms: Callable[[], int], metrics: Metrics | None = None) -> None:
        self.policy = policy
        self.load = load
        self.overlay = overlay
        self.clock_ms = clock_ms
        self.metrics: Metrics = metrics if metrics is not None else NoMetrics()
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
        else:  # events on their way through the pipeline: asked again every few ms until the deadline (each retry
            # due a timer's slack early at most, so the count outlasts the deadline)
            self._retry_limit = int(timeout_s / (AFTER_RETRY_MAX_S - TIMER_SLACK_S)) + 8
            self._retry_first_s, self._retry_max_s = AFTER_RETRY_FIRST_S, AFTER_RETRY_MAX_S
        self.unseen = ""  # why the last replica asked did not yet have the events the read is after
        self.rejected = ""  # why the pipeline rejected one of them: the read ends

    # ---- the driver's questions --------------------------------------------------------

    def launch(self, now: float) -> Candidate | None:
        """The next replica to ask now, counted in its node's load; None while no attempt is due."""
        cands = self._cands
        if self.expired(now):
            return None
        if self._launched == len(cands) and self._catching_up and self._retries < self._retry_limit:
            # Also while another attempt is out: one to a replica gone silent (a partition drops its packets) would
            # otherwise keep the replica catching up from being asked again until the deadline.
            return self._ask_again(now)
        if not self.inflight:
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

    def expired(self, now: float) -> bool:
        """The read's deadline has come (within a timer's slack)."""
        return now + TIMER_SLACK_S >= self.deadline

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
            # The replicas that failed otherwise are named: the wait ended early without them.
            return NotYetVisible(f"{table}/{partition}: {self.unseen}", table=table, partition=partition,
                                 after=after.to_dict() if after is not None else None, attempts=self.failures)
        if not self.selection.candidates:
            return self.no_replica([])
        if self.inflight or (self.expired(now) and self._launched < len(self._cands)):
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
            freshest = {"offsets": lag, "ms": known_staleness(ms), "node": node, "role": role}
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
        if now + TIMER_SLACK_S < self._retry_at:
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
        if (not plan.inflight and not plan.waiting) or plan.expired(now):
            out[i] = plan.error(now)
            end(i)
        else:
            at = plan.wake_at()
            wake = at if wake is None else min(wake, at)
    return wake

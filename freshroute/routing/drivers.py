"""The asyncio drivers of attempt plans: :func:`run` for one read, :func:`run_many` for a batch's groups or a scan's
partitions, all in one coroutine with one wait. They send what a plan says is due, wait until an answer arrives or
the plan's next wake-up, and hand every outcome back (:mod:`freshroute.routing.attempts`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from freshroute.errors import FreshrouteError, ReplicaUnavailable
from freshroute.routing.attempts import A, AttemptPlan, launch_due
from freshroute.routing.selection import Candidate


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
        if (not inflight and not plan.waiting) or plan.expired(now):
            break
        for fut in await _first_done(loop, inflight, plan.wake_at() - now):
            cand, t0 = inflight.pop(fut)
            answer = plan.settle(cand, _outcome(fut), (time.monotonic() - t0) * 1000)
            if answer is not None:
                return cand, answer
    raise plan.error(time.monotonic())


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

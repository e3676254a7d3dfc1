"""Principals' read rates: one token bucket per principal, whatever the number of router processes.

A principal's bucket lives in Redis (``{ns}:rate:{principal}``) and is refilled by Redis's own
clock inside one script, so every process of every router of a namespace draws on the same
bucket. A process does not ask Redis per read: it leases a few tokens at a time — about a tenth
of a second of its own recent demand — and asks for the next lease before the last runs out, so
a read waits on Redis only when its principal's lease is empty (its first read, or after a
refusal). Leased tokens a process has not used yet are the only slack: at most about one lease
per process, and never more reads than the shared bucket granted.

While Redis cannot be reached, each process limits a principal on its own, as if it were alone,
and tries the shared bucket again a second later: reads go on being served, at up to the number
of processes times the rate, rather than being refused for an outage of the metadata store.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Protocol

from freshroute.errors import RateLimited

log = logging.getLogger(__name__)

LEASE_S = 0.1  # a lease covers about this much of the process's recent demand
SHARED_RETRY_S = 1.0  # after Redis failed a lease, how long this process limits on its own
_ASKS_PER_READ = 12  # leases one read may wait for, each twice the last, before it is refused all the same

# KEYS[1] the bucket; ARGV rate (tokens/s), burst, tokens wanted. Returns {granted, seconds until `wanted`
# (at most the burst) would be there}. Tokens are a float; only whole ones are granted.
_LEASE = """
local rate, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(held[1]) or burst, tonumber(held[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local granted = math.min(want, math.floor(tokens))
tokens = tokens - granted
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {granted, tostring(math.max(0, math.min(want, burst) - tokens) / rate)}
"""


@dataclass(frozen=True)
class Rate:
    reads_per_s: float
    burst: float


class RateLimits(Protocol):
    async def admit(self, name: str, rate: Rate) -> None:
        """Count one read of principal ``name``; RateLimited when over ``rate``."""

    def keep(self, names: Collection[str]) -> None:
        """Forget the principals not in ``names`` (an auth file reloaded without them)."""

    async def lease(self, name: str, rate: Rate, want: int) -> int:
        """Up to ``want`` reads of principal ``name`` granted at once (the compiled path spends them): how many."""


def refused(name: str, rate: Rate, wait_s: float) -> RateLimited:
    return RateLimited(f"principal {name!r} is over its rate of {rate.reads_per_s:g} reads/s",
                       retry_after_s=max(1, math.ceil(wait_s)))


class _Bucket:
    """A token bucket: ``rate.burst`` reads at once, refilled at ``rate.reads_per_s``."""

    __slots__ = ("rate", "tokens", "stamp")

    def __init__(self, rate: Rate, now: float) -> None:
        self.rate, self.tokens, self.stamp = rate, rate.burst, now

    def _refill(self, now: float) -> None:
        self.tokens = min(self.rate.burst, self.tokens + (now - self.stamp) * self.rate.reads_per_s)
        self.stamp = now

    def take(self, now: float) -> float:
        """0 if a read is admitted now, else the seconds until one would be."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate.reads_per_s

    def take_up_to(self, now: float, want: int) -> int:
        """As many whole reads as are there now, at most ``want``."""
        self._refill(now)
        granted = min(want, int(self.tokens))
        self.tokens -= granted
        return granted


class LocalRates:
    """Buckets of this process alone: the limit holds per process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def _bucket(self, name: str, rate: Rate, now: float) -> _Bucket:
        bucket = self._buckets.get(name)
        if bucket is None or bucket.rate != rate:
            bucket = self._buckets[name] = _Bucket(rate, now)
        return bucket

    def take(self, name: str, rate: Rate) -> None:
        now = self._clock()
        wait = self._bucket(name, rate, now).take(now)
        if wait:
            raise refused(name, rate, wait)

    def take_up_to(self, name: str, rate: Rate, want: int) -> int:
        now = self._clock()
        return self._bucket(name, rate, now).take_up_to(now, want)

    async def admit(self, name: str, rate: Rate) -> None:
        self.take(name, rate)

    async def lease(self, name: str, rate: Rate, want: int) -> int:
        return self.take_up_to(name, rate, want)

    def keep(self, names: Collection[str]) -> None:
        self._buckets = {n: b for n, b in self._buckets.items() if n in names}


class _Lease:
    """What one process holds of a principal's shared bucket."""

    __slots__ = ("rate", "tokens", "used", "asked_at", "want", "refused_until", "pending")

    def __init__(self, rate: Rate, now: float) -> None:
        self.rate = rate
        self.tokens = 0  # leased and not used yet
        self.used = 0  # reads admitted since the last lease was asked for
        self.asked_at = now
        self.want = 1
        self.refused_until = 0.0  # the shared bucket said it is empty until then
        self.pending: asyncio.Task[None] | None = None


class SharedRates:
    """Buckets in Redis shared by every router process of namespace ``namespace``, leased a few tokens at a time."""

    def __init__(self, redis: Any, namespace: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._redis = redis
        self._prefix = f"{namespace}:rate:"
        self._clock = clock
        self._script = redis.register_script(_LEASE)
        self._leases: dict[str, _Lease] = {}
        self._alone = LocalRates(clock)  # while Redis cannot be reached
        self._alone_until = 0.0

    async def admit(self, name: str, rate: Rate) -> None:
        lease = self._leases.get(name)
        now = self._clock()
        if lease is None or lease.rate != rate:
            lease = self._leases[name] = _Lease(rate, now)
        # Reads that waited on one lease together may find it spent by the first of them: they ask again (the
        # lease doubles each time it is spent this fast) and are refused only when the shared bucket says so.
        asks = 0
        while lease.tokens <= 0:
            if now < self._alone_until:
                return self._alone.take(name, rate)
            if now < lease.refused_until:
                raise refused(name, rate, lease.refused_until - now)
            if asks == _ASKS_PER_READ:
                raise refused(name, rate, 1 / rate.reads_per_s)
            asks += 1
            if lease.pending is None:
                self._ask(name, lease, now)
            await asyncio.shield(lease.pending)  # type: ignore[arg-type]
            now = self._clock()
        lease.tokens -= 1
        lease.used += 1
        # The next lease is asked for while this one still has half a lease's worth left.
        if lease.pending is None and 2 * lease.tokens < lease.want and now >= lease.refused_until:
            self._ask(name, lease, now)

    def keep(self, names: Collection[str]) -> None:
        self._leases = {n: lease for n, lease in self._leases.items() if n in names}
        self._alone.keep(names)

    async def lease(self, name: str, rate: Rate, want: int) -> int:
        if self._clock() < self._alone_until:
            return self._alone.take_up_to(name, rate, want)
        try:
            return (await self._draw(name, rate, want))[0]
        except Exception as e:  # noqa: BLE001 — any failure of Redis: limit alone for a while
            self._unreachable(e)
            return self._alone.take_up_to(name, rate, want)

    async def _draw(self, name: str, rate: Rate, want: int) -> tuple[int, float]:
        """Up to ``want`` reads from the principal's shared bucket: (granted, seconds until ``want`` would be there)."""
        granted, wait = await self._script(keys=[self._prefix + name],
                                           args=[repr(rate.reads_per_s), repr(rate.burst), want])
        return int(granted), float(wait)

    def _unreachable(self, e: Exception) -> None:
        if self._clock() >= self._alone_until:
            log.warning("rate limits: the shared buckets in Redis cannot be reached (%s); each router process "
                        "limits principals on its own for %g s", e, SHARED_RETRY_S)
        self._alone_until = self._clock() + SHARED_RETRY_S

    def _ask(self, name: str, lease: _Lease, now: float) -> None:
        elapsed = now - lease.asked_at
        # Spent faster than a lease should last: twice as many next time; else what the demand was.
        want = 2 * lease.want if elapsed < LEASE_S else math.ceil(lease.used / elapsed * LEASE_S)
        lease.want = max(1, min(want, int(lease.rate.burst // 2)))
        lease.used, lease.asked_at = 0, now
        lease.pending = asyncio.ensure_future(self._lease(name, lease))

    async def _lease(self, name: str, lease: _Lease) -> None:
        try:
            granted, wait = await self._draw(name, lease.rate, lease.want)
            lease.tokens += granted
            if granted < lease.want:
                # Others draw on the bucket too: ask again only when what was missing could be there, and for
                # less, so that processes contending for one principal's rate ask about as often as each other.
                lease.refused_until = self._clock() + wait
                lease.want = max(1, lease.want // 2)
        except Exception as e:  # noqa: BLE001 — any failure of Redis: limit alone for a while
            self._unreachable(e)
        finally:
            lease.pending = None

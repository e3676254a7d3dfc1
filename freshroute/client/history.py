"""A versioned table's reads in the client: a key as of a time (``get(..., as_of=)``) and a key's versions."""

from __future__ import annotations

import datetime as dt
from typing import Protocol, Unpack

from freshroute.errors import FreshrouteError
from freshroute.bound import Bound, BoundArgs
from freshroute.routing.core import RoutingCore
from freshroute.routing.history import time_ms

from freshroute.client.fallback import Fallback
from freshroute.client.lookup import AsOfLookup, KeyVersions
from freshroute.client.positions import Positions
from freshroute.client.router import FALL_BACK, RouterHttp



class HostClient(Protocol):
    """What the versioned reads ask of the client they are part of (:class:`~freshroute.client.AsyncClient`): its
    core, router, where a read goes and what it has read."""

    router: RouterHttp | None
    read_positions: Positions

    async def _ready(self) -> RoutingCore: ...

    def deadline(self, bound: Bound) -> float: ...

    @property
    def fallback(self) -> Fallback: ...


class VersionedReads:
    """:class:`~freshroute.client.AsyncClient`'s reads of versioned tables, over its core, router and positions (a
    mixin: each method's ``self`` is the :class:`HostClient` it is part of)."""

    async def _as_of(self: HostClient, core: RoutingCore, table: str, key: str, as_of_ms: int, bound: Bound,
                     deadline: float | None) -> AsOfLookup:
        async def direct() -> AsOfLookup:
            answer = await core.history.as_of(table, key, as_of_ms, bound)
            return AsOfLookup.of(answer, core.input_lag(table), core.value_format(table))

        return self.read_positions.seen(await self.fallback.read("get", direct,
                                          lambda router: router.as_of(table, key, as_of_ms, bound, deadline)))

    async def _many_as_of(self: HostClient, core: RoutingCore, table: str, keys: list[str], as_of_ms: int,
                          bound: Bound, deadline: float | None) -> list[AsOfLookup | FreshrouteError]:
        """Many keys as of one time: from the store nodes, or all through the router when some could not be reached."""
        cause = None
        if self.fallback.direct():
            lag, fmt = core.input_lag(table), core.value_format(table)
            answers = [a if isinstance(a, FreshrouteError) else AsOfLookup.of(a, lag, fmt)
                       for a in await core.history.batch_as_of(table, keys, as_of_ms, bound)]
            cause = next((a for a in answers if isinstance(a, FALL_BACK)), None)
            if self.router is None or cause is None:
                return answers
        return await self.fallback.via("get_many", cause).get_many(table, keys, bound, deadline, as_of_ms)

    async def versions(self: HostClient, table: str, key: str, *, from_ms: int | str | dt.datetime | None = None,
                       to_ms: int | str | dt.datetime | None = None, limit: int | None = None,
                       page_token: str | None = None, bound: Bound | None = None,
                       **limits: Unpack[BoundArgs]) -> KeyVersions:
        """A page of a versioned table's versions of ``key`` valid at some time in ``[from_ms, to_ms)`` (default:
        every one it keeps), newest first; ``page_token`` (a page's ``next_page_token``) goes on with older ones.
        ``bound``: as :meth:`get`'s."""
        core = await self._ready()
        read_bound = self.read_positions.bound(table, bound, limits)
        table = core.resolved(table, read_bound)  # the version read: its format decodes the answer
        deadline = self.deadline(read_bound)
        lo = None if from_ms is None else time_ms("from_ms", from_ms)
        hi = None if to_ms is None else time_ms("to_ms", to_ms)

        async def direct() -> KeyVersions:
            page = await core.history.versions(table, key, lo, hi, limit, page_token, read_bound)
            return KeyVersions.of(page, core.value_format(table))

        return self.read_positions.seen(await self.fallback.read("versions", direct, lambda router: router.versions(
            table, key, lo, hi, limit, page_token, read_bound, deadline)))


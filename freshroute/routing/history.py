"""A versioned table's reads: a key as of a point in time, and a key's versions over a time range.

Both read one replica within the caller's bound: a key as of a time is a point read (``KeyRead.as_of_ms``), its
versions a range read of the key with a :class:`~freshroute.wire.VersionFilter`. An answer as of a time is **final**
when nothing can change it any more: the replica had every changelog record up to that time when it answered (its
staleness, and the pipeline's input lag, taken off the answer's time); else it may still change, as a window before
its end does. (A versioned table is keyed, never windowed: no grace is added.)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol, cast

from freshroute.errors import FreshrouteError, InvalidArgument, TableNotVersioned, VersionNotRetained
from freshroute.bound import NO_BOUND, Bound
from freshroute.formats import locate
from freshroute.metadata.table_versions import named
from freshroute.metadata.tables import TableSpec
from freshroute.routing.answers import lookup_result
from freshroute.routing.counts import count
from freshroute.routing.drivers import run
from freshroute.routing.results import BatchResult, LookupResult, input_lag_doc, key_not_found, value_fields
from freshroute.wire import RangeResult, ReadResult, ReadStatus, Version, VersionFilter

if TYPE_CHECKING:
    from freshroute.routing.attempts import AttemptPlan, LatencyWindow
    from freshroute.routing.counts import Metrics
    from freshroute.routing.policy import RoutingPolicy
    from freshroute.routing.store import StoreClient

MAX_TIME_MS = (1 << 63) - 1
DEFAULT_VERSIONS_LIMIT = 100


def parse_time(name: str, raw: Any) -> int:
    """A point in time from a query value: milliseconds since the epoch, or an RFC 3339 date-time with its offset."""
    text = raw.strip() if isinstance(raw, str) else raw
    if isinstance(text, int) and not isinstance(text, bool) and 0 <= text <= MAX_TIME_MS:
        return text
    if isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 19 and int(text) <= MAX_TIME_MS:
        return int(text)
    if isinstance(text, str) and "T" in text.upper():
        try:
            at = dt.datetime.fromisoformat(text)
        except ValueError:
            at = None
        if at is not None and at.tzinfo is not None:
            return max(0, (at - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(milliseconds=1))
    raise InvalidArgument(f"{name} must be milliseconds since the epoch or an RFC 3339 date-time with its offset "
                          f"(e.g. 2026-11-29T10:00:00Z), got {str(raw)[:40]!r}", field=name)


def time_ms(name: str, at: int | str | dt.datetime) -> int:
    """A client's point in time: ms since the epoch, RFC 3339 text, or an aware datetime."""
    if isinstance(at, dt.datetime):
        if at.tzinfo is None:
            raise InvalidArgument(f"{name} must be an aware datetime (with its tzinfo)", field=name)
        return parse_time(name, at.isoformat())
    return parse_time(name, at)


def rfc3339(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


class AsOf(NamedTuple):
    """A key's value as of ``as_of_ms``: the version valid then (``found`` False: the key was absent), and who said so."""

    lookup: LookupResult
    as_of_ms: int
    version: Version | None
    final: bool

    def to_dict(self, input_lag: tuple[int, int], value_format: str) -> dict[str, Any]:
        r, v = self.lookup, self.version
        assert v is not None and r.found
        return {**named(r.table), "key": r.key, **value_fields(value_format, r.value), "as_of": self.as_of_ms,
                "valid_from": v.valid_from_ms, "valid_to": v.valid_to_ms, "final": self.final,
                "partition": r.partition, **r.served(), "input_lag": input_lag_doc(input_lag)}

    def not_found(self, input_lag: tuple[int, int]) -> FreshrouteError:
        e = key_not_found(self.lookup, input_lag)
        e.details.update(as_of=self.as_of_ms, final=self.final,
                         valid_from=self.version.valid_from_ms if self.version is not None else None,
                         valid_to=self.version.valid_to_ms if self.version is not None else None)
        return e


def batch_doc(table: str, keys: list[str], answers: list["AsOf | FreshrouteError"], as_of_ms: int,
              input_lag: tuple[int, int], value_format: str) -> dict[str, Any]:
    """A batch lookup as of a time as REST answers it: a batch's body, each found key with its version's interval and
    whether it is final."""
    doc = BatchResult(table, keys, [a.lookup if isinstance(a, AsOf) else a for a in answers]).to_dict(input_lag,
                                                                                                       value_format)
    for item, answer in zip(doc["results"], answers):
        if isinstance(answer, AsOf):
            version = answer.version
            item.update(valid_from=version.valid_from_ms if version else None,
                        valid_to=version.valid_to_ms if version else None, final=answer.final)
    doc["as_of"] = as_of_ms
    return doc


class Versions(NamedTuple):
    """A page of a key's versions valid at some time in ``[from_ms, to_ms)``, newest first."""

    lookup: LookupResult
    from_ms: int
    to_ms: int
    versions: tuple[Version, ...]
    next_to_ms: int | None  # the next page's ``to`` (older versions), None: this was the last page
    complete_ms: int  # the replica had every version up to this time when it answered

    def to_dict(self, input_lag: tuple[int, int], value_format: str) -> dict[str, Any]:
        r = self.lookup
        versions = [{**(value_fields(value_format, v.value) if v.value is not None else {"value": None}),
                     "valid_from": v.valid_from_ms, "valid_to": v.valid_to_ms, "deleted": v.value is None}
                    for v in self.versions]
        return {**named(r.table), "key": r.key, "from": self.from_ms, "to": self.to_ms, "versions": versions,
                "next_page_token": None if self.next_to_ms is None else str(self.next_to_ms),
                "complete_to": self.complete_ms, "partition": r.partition, **r.served(),
                "input_lag": input_lag_doc(input_lag)}


class HistoryCore(Protocol):
    """What a versioned table's reads ask of the routing core (:class:`~freshroute.routing.core.RoutingCore`)."""

    policy: "RoutingPolicy"
    store: "StoreClient"
    metrics: "Metrics"
    clock_ms: Callable[[], int]

    def resolved(self, name: str, bound: Bound) -> str: ...

    def keyed(self, name: str) -> TableSpec: ...

    def bound_for(self, spec: TableSpec, bound: Bound) -> Bound: ...

    def plan(self, table: str, partition: int, bound: Bound, latency: "LatencyWindow", timeout_s: float,
             now: float) -> "AttemptPlan": ...

    def input_lag(self, table: str) -> tuple[int, int]: ...

    def group_keys(self, table: str, keys: list[str], bound: Bound
                   ) -> tuple[TableSpec, Bound, dict[int, list[int]], list[bytes]]: ...


class HistoryReads:
    """A versioned table's reads through the routing core: its tables, bounds, plans and attempts."""

    def __init__(self, core: HistoryCore, latency: "LatencyWindow", timeout_s: float) -> None:
        """``core``: the routing core these reads go through."""
        self._core = core
        self._latency = latency
        self._timeout_s = timeout_s

    def versioned(self, name: str, bound: Bound) -> TableSpec:
        """The versioned table a read of ``name`` reads (its name the table read)."""
        spec = self._core.keyed(self._core.resolved(name, bound))
        if not spec.versioned:
            raise TableNotVersioned(f"table {name!r} keeps only its latest values: give it a history retention "
                                    f"(history_retention in the tables file, `freshroute table add "
                                    f"--history-retention`) to read it as of a time", table=name)
        return spec

    def retained(self, spec: TableSpec, at_ms: int, now: int) -> None:
        oldest = now - spec.history_retention_ms
        if at_ms < oldest:
            raise VersionNotRetained(f"table {spec.name!r} keeps versions for {spec.history_retention_ms} ms: the "
                                     f"oldest time it can answer for is {rfc3339(oldest)} ({oldest} ms), not "
                                     f"{at_ms} ms", table=spec.name, oldest_retained=oldest)

    def _plan(self, spec: TableSpec, partition: int, bound: Bound) -> "AttemptPlan":
        """The attempt plan of one read of ``partition``."""
        core = self._core
        return core.plan(spec.name, partition, core.bound_for(spec, bound), self._latency, self._timeout_s,
                         time.monotonic())

    def final(self, spec: TableSpec, as_of_ms: int, answer: ReadResult | RangeResult) -> bool:
        """Whether an answer as of ``as_of_ms`` can no longer change: the replica had every change up to then."""
        return as_of_ms <= self.complete_ms(spec, answer)

    def complete_ms(self, spec: TableSpec, answer: ReadResult | RangeResult) -> int:
        """Up to when the replica that answered had every change of the table: its staleness and the pipeline's input
        lag taken off the answer's time (-1: it did not say)."""
        if answer.replica is None:
            return -1
        return self._core.clock_ms() - answer.replica.staleness_ms - self._core.input_lag(spec.name)[1]

    async def as_of(self, table: str, key: str, as_of_ms: int, bound: Bound = NO_BOUND) -> AsOf:
        """``key``'s version valid at ``as_of_ms`` from one replica within the bound: a point read, as a get is."""
        started = time.perf_counter()
        try:
            spec = self.versioned(table, bound)
            self.retained(spec, as_of_ms, self._core.clock_ms())
            raw, partition = locate(key, spec.partitions, spec.key_format)
        except FreshrouteError as e:
            count(self._core.metrics, started, e)
            raise
        return await self._read_as_of(spec, key, raw, partition, as_of_ms, bound, started)

    async def _read_as_of(self, spec: TableSpec, key: str, raw: bytes, partition: int, as_of_ms: int, bound: Bound,
                          started: float) -> AsOf:
        """One key's version at ``as_of_ms``, the table and the time already checked."""
        try:
            plan = self._plan(spec, partition, bound)
            read = self._core.store.read_version
            cand, answer = await run(plan, lambda c: read(c.replica.address, spec.name, partition, raw, as_of_ms,
                                                          plan.bound))
        except FreshrouteError as e:
            count(self._core.metrics, started, e)
            raise
        lookup = count(self._core.metrics, started, lookup_result(spec.name, key, partition, cand, answer))
        return AsOf(lookup, as_of_ms, answer.version, self.final(spec, as_of_ms, answer))

    async def batch_as_of(self, table: str, keys: list[str], as_of_ms: int,
                          bound: Bound = NO_BOUND) -> list["AsOf | FreshrouteError"]:
        """Many keys as of one time, in request order: each key's answer, or the error of its key. The table's own
        refusals, too many keys or one the table cannot hold refuse the batch, as they refuse any batch."""
        spec = self.versioned(table, bound)
        _, _, groups, raw_keys = self._core.group_keys(spec.name, keys, bound)
        self.retained(spec, as_of_ms, self._core.clock_ms())
        partition_of = {i: partition for partition, indices in groups.items() for i in indices}
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(self._read_as_of(spec, key, raw_keys[i], partition_of[i], as_of_ms, bound,
                                                           started) for i, key in enumerate(keys)),
                                        return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, FreshrouteError):
                raise outcome
        return cast("list[AsOf | FreshrouteError]", outcomes)  # any other exception was raised just above

    async def versions(self, table: str, key: str, from_ms: int | None = None, to_ms: int | None = None,
                       limit: int | None = None, page_token: str | None = None, bound: Bound = NO_BOUND) -> Versions:
        """A page of ``key``'s versions valid at some time in ``[from_ms, to_ms)`` (default: all it keeps), newest
        first; ``page_token`` (a page's ``next_page_token``) goes on with older ones."""
        started = time.perf_counter()
        try:
            spec = self.versioned(table, bound)
            table = spec.name
            policy = self._core.policy
            limit = DEFAULT_VERSIONS_LIMIT if not limit else limit
            if not 0 < limit <= policy.scan_max_limit:
                raise InvalidArgument(f"limit must be within 1..{policy.scan_max_limit}", field="limit")
            from_ms = 0 if from_ms is None else from_ms
            to_ms = MAX_TIME_MS if to_ms is None else to_ms
            if page_token:
                to_ms = min(to_ms, parse_time("page_token", page_token))
            if from_ms > to_ms:
                raise InvalidArgument(f"from ({from_ms}) must not be after to ({to_ms})", field="from")
            from_ms = max(from_ms, self._core.clock_ms() - spec.history_retention_ms)
            raw, partition = locate(key, spec.partitions, spec.key_format)
            plan = self._plan(spec, partition, bound)
            read_range = self._core.store.read_range
            cand, answer = await run(plan, lambda c: read_range(c.replica.address, table, plan.partition, raw, b"",
                                                                limit + 1, VersionFilter(from_ms, to_ms), plan.bound))
        except FreshrouteError as e:
            count(self._core.metrics, started, e)
            raise
        page = tuple(answer.versions[:limit])
        more = len(answer.versions) > limit and page[-1].valid_from_ms > from_ms
        status = ReadStatus.OK if page else ReadStatus.NOT_FOUND
        lookup = count(self._core.metrics, started,
                       lookup_result(table, key, plan.partition, cand, ReadResult(status, b"", answer.replica)))
        return Versions(lookup, from_ms, to_ms, page, page[-1].valid_from_ms if more else None,
                        self.complete_ms(spec, answer))

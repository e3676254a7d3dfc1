"""The routing core: key → partition → the freshest replicas within the bound → attempts, for every kind of read.

The router's REST and gRPC fronts and :mod:`freshroute.client` are adapters over
:class:`RoutingCore`; everything they answer is decided here (or in the attempt engine it
drives), so all of them speak the same semantics and raise the same errors.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Callable, Mapping, NamedTuple, TypeVar, cast, overload

from freshroute.errors import (FreshrouteError, InvalidArgument, NotWindowedTable, ReplicaUnavailable, TableNotFound,
                               WindowedTable)
from freshroute.formats import locate, locate_text
from freshroute.bound import NO_BOUND, Bound
from freshroute.lag import now_ms
from freshroute.keys import not_a_batch
from freshroute.metadata.table_versions import logical_of
from freshroute.metadata.tables import TableSpec
from freshroute.routing.answers import GroupAnswers, group_lookups, lookup_result, served_by
from freshroute.routing.attempts import AttemptPlan, Attempts, LatencyWindow
from freshroute.routing.counts import Metrics, NoMetrics, count, count_group
from freshroute.routing.drivers import run, run_many
from freshroute.routing.history import HistoryReads
from freshroute.routing.scans import Scans
from freshroute.write_tokens.read_after import narrowed
from freshroute.routing.selection import Candidate, FreshestFirst, LoadTracker, ReplicaSelector
from freshroute.routing.policy import RoutingPolicy
from freshroute.routing.results import LookupResult, WindowsResult
from freshroute.routing.snapshot import LagOverlay, NodeView, Snapshot, SnapshotSource
from freshroute.routing.store import StoreClient
from freshroute.routing.views import MetadataViews
from freshroute.windows import MAX_START_MS, WindowSpec, key_range, windows_of
from freshroute.wire import RangeResult, WindowFilter

T = TypeVar("T")


class RoutingCore:
    """Routes reads over a metadata snapshot and a store client: the one implementation of "which replica, and what if it fails"."""

    def __init__(self, policy: RoutingPolicy, metadata: SnapshotSource, store: StoreClient, *,
                 selector: ReplicaSelector | None = None, metrics: Metrics | None = None,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        self.policy = policy
        self.metadata = metadata
        self.store = store
        self.metrics: Metrics = metrics if metrics is not None else NoMetrics()
        self.overlay = LagOverlay()
        self.load = LoadTracker(policy.failure_backoff_ms, clock_ms=clock_ms)
        self._freshest = FreshestFirst(self.load, self.overlay, policy.freshness_tolerance_offsets,
                                       policy.freshness_tolerance_ms, policy.view_trust_ms, clock_ms)
        self.selector: ReplicaSelector = selector if selector is not None else self._freshest
        self.views = MetadataViews(self, self._freshest, clock_ms)
        self.attempts = Attempts(policy.attempt_policy(), self.load, self.overlay, clock_ms, self.metrics)
        self.clock_ms = clock_ms
        self._tracked: Mapping[str, NodeView] | None = None
        self._timeout_s = policy.request_timeout_ms / 1000
        self.get_latency = self.attempts.window()
        self._group_latency = self.attempts.window()
        self._window_latency = self.attempts.window()
        self.history = HistoryReads(self, self.attempts.window(), self._timeout_s)  # a versioned table's reads
        self.scans = Scans(self, self.attempts.window(), policy.scan_timeout_ms / 1000)  # every partition's reads

    def on_snapshot(self, snap: Snapshot) -> None:
        """Called after each swap: drop what the new snapshot no longer names."""
        if snap.nodes is not self._tracked:  # snapshots share their nodes until a node's view changes
            self._tracked = snap.nodes
            self.store.track({n.address: n.read_address for n in snap.nodes.values()})
        # Heartbeats published since then carry newer lag than these responses did.
        self.overlay.prune(snap.built_ms - 2 * self.policy.node_expiry_ms)

    # ---- tables and bounds -------------------------------------------------------------

    def not_loaded(self) -> str:
        """Why no table can be read yet: no metadata so far, and the reason its source gave."""
        why = self.metadata.last_error
        return "routing metadata has not been loaded yet" + (f": {why}" if why else "")

    def resolved(self, name: str, bound: Bound) -> str:
        """The table a read of ``name`` reads: the served version's own, or that of ``bound.version``
        (:meth:`Snapshot.physical`); every read resolves its table first, and names it so from then on."""
        snap = self.metadata.current
        return snap.physical(name, bound.version) if snap.loaded else name

    def table(self, name: str) -> TableSpec:
        snap = self.metadata.current
        spec = snap.tables.get(name)
        if spec is None:
            if not snap.loaded:
                raise ReplicaUnavailable(self.not_loaded(), table=name)
            raise TableNotFound(f"no table {name!r}", table=name)
        return spec

    def bound_for(self, spec: TableSpec, bound: Bound) -> Bound:
        """The caller's bound with the table's defaults (the policy's over the table spec's) filled in.

        Checked here, once the table is known to exist: a position of another table is a caller's mistake, and a
        table further behind its input than ``max_input_lag_ms`` is refused before any replica is asked.
        """
        position = bound.min_position
        if position is not None and position.table != spec.name:
            if logical_of(position.table)[0] != logical_of(spec.name)[0]:
                raise InvalidArgument(f"min_position is a position of table {position.table!r}, not {spec.name!r}",
                                      field="min_position")
            # Another version's: its changelog's offsets say nothing of this one's (the answer names its version).
            bound = bound._replace(min_position=None)
        if bound.max_input_lag_ms is not None:
            refused = bound.input_lag_refusal(spec.name, self.input_lag(spec.name))
            if refused is not None:
                raise refused
        if bound.after is not None:
            bound = narrowed(spec, bound, self.metadata)
        override = self.policy.table_bounds.get(logical_of(spec.name)[0])
        if override is not None:
            return bound.with_defaults(override.max_lag, override.max_staleness_ms)
        return bound.with_defaults(spec.default_max_lag, spec.default_max_staleness_ms)

    def keyed(self, name: str) -> TableSpec:
        """A table read by key: one without windows."""
        spec = self.table(name)
        if spec.window is not None:
            raise WindowedTable(f"table {name!r} is windowed: read a key's windows at "
                                f"/v1/tables/{name}/keys/{{key}}/windows?from=MS&to=MS (gRPC GetWindows)", table=name)
        return spec

    def windowed(self, name: str, from_ms: int, to_ms: int) -> tuple[TableSpec, WindowSpec]:
        """A windowed table, and a time range of window starts it may be asked for."""
        spec = self.table(name)
        w = spec.window
        if w is None:
            raise NotWindowedTable(f"table {name!r} has no windows: read its keys at /v1/tables/{name}/keys/{{key}}",
                                   table=name)
        for what, v in (("from", from_ms), ("to", to_ms)):
            if type(v) is not int or not 0 <= v <= MAX_START_MS:
                raise InvalidArgument(f"{what} must be a whole number of milliseconds since the epoch, not {v!r}",
                                      field=what)
        if from_ms > to_ms:
            raise InvalidArgument(f"from ({from_ms}) must not be after to ({to_ms})", field="from")
        spans = w.windows_in(from_ms, to_ms)
        if spans > self.policy.max_windows:
            raise InvalidArgument(f"from..to spans up to {spans} windows of {w.slide_ms} ms, more than the maximum "
                                  f"{self.policy.max_windows}: narrow the range", field="to")
        return spec, w

    def input_lag(self, table: str) -> tuple[int, int]:
        """(records, ms) the table's changelog is behind its input now: where the input ends against where the
        pipeline has read to, so that a stopped pipeline never looks fresh. A replica's lag says how far it is
        behind the changelog; this is the rest of the way."""
        return self.metadata.current.input_lag_at(table, self.clock_ms())

    def value_format(self, table: str) -> str:
        """How the table's values are written (:mod:`freshroute.formats`): "json" for every pipeline table."""
        spec = self.metadata.current.tables.get(table)
        return spec.value_format if spec is not None else "json"

    def partition_of(self, spec: TableSpec, key: str) -> int:
        return locate(key, spec.partitions, spec.key_format)[1]

    def plan(self, table: str, partition: int, bound: Bound, latency: LatencyWindow, timeout_s: float,
             now: float) -> AttemptPlan:
        """The attempt plan of one read of one partition: candidates from the current snapshot. A caller's
        ``wait_ms`` is the read's deadline: how long it may wait for a replica with its events or position."""
        if bound.wait_ms is not None:
            timeout_s = bound.wait_ms / 1000
        selection = self.selector.select(self.metadata.current.replicas_of(table, partition), bound)
        return self.attempts.plan(table, partition, bound, selection, timeout_s, latency, now)

    def deadline(self, now: float, since: float | None = None) -> float:
        """When a read must have its answer: the request timeout from ``since`` (when it began, if before ``now``)."""
        return (now if since is None else since) + self._timeout_s

    def plan_get(self, table: str, key: str, bound: Bound, now: float,
                 since: float | None = None) -> tuple[TableSpec, bytes, AttemptPlan]:
        """(spec, key bytes, plan) of a point get; the spec's name is the table read. ``since``: when the read began,
        if before ``now`` (a compiled attempt first), so that it keeps one budget."""
        spec = self.keyed(self.resolved(table, bound))
        raw_key, partition = locate(key, spec.partitions, spec.key_format)
        return spec, raw_key, self.plan(spec.name, partition, self.bound_for(spec, bound), self.get_latency,
                                        self.deadline(now, since) - now, now)

    def group_keys(self, table: str, keys: list[str], bound: Bound) -> tuple[TableSpec, Bound, dict[int, list[int]], list[bytes]]:
        """A batch's table (its name the table read), bound, and key indices grouped by partition (with the keys'
        bytes)."""
        spec = self.keyed(self.resolved(table, bound))
        if len(keys) > self.policy.batch_max_keys:
            raise InvalidArgument(f"at most {self.policy.batch_max_keys} keys per batch", field="keys")
        groups: dict[int, list[int]] = {}
        raw_keys = []
        i = 0
        where = locate_text if spec.key_format == "string" else partial(locate, key_format=spec.key_format)
        try:  # costs nothing until a key fails: a batch's per-key work is most of its cost
            for i, key in enumerate(keys):
                raw, partition = where(key, spec.partitions)
                raw_keys.append(raw)
                groups.setdefault(partition, []).append(i)
        except (InvalidArgument, TypeError):
            raise not_a_batch(keys, i) from None
        return spec, self.bound_for(spec, bound), groups, raw_keys

    def plan_group(self, table: str, partition: int, bound: Bound, now: float, deadline: float) -> AttemptPlan:
        return self.plan(table, partition, bound, self._group_latency, deadline - now, now)

    # ---- reads ---------------------------------------------------------------------------

    async def get(self, table: str, key: str, bound: Bound = NO_BOUND, since: float | None = None) -> LookupResult:
        """Read one key from the freshest live replica within the bound; ``found`` False if absent. ``since``: when
        the read began (``time.monotonic()``), if earlier than now, its budget counted from then."""
        started = time.perf_counter()
        try:
            spec, raw_key, plan = self.plan_get(table, key, bound, time.monotonic(), since)
            partition, bound, table = plan.partition, plan.bound, spec.name
            read = self.store.read
            cand, answer = await run(plan, lambda c: read(c.replica.address, table, partition, raw_key, bound))
        except FreshrouteError as e:
            count(self.metrics, started, e)
            raise
        return count(self.metrics, started, lookup_result(table, key, partition, cand, answer))

    @overload
    async def batch_get(self, table: str, keys: list[str], bound: Bound = NO_BOUND,
                        answers: None = None, since: float | None = None) -> list[LookupResult | FreshrouteError]: ...

    @overload
    async def batch_get(self, table: str, keys: list[str], bound: Bound,
                        answers: GroupAnswers[T], since: float | None = None) -> list[T | FreshrouteError]: ...

    async def batch_get(self, table: str, keys: list[str], bound: Bound = NO_BOUND,
                        answers: GroupAnswers[T] | None = None,
                        since: float | None = None) -> list[T | FreshrouteError]:
        """Read many keys, one group per partition in parallel; per-key results (or errors) in request order.

        ``answers`` turns one group's answer into its keys' results (default: :func:`group_lookups`,
        giving :class:`LookupResult`); a key no replica could answer is its :class:`FreshrouteError`. ``since``: as
        :meth:`get`'s.
        """
        started = time.perf_counter()
        spec, bound, groups, raw_keys = self.group_keys(table, keys, bound)
        table = spec.name
        results: list[T | FreshrouteError | None] = [None] * len(keys)
        now = time.monotonic()
        deadline = self.deadline(now, since)
        make = answers or cast("GroupAnswers[T]", group_lookups)  # without answers, T is LookupResult
        parts = list(groups.items())
        plans = [self.plan_group(table, p, bound, now, deadline) for p, _ in parts]
        sent = [[raw_keys[i] for i in indices] for _, indices in parts]
        read_many = self.store.read_many
        outcomes = await run_many(plans, lambda j, c: read_many(c.replica.address, table, parts[j][0], sent[j], bound))
        elapsed = time.perf_counter() - started
        for (partition, indices), outcome in zip(parts, outcomes):
            count_group(self.metrics, outcome, len(indices), elapsed)
            if isinstance(outcome, FreshrouteError):
                for i in indices:
                    results[i] = outcome
                continue
            cand, answer = outcome
            for i, result in zip(indices, make(table, [keys[i] for i in indices], partition, cand, answer)):
                results[i] = result
        # every key is in one partition's group: none is left None
        return cast("list[T | FreshrouteError]", results)

    def plan_windows(self, table: str, key: str, from_ms: int, to_ms: int, bound: Bound, now: float) -> WindowsRead:
        """What a windows lookup reads (one key range of one partition) and its attempt plan."""
        spec, w = self.windowed(self.resolved(table, bound), from_ms, to_ms)
        raw, partition = locate(key, spec.partitions)
        lo, hi = key_range(raw, from_ms, to_ms)
        plan = self.plan(spec.name, partition, self.bound_for(spec, bound), self._window_latency, self._timeout_s,
                         now)
        return WindowsRead(spec.name, key, w, raw, lo, hi, max(1, w.windows_in(from_ms, to_ms)),
                           WindowFilter(from_ms, to_ms, w.size_ms + w.retention_ms), plan)

    async def windows(self, table: str, key: str, from_ms: int, to_ms: int, bound: Bound = NO_BOUND) -> WindowsResult:
        """The key's windows starting in ``[from_ms, to_ms)``, in start order, from one replica within the bound."""
        started = time.perf_counter()
        try:
            r = self.plan_windows(table, key, from_ms, to_ms, bound, time.monotonic())
            plan, read_range = r.plan, self.store.read_range
            cand, answer = await run(plan, lambda c: read_range(c.replica.address, r.table, plan.partition, r.lo,
                                                                r.hi, r.limit, r.live, plan.bound))
        except FreshrouteError as e:
            count(self.metrics, started, e)
            raise
        return count(self.metrics, started, r.result(cand, answer))


class WindowsRead(NamedTuple):
    """One windows lookup: the key range of its partition it reads, and how; ``result`` makes the answer."""

    table: str
    key: str
    window: WindowSpec
    raw_key: bytes
    lo: bytes
    hi: bytes
    limit: int
    live: WindowFilter
    plan: AttemptPlan

    def result(self, cand: Candidate, answer: RangeResult) -> WindowsResult:
        windows = list(windows_of(self.window, self.raw_key, answer.entries, answer.watermark_ms))
        return WindowsResult(self.table, self.key, windows, self.plan.partition, *served_by(cand, answer.replica),
                             answer.watermark_ms)

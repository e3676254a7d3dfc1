"""The routing metadata kept fresh: every ``refresh_ms`` the tables, heartbeats, assignment and the pipeline's
input ends, marks and rejections are read from Redis, a new :class:`~freshroute.routing.snapshot.Snapshot` built from
what changed and swapped in with one assignment. While Redis does not answer, the last good snapshot keeps serving."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Awaitable, Callable, Mapping

import orjson

from freshroute.lag import now_ms
from freshroute.heartbeats import Liveness, NodeFeed, Rejections
from freshroute.metadata.assignment import Assignment
from freshroute.metadata.progress import InputEnds, InputLag, InputMark, marks_from_json, rejections_from_json
from freshroute.metadata.schema import Keys
from freshroute.metadata.store import text
from freshroute.metadata.table_versions import VersionedTable
from freshroute.metadata.tables import TableSpec
from freshroute.routing.snapshot import EMPTY, ReplicaView, Snapshot, SnapshotBuilder, TablePartition

log = logging.getLogger(__name__)


async def refresh_until(refresh_once: Callable[[], Awaitable[bool]], period_s: float, stop: asyncio.Event) -> None:
    """Call ``refresh_once`` every ``period_s`` until ``stop`` is set."""
    while not stop.is_set():
        await refresh_once()
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except asyncio.TimeoutError:
            pass


class MetadataRefresher:
    """Rebuilds the snapshot from Redis every ``refresh_ms`` and swaps it in atomically."""

    def __init__(self, redis: Any, namespace: str, refresh_ms: int, node_expiry_ms: int,
                 timeout_ms: int = 500, reset_grace_ms: int = 5000,
                 on_swap: Callable[[Snapshot], None] | None = None,
                 clock_ms: Callable[[], int] = now_ms, source: str = "Redis") -> None:
        self._redis = redis
        self._source = source  # where the metadata is read from, as errors name it
        self._keys = Keys(namespace)
        self._refresh_s = refresh_ms / 1000
        self._node_expiry_ms = node_expiry_ms
        self._timeout_s = timeout_ms / 1000
        self._reset_grace_ms = reset_grace_ms
        self._on_swap = on_swap
        self._clock_ms = clock_ms
        self.current = Snapshot()
        self.redis_ok = False
        self.last_ok_ms = 0
        self.last_error: str | None = None
        self._failing_since: int | None = None
        self._reset_since: int | None = None
        self._tables_lost = False
        self._vanished: dict[TablePartition, int] = {}
        self._warned: set[str] = set()
        self.feed = NodeFeed(Rejections("router metadata"), positions=True)
        self.liveness = Liveness()
        self._builder = SnapshotBuilder(node_expiry_ms)
        self._tables: tuple[bytes | None, dict[str, TableSpec]] | None = None
        self.versions: Mapping[str, VersionedTable] = EMPTY  # read with the tables, whose version moves with them
        self._assignment: tuple[bytes | None, Assignment | None] | None = None
        self.input_lag: Mapping[str, InputLag] = EMPTY
        self.input_ends: Mapping[str, InputEnds] = EMPTY
        self.input_marks: Mapping[str, tuple[InputMark, ...]] = EMPTY
        self.rejected: Mapping[str, Mapping[int, Mapping[int, str]]] = EMPTY
        self._kept: dict[tuple[str, Any], tuple[Any, Any]] = {}  # (what, name) → (raw, decoded) of the last refresh
        self.assignor: str | None = None

    async def refresh_once(self) -> bool:
        """Read Redis and swap in a new snapshot; on any failure keep the current one."""
        try:
            async with asyncio.timeout(self._timeout_s):
                tables, assignment = await self._read()
        except Exception as e:  # noqa: BLE001 — any Redis or decode failure means "keep the last view"
            self._note_failure(e)
            return False
        now = self._clock_ms()
        if self._failing_since is not None:
            log.warning("metadata: Redis reachable again after %d ms; serving a fresh snapshot",
                        now - self._failing_since)
            self._failing_since = None
        self.redis_ok = True
        self.last_ok_ms = now
        self.last_error = None
        prev = self.current
        if not tables and prev.tables:
            # No table is ever dropped by emptying the whole hash: an empty one means Redis
            # lost its state. Keep routing the tables we know until they are registered again.
            if not self._tables_lost:
                self._tables_lost = True
                log.warning("metadata: Redis has no table specs; keeping the %d known tables", len(prev.tables))
            tables = dict(prev.tables)
        else:
            self._tables_lost = False
        self.liveness.observe(self.feed.beats, now)
        if self._looks_reset(now):
            return False
        snap, dirty = self._builder.build(tables, self.feed.reports, self.liveness.heard, assignment, now,
                                          self.feed.positions, self.feed.take_moved())
        # A record is never deleted while its table is there: one that vanished went with a Redis that lost its state.
        versions = self.versions
        if any(t in tables and t not in versions for t in prev.versions):
            versions = MappingProxyType({**{t: v for t, v in prev.versions.items() if t in tables}, **versions})
        self.current = replace(self._carry_over(prev, snap, now, dirty), input_lag=self.input_lag,
                               input_ends=self.input_ends, input_marks=self.input_marks, rejected=self.rejected,
                               assignor=self.assignor, versions=versions)
        if self._on_swap is not None:
            self._on_swap(self.current)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh until ``stop`` is set."""
        await refresh_until(self.refresh_once, self._refresh_s, stop)

    async def _read(self) -> tuple[dict[str, TableSpec], Assignment | None]:
        """Bring the node feed up to date, the tables' input lag, who holds the assignor lease, and the tables and
        assignment when their version moved."""
        keys = self._keys
        pipe = self._redis.pipeline(transaction=False)
        n = self.feed.ask_changes(pipe, keys)
        pipe.mget([keys.tables_version, keys.assignment_version, keys.assignor])
        pipe.hgetall(keys.input_lag)
        pipe.hgetall(keys.input_ends)
        pipe.hgetall(keys.input_marks)
        pipe.hgetall(keys.input_rejected)
        replies = await pipe.execute()
        ids = self.feed.changed_ids(*replies[:n])
        tables_version, assignment_version, lease = replies[n]
        self.assignor = text(lease).rpartition(":")[0] or None if lease else None
        self.input_lag = self._decoded(InputLag.from_json, replies[n + 1], "input lag")
        self.input_ends = self._decoded(InputEnds.from_json, replies[n + 2], "input ends")
        self.input_marks = self._decoded(marks_from_json, replies[n + 3], "input marks")
        self.rejected = self._decoded(rejections_from_json, replies[n + 4], "rejected input")
        read_tables = self._tables is None or self._tables[0] != tables_version
        read_assignment = self._assignment is None or self._assignment[0] != assignment_version
        out: list[Any] = []
        pipe = self._redis.pipeline(transaction=False)
        n = self.feed.ask_reports(pipe, keys, ids)
        if read_tables:
            pipe.hgetall(keys.tables)
            pipe.hgetall(keys.table_versions)
        if read_assignment:
            pipe.get(keys.assignment)
        if n or read_tables or read_assignment:
            out = await pipe.execute()
        if read_tables:
            raw_tables = out[n]
            tables: dict[str, TableSpec] = {}
            for name, raw in raw_tables.items():
                spec = self._decode(TableSpec.from_json, raw, "table spec")
                if spec is not None:
                    tables[text(name)] = spec
            self._tables = (tables_version, tables)
            self.versions = self._decoded(VersionedTable.from_json, out[n + 1], "table versions")
        if read_assignment:
            raw_assignment = out[-1]
            self._assignment = (assignment_version, self._decode(Assignment.from_json, raw_assignment, "assignment")
                                if raw_assignment else None)
        self.feed.absorb(ids, out[:n])
        assert self._tables is not None and self._assignment is not None
        return self._tables[1], self._assignment[1]

    def _looks_reset(self, now: int) -> bool:
        """True while a Redis that lost its state (restart) should not replace a populated view.

        Redis holds soft state only; after a restart it has no heartbeats until the store
        nodes republish (within a heartbeat interval). Every node vanishing at once is far
        more likely that than a whole cluster dying, so it is believed only once it has
        lasted the grace period.
        """
        prev = self.current
        emptied = prev.loaded and bool(prev.nodes) and not self.feed.reports
        if not emptied:
            self._reset_since = None
            return False
        if self._reset_since is None:
            self._reset_since = now
            log.warning("metadata: Redis has no node heartbeats; keeping the last snapshot for up to %d ms",
                        self._reset_grace_ms)
        return now - self._reset_since < self._reset_grace_ms

    def _carry_over(self, prev: Snapshot, snap: Snapshot, now: int, dirty: set[TablePartition]) -> Snapshot:
        """Keep a partition's last known replicas, for the grace period, when a refresh shows none.

        Heartbeats come back one node at a time after Redis lost them, so for a moment a
        partition can look unhosted although its replicas are serving. Routing to them costs
        at most a failed attempt (the store answers NOT_HOSTED if it really let go); routing
        nowhere fails the lookup for sure.
        """
        carried: dict[TablePartition, tuple[ReplicaView, ...]] = {}
        # Only a partition whose replicas changed in this build can have lost its last one.
        for tp in dirty.union(self._vanished):
            kept = tuple(v for v in prev.replicas_of(*tp) if v.reported)
            if not kept:
                continue
            if any(v.reported for v in snap.replicas_of(*tp)):
                self._vanished.pop(tp, None)
                continue
            # An emptied Redis already counted against the grace (see _looks_reset).
            since = self._vanished.setdefault(tp, self._reset_since if self._reset_since is not None else now)
            if now - since < self._reset_grace_ms:
                carried[tp] = kept
            else:
                del self._vanished[tp]
        for tp in [tp for tp in self._vanished if tp not in prev.replicas]:
            del self._vanished[tp]
        if not carried:
            return snap
        replicas = dict(snap.replicas)
        replicas.update(carried)
        nodes = dict(snap.nodes)
        for views in carried.values():
            for v in views:
                if v.node not in nodes and v.node in prev.nodes:
                    nodes[v.node] = prev.nodes[v.node]
        return replace(snap, replicas=MappingProxyType(replicas), nodes=MappingProxyType(nodes))

    def _decoded(self, fn: Callable[[Any], Any], entries: Mapping[Any, Any], what: str) -> Mapping[str, Any]:
        """A hash's entries decoded by name; malformed ones skipped. An entry read as it was last time is not decoded
        again (most entries change far less often than every refresh)."""
        out = {}
        for name, raw in entries.items():
            kept = self._kept.get((what, name))
            if kept is not None and kept[0] == raw:
                out[text(name)] = kept[1]
                continue
            value = self._decode(fn, raw, what)
            if len(self._kept) < 10_000:
                self._kept[(what, name)] = (raw, value)
            out[text(name)] = value
        return MappingProxyType({name: v for name, v in out.items() if v is not None})

    def _decode(self, fn: Callable[[Any], Any], raw: Any, what: str) -> Any:
        """Decode one entry; a malformed entry is skipped rather than failing the whole refresh."""
        try:
            return fn(raw)
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as e:
            # Warn once per distinct problem: the same bad entry is re-read every refresh.
            problem = f"{what}: {e}"
            if problem not in self._warned and len(self._warned) < 100:
                self._warned.add(problem)
                log.warning("metadata: skipping malformed %s", problem)
            return None

    def _note_failure(self, e: BaseException) -> None:
        self.redis_ok = False
        self.last_error = f"{self._source} does not answer ({type(e).__name__}: {e})"
        if self._failing_since is None:
            self._failing_since = self._clock_ms()
            # One line per outage, not per refresh.
            log.warning("metadata: cannot read Redis (%s: %s); serving the last snapshot with liveness frozen",
                        type(e).__name__, e)

"""What the router answers with: value objects shared by the REST and gRPC adapters, and page tokens.

Each result becomes a REST body one way, its ``to_dict`` (the CLI prints the same shape); who
answered and how fresh is :func:`served_doc` wherever an answer carries it. The gRPC messages
are made in :mod:`router.grpc_messages`, one function per result; the client's values in
:mod:`freshroute.client.lookup`.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

import orjson

from freshroute.errors import FreshrouteError, InvalidArgument, KeyNotFound
from freshroute.lag import now_ms
from freshroute.position import Position, single
from freshroute.metadata.catch_up import CatchUp
from freshroute.metadata.progress import InputLag
from freshroute.metadata.table_versions import VersionedTable, listing, named
from freshroute.metadata.tables import TableSpec
from freshroute.windows import Window
from freshroute.wire import Version


class LookupResult(NamedTuple):
    """One key's answer and who gave it; ``found`` False still says where and how fresh (a tuple: one per lookup)."""

    table: str
    key: str
    partition: int
    found: bool
    value: bytes  # the store's JSON bytes, untouched
    node: str
    role: str
    lag_offsets: int | None  # None: the replica does not know its changelog's end offset yet
    lag_ms: int | None  # None: the replica has never been caught up
    applied: int

    @property
    def position(self) -> str:
        return position_token(self.table, self.partition, self.applied)

    def served(self) -> dict[str, Any]:
        return served_doc(self.node, self.role, self.lag_offsets, self.lag_ms, self.position)

    def where(self) -> dict[str, Any]:
        """Partition, serving replica, lag and position: carried by 200s and KEY_NOT_FOUND alike."""
        return {"table": self.table, "key": self.key, "partition": self.partition, **self.served()}

    def to_dict(self, input_lag: tuple[int, int] = (0, 0), value_format: str = "json") -> dict[str, Any]:
        """A found key's REST body."""
        return {**named(self.table), "key": self.key, **value_fields(value_format, self.value),
                "partition": self.partition, **self.served(), "input_lag": input_lag_doc(input_lag)}


def value_fields(fmt: str, raw: bytes) -> dict[str, Any]:
    """A found value as a REST body carries it: ``{"value": …}``, or ``{"value_b64": …}`` for bytes. Store nodes
    keep only values of the table's format (:func:`~freshroute.formats.value_problem`), so JSON goes in as it is."""
    if fmt == "json":
        return {"value": orjson.Fragment(raw)}
    if fmt == "string":
        return {"value": raw.decode("utf-8")}
    return {"value_b64": base64.b64encode(raw).decode("ascii")}


def served_doc(node: str, role: str, lag_offsets: int | None, lag_ms: int | None, position: str) -> dict[str, Any]:
    """Who answered and how fresh it was, as every answer carries it: ``served_by``, ``lag`` (null: unknown) and
    ``position``."""
    return {"served_by": {"node": node, "role": role}, "lag": {"offsets": lag_offsets, "ms": lag_ms},
            "position": position}


def json_value(raw: bytes) -> Any:
    """A stored JSON value as it goes into a body: as it is, neither decoded nor encoded again."""
    return orjson.Fragment(raw) if raw else None


@lru_cache(maxsize=16384)
def position_token(table: str, partition: int, applied: int) -> str:
    # Many lookups in a row see the same applied offset; encoding costs more than a cache hit.
    return single(table, partition, applied)


def lag_message_doc(lag: Any) -> dict[str, int | None]:
    """A gRPC ``Lag`` as REST shows it: an unset field (unknown) is null, never 0."""
    return {"offsets": lag.offsets if lag.HasField("offsets") else None, "ms": lag.ms if lag.HasField("ms") else None}


def input_lag_doc(lag: tuple[int, int]) -> dict[str, int]:
    """How far the table's changelog is behind its input, as answers carry it beside the replica's own lag."""
    return {"records": lag[0], "ms": lag[1]}


def pipeline_doc(lag: InputLag | None, now: int | None = None) -> dict[str, Any]:
    """Whether a pipeline is running the table's query (it speaks once a second), and when its last micro-batch was."""
    if lag is None:
        return {"alive": False, "last_progress_ms": None}
    return {"alive": lag.alive(now_ms() if now is None else now), "last_progress_ms": lag.at_ms}


def key_not_found(result: LookupResult, input_lag: tuple[int, int] = (0, 0)) -> KeyNotFound:
    return KeyNotFound(f"key {result.key!r} not found in table {result.table!r}", **result.where(),
                       input_lag=input_lag_doc(input_lag))


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    node: str
    address: str
    role: str
    state: str | None
    alive: bool
    lag_offsets: int | None  # None: unknown (the replica has not learnt its end offset, or has not reported)
    lag_ms: int | None  # None: the replica has not reported
    applied: int
    end: int | None
    failure: str | None = None  # why it is FAILED

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "address": self.address, "role": self.role, "state": self.state,
                "alive": self.alive, "lag": {"offsets": self.lag_offsets, "ms": self.lag_ms},
                "applied_offset": self.applied, "end_offset": self.end, "failure": self.failure}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReplicaInfo":
        return cls(d["node"], d["address"], d["role"], d.get("state"), bool(d["alive"]),
                   optional_int(d["lag"]["offsets"]), optional_int(d["lag"]["ms"]), int(d["applied_offset"]),
                   optional_int(d["end_offset"]), d.get("failure"))


def optional_int(value: Any) -> int | None:
    """A JSON number that may be null (unknown): never read as 0."""
    return None if value is None else int(value)


@dataclass(frozen=True)
class KeyLocation:
    """Where a key lives: its partition, the active replica and the standbys, each with lag."""

    table: str
    key: str
    partition: int
    active: ReplicaInfo | None
    standbys: list[ReplicaInfo]

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "key": self.key, "partition": self.partition,
                "active": self.active.to_dict() if self.active else None,
                "standbys": [s.to_dict() for s in self.standbys]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KeyLocation":
        return cls(d["table"], d["key"], int(d["partition"]), ReplicaInfo.from_dict(d["active"]) if d.get("active")
                   else None, [ReplicaInfo.from_dict(s) for s in d["standbys"]])


@dataclass(frozen=True)
class HostedReplica:
    """A replica as the cluster view lists it under its node."""

    table: str
    partition: int
    info: ReplicaInfo

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "partition": self.partition, **self.info.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HostedReplica":
        return cls(d["table"], int(d["partition"]), ReplicaInfo.from_dict(d))


@dataclass(frozen=True)
class NodeState:
    """A store node as the routing metadata knows it, with every replica it hosts or is assigned."""

    node: str
    address: str  # "" for a node assigned replicas but never heard from
    read_address: str | None
    alive: bool
    heartbeat_age_ms: int | None  # None: never heard from
    draining: bool
    replicas: list[HostedReplica]

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "address": self.address, "read_address": self.read_address, "alive": self.alive,
                "heartbeat_age_ms": self.heartbeat_age_ms, "draining": self.draining,
                "replicas": [r.to_dict() for r in self.replicas]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NodeState":
        return cls(d["node"], d["address"], d.get("read_address"), bool(d["alive"]),
                   optional_int(d.get("heartbeat_age_ms")), bool(d.get("draining")),
                   [HostedReplica.from_dict(r) for r in d["replicas"]])


@dataclass(frozen=True)
class TablePipeline:
    """Whether a pipeline runs a table's query, its last micro-batch, and how far behind its input that leaves it."""

    table: str
    alive: bool
    last_progress_ms: int | None
    input_lag: tuple[int, int]  # (records, ms)

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "alive": self.alive, "last_progress_ms": self.last_progress_ms,
                "input_lag": input_lag_doc(self.input_lag)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TablePipeline":
        lag = d.get("input_lag") or {}
        return cls(d["table"], bool(d["alive"]), optional_int(d.get("last_progress_ms")),
                   (int(lag.get("records", 0)), int(lag.get("ms", 0))))


@dataclass(frozen=True)
class MetadataHealth:
    """How old the routing metadata is, and whether Redis answered its last read."""

    loaded: bool
    age_ms: int | None  # None: nothing loaded yet
    redis_ok: bool

    def to_dict(self) -> dict[str, Any]:
        return {"loaded": self.loaded, "age_ms": self.age_ms, "redis_ok": self.redis_ok}


@dataclass(frozen=True)
class ClusterView:
    """Nodes with liveness and per-replica lag, the assignment, each table's pipeline, and how old this view is."""

    nodes: list[NodeState]
    assignment_generation: int | None
    assignment: list[tuple[str, int, tuple[str, ...]]] | None  # (table, partition, nodes); None: none published
    pipelines: list[TablePipeline]
    metadata: MetadataHealth

    def to_dict(self) -> dict[str, Any]:
        assignment = None if self.assignment is None else [
            {"table": t, "partition": p, "nodes": list(ns)} for t, p, ns in self.assignment]
        return {"nodes": [n.to_dict() for n in self.nodes], "assignment_generation": self.assignment_generation,
                "assignment": assignment, "pipelines": [t.to_dict() for t in self.pipelines],
                "metadata": self.metadata.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClusterView":
        """From a router's ``/v1/cluster`` answer."""
        meta = d["metadata"]
        assignment = None if d.get("assignment") is None else [
            (a["table"], int(a["partition"]), tuple(a["nodes"])) for a in d["assignment"]]
        return cls([NodeState.from_dict(n) for n in d["nodes"]], optional_int(d.get("assignment_generation")),
                   assignment, [TablePipeline.from_dict(t) for t in d.get("pipelines", ())],
                   MetadataHealth(bool(meta["loaded"]), optional_int(meta.get("age_ms")), bool(meta["redis_ok"])))


@dataclass(frozen=True)
class TableInfo:
    spec: TableSpec
    default_max_lag: int | None
    default_max_staleness_ms: int | None
    input_lag: tuple[int, int] = (0, 0)  # (records, ms) the table's changelog is behind its input
    pipeline: InputLag | None = None  # what the pipeline last published for the table; None: nothing
    versions: VersionedTable | None = None  # its version record; None: one version, unrecorded (a topic served)
    version_lags: Mapping[int, tuple[int, int]] = field(default_factory=dict)  # version → its input lag, where known
    # A version building → its progress and when it will have caught up (freshroute.metadata.catch_up)
    version_catch_ups: Mapping[int, CatchUp] = field(default_factory=dict)

    def versions_doc(self) -> dict[str, Any]:
        """``version`` served and ``versions``, each with its input lag and, building, its progress and estimate."""
        return listing(self.versions, {v: input_lag_doc(lag) for v, lag in self.version_lags.items()},
                       {v: way.to_dict() for v, way in self.version_catch_ups.items()})

    def to_dict(self, now: int | None = None) -> dict[str, Any]:
        s = self.spec
        out = {"name": s.name, "topic": s.topic, "partitions": s.partitions, "replicas": 1 + s.standby_replicas,
               "standby_replicas": s.standby_replicas, "key_column": s.key_column, "schema": dict(s.value_schema),
               "default_bound": {"max_lag": self.default_max_lag, "max_staleness_ms": self.default_max_staleness_ms},
               "input_lag": input_lag_doc(self.input_lag), "pipeline": pipeline_doc(self.pipeline, now),
               "key_format": s.key_format, "value_format": s.value_format, "origin": s.origin,
               "pipeline_mode": s.pipeline_mode, "query": s.query, "history_retention_ms": s.history_retention_ms,
               **self.versions_doc()}
        if s.window is not None:
            w = s.window
            out["window"] = {"size_ms": w.size_ms, "slide_ms": w.slide_ms, "grace_ms": w.grace_ms,
                             "retention_ms": w.retention_ms}
        return out



@dataclass(frozen=True)
class ScanPage:
    """A page of a table's keys across partitions; as of a time (a versioned table's), each with its version."""

    table: str
    items: list[tuple[str, bytes, int]]  # (key, value JSON bytes, partition), ascending by key bytes
    next_page_token: str | None
    served_by: dict[int, LookupResult]  # per partition: who answered, with lag and position (found=False)
    versions: tuple[Version, ...] = ()  # as of a time: each item's version, in item order
    as_of_ms: int | None = None
    final: bool = False  # as of a time: every partition's replica had every change up to it

    def items_with_versions(self) -> Iterator[tuple[tuple[str, bytes, int], Version | None]]:
        """Each item with its version (None: the scan was not as of a time)."""
        return zip(self.items, self.versions if self.as_of_ms is not None else [None] * len(self.items))

    def to_dict(self, input_lag: tuple[int, int] = (0, 0), value_format: str = "json") -> dict[str, Any]:
        items = []
        for (k, v, p), version in self.items_with_versions():
            item = {"key": k, **value_fields(value_format, v), "partition": p}
            if version is not None:
                item["valid_from"], item["valid_to"] = version.valid_from_ms, version.valid_to_ms
            items.append(item)
        out: dict[str, Any] = {
            **named(self.table), "items": items, "next_page_token": self.next_page_token,
            "partitions": [{"partition": p, **r.served()} for p, r in sorted(self.served_by.items())],
            "input_lag": input_lag_doc(input_lag)}
        if self.as_of_ms is not None:
            out["as_of"], out["final"] = self.as_of_ms, self.final
        return out


@dataclass(frozen=True)
class BatchResult:
    """A batch lookup's answers, one per key asked in order: a result (found or not), or the error of its key."""

    table: str
    keys: Sequence[str]
    results: Sequence[LookupResult | FreshrouteError]

    def position(self) -> str | None:
        """The position of everything the batch read: the highest offset it saw of each partition."""
        offsets: dict[int, int] = {}
        for r in self.results:
            if isinstance(r, LookupResult):
                offsets[r.partition] = max(offsets.get(r.partition, 0), r.applied)
        return Position(self.table, offsets).encode() if offsets else None

    def to_dict(self, input_lag: tuple[int, int] = (0, 0), value_format: str = "json") -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for key, r in zip(self.keys, self.results):
            if isinstance(r, LookupResult):
                item = {"key": key, "found": r.found, "partition": r.partition, **r.served()}
                if r.found:
                    item.update(value_fields(value_format, r.value))
                items.append(item)
            else:
                items.append({"key": key, "found": False, **r.to_body()})
        return {**named(self.table), "results": items, "position": self.position(),
                "input_lag": input_lag_doc(input_lag)}


class WindowsResult(NamedTuple):
    """One key's windows in a time range, and who gave them (all windows of a key live on one replica)."""

    table: str
    key: str
    windows: list[Window]  # in start order
    partition: int
    node: str
    role: str
    lag_offsets: int | None  # None: the replica does not know its changelog's end offset yet
    lag_ms: int | None  # None: the replica has never been caught up
    applied: int
    watermark_ms: int | None

    @property
    def position(self) -> str:
        return position_token(self.table, self.partition, self.applied)

    def served(self) -> dict[str, Any]:
        return served_doc(self.node, self.role, self.lag_offsets, self.lag_ms, self.position)

    def to_dict(self, input_lag: tuple[int, int] = (0, 0)) -> dict[str, Any]:
        return {**named(self.table), "key": self.key,
                "windows": [{"start": w.start, "end": w.end, "value": json_value(w.value), "final": w.final}
                            for w in self.windows],
                "partition": self.partition, **self.served(), "watermark_ms": self.watermark_ms,
                "input_lag": input_lag_doc(input_lag)}


@dataclass(frozen=True)
class WindowPage:
    """A page of a windowed table's windows across keys, ordered by (key bytes, window start)."""

    table: str
    items: list[tuple[str, Window, int]]  # (key, window, partition)
    next_page_token: str | None
    served_by: dict[int, WindowsResult]  # per partition: who answered, with lag, position and watermark (no windows)

    def to_dict(self, input_lag: tuple[int, int] = (0, 0)) -> dict[str, Any]:
        return {**named(self.table),
                "items": [{"key": k, "start": w.start, "end": w.end, "value": json_value(w.value), "final": w.final,
                           "partition": p} for k, w, p in self.items],
                "next_page_token": self.next_page_token,
                "partitions": [{"partition": p, **r.served()} for p, r in sorted(self.served_by.items())],
                "input_lag": input_lag_doc(input_lag)}


# A scan page token is the table, the query it pages, and the last key returned; the next page starts just after it.
_PAGE_PREFIX = "s1."


def encode_page_token(table: str, after: bytes, query: str = "") -> str:
    body = table.encode() + b"\x00" + (query.encode() + b"\x00" if query else b"") + after
    return _PAGE_PREFIX + base64.urlsafe_b64encode(body).rstrip(b"=").decode()


def decode_page_token(table: str, token: str, query: str = "") -> bytes:
    """The key after which a scan resumes; malformed tokens, or tokens of another table or query, are an InvalidArgument."""
    body = token[len(_PAGE_PREFIX):] if token.startswith(_PAGE_PREFIX) else None
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)) if body is not None else b""
    except (binascii.Error, ValueError):
        raw = b""
    t, sep, after = raw.partition(b"\x00")
    if query and sep:
        q, sep, after = after.partition(b"\x00")
        sep = sep if q == query.encode() else b""
    if not sep or t != table.encode():
        what = "this table" + (" and time range" if query else "")
        raise InvalidArgument(f"page_token is not a page token of {what}", field="page_token")
    return after


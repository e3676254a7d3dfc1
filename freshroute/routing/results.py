"""What the router answers with: value objects shared by the REST and gRPC adapters, and page tokens."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from freshroute.errors import InvalidArgument, KeyNotFound
from freshroute.metadata import InputLag, TableSpec, now_ms
from freshroute.position import single
from freshroute.windows import Window


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
    lag_ms: int
    applied: int

    @property
    def position(self) -> str:
        return position_token(self.table, self.partition, self.applied)

    def where(self) -> dict[str, Any]:
        """Partition, serving replica, lag and position: carried by 200s and KEY_NOT_FOUND alike."""
        return {"table": self.table, "key": self.key, "partition": self.partition,
                "served_by": {"node": self.node, "role": self.role},
                "lag": {"offsets": self.lag_offsets, "ms": self.lag_ms}, "position": self.position}


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


@dataclass(frozen=True)
class TableInfo:
    spec: TableSpec
    default_max_lag: int | None
    default_max_staleness_ms: int | None
    input_lag: tuple[int, int] = (0, 0)  # (records, ms) the table's changelog is behind its input
    pipeline: InputLag | None = None  # what the pipeline last published for the table; None: nothing

    def to_dict(self, now: int | None = None) -> dict[str, Any]:
        s = self.spec
        out = {"name": s.name, "topic": s.topic, "partitions": s.partitions, "replicas": 1 + s.standby_replicas,
               "standby_replicas": s.standby_replicas, "key_column": s.key_column, "schema": dict(s.value_schema),
               "default_bound": {"max_lag": self.default_max_lag, "max_staleness_ms": self.default_max_staleness_ms},
               "input_lag": input_lag_doc(self.input_lag), "pipeline": pipeline_doc(self.pipeline, now),
               "key_format": s.key_format, "value_format": s.value_format, "origin": s.origin}
        if s.window is not None:
            w = s.window
            out["window"] = {"size_ms": w.size_ms, "slide_ms": w.slide_ms, "grace_ms": w.grace_ms,
                             "retention_ms": w.retention_ms}
        return out



@dataclass(frozen=True)
class ScanPage:
    table: str
    items: list[tuple[str, bytes, int]]  # (key, value JSON bytes, partition), ascending by key bytes
    next_page_token: str | None
    served_by: dict[int, LookupResult]  # per partition: who answered, with lag and position (found=False)


class WindowsResult(NamedTuple):
    """One key's windows in a time range, and who gave them (all windows of a key live on one replica)."""

    table: str
    key: str
    windows: list[Window]  # in start order
    partition: int
    node: str
    role: str
    lag_offsets: int | None  # None: the replica does not know its changelog's end offset yet
    lag_ms: int
    applied: int
    watermark_ms: int | None

    @property
    def position(self) -> str:
        return position_token(self.table, self.partition, self.applied)

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "key": self.key, "windows": [w.to_dict() for w in self.windows],
                "partition": self.partition, "served_by": {"node": self.node, "role": self.role},
                "lag": {"offsets": self.lag_offsets, "ms": self.lag_ms}, "position": self.position,
                "watermark_ms": self.watermark_ms}


@dataclass(frozen=True)
class WindowPage:
    """A page of a windowed table's windows across keys, ordered by (key bytes, window start)."""

    table: str
    items: list[tuple[str, Window, int]]  # (key, window, partition)
    next_page_token: str | None
    served_by: dict[int, WindowsResult]  # per partition: who answered, with lag, position and watermark (no windows)


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


"""A store node's heartbeat records: its report (who it is, where it serves, each replica's role, state and lag),
rewritten when its shape changes, and the packed positions it publishes between reports as its replicas move."""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass, replace
from typing import Any

import orjson

from freshroute.lag import ReplicaLag
from freshroute.metadata.roles import ReplicaState, Role


@dataclass(frozen=True)
class ReplicaReport:
    """One hosted replica as its node reports it."""

    table: str
    partition: int
    role: Role
    state: ReplicaState
    applied: int
    end: int | None  # None: not learnt yet
    staleness_ms: int
    failure: str | None = None  # why it is FAILED

    @property
    def lag(self) -> ReplicaLag:
        return ReplicaLag(self.applied, self.end, self.staleness_ms)

    def within(self, offsets: int) -> bool:
        """Known to be at most ``offsets`` behind its changelog's end (an end not learnt yet is not known)."""
        return self.end is not None and self.end - self.applied <= offsets

    def to_dict(self) -> dict[str, Any]:
        d = {"table": self.table, "partition": self.partition, "role": self.role.value,
             "state": self.state.value, "applied": self.applied, "end": self.end,
             "staleness_ms": self.staleness_ms}
        if self.failure is not None:
            d["failure"] = self.failure
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReplicaReport":
        # Enum lookups by dict: routers and the assignor decode every changed report's replicas.
        return cls(d["table"], int(d["partition"]), _ROLES[d["role"]], _STATES[d["state"]],
                   int(d["applied"]), None if d["end"] is None else int(d["end"]), int(d["staleness_ms"]),
                   d.get("failure"))


_ROLES = {r.value: r for r in Role}
_STATES = {s.value: s for s in ReplicaState}


# The heartbeat format; a reader skips (and counts) a report of a version it does not know.
REPORT_VERSION = 1
# A report larger than this is refused unread: about 30,000 replicas, far beyond any real node.
MAX_REPORT_BYTES = 4 * 1024 * 1024
NODE_ID_PATTERN = r"^[A-Za-z0-9_.\-]+$"  # what a node may call itself; readers ignore beats under other ids


class UnknownReportVersion(ValueError):
    """A report in a format this reader does not know (a newer node)."""


class OversizedReport(ValueError):
    """A report over :data:`MAX_REPORT_BYTES`."""


@dataclass(frozen=True)
class NodeReport:
    """A store node's heartbeat: who it is, where it serves, and every replica's lag.

    ``heartbeat_ms`` is when the node made the report (its figures were true then); the
    node's liveness is its latest beat, kept apart (see :meth:`freshroute.metadata.store.MetadataStore.beats`).
    """

    node_id: str
    address: str
    heartbeat_ms: int
    replicas: tuple[ReplicaReport, ...] = ()
    rack: str | None = None
    draining: bool = False
    read_address: str | None = None  # the node's read port, if it offers one (else reads use gRPC)

    def to_json(self) -> bytes:
        return orjson.dumps({"v": REPORT_VERSION, "node_id": self.node_id, "address": self.address,
                             "rack": self.rack, "heartbeat_ms": self.heartbeat_ms, "draining": self.draining,
                             "read_address": self.read_address,
                             "replicas": [r.to_dict() for r in self.replicas]})

    @classmethod
    def from_json(cls, raw: bytes | str) -> "NodeReport":
        """Decode a report; raises :class:`OversizedReport`, :class:`UnknownReportVersion`, or
        ValueError (or KeyError, TypeError) for one that is malformed."""
        if len(raw) > MAX_REPORT_BYTES:
            raise OversizedReport(f"report of {len(raw)} bytes is over the limit of {MAX_REPORT_BYTES}")
        d = orjson.loads(raw)
        if d.get("v", REPORT_VERSION) != REPORT_VERSION:
            raise UnknownReportVersion(f"report version {d.get('v')!r} is unknown (this reader knows {REPORT_VERSION})")
        return cls(str(d["node_id"]), str(d["address"]), int(d["heartbeat_ms"]),
                   tuple(ReplicaReport.from_dict(r) for r in d.get("replicas", ())),
                   d.get("rack"), bool(d.get("draining", False)), d.get("read_address"))


@dataclass(frozen=True, slots=True)
class NodePositions:
    """A report's replicas' positions as they moved since it was published.

    Under writes every replica's positions move at every beat; everything else in a report
    rarely changes. Nodes publish these instead of the whole report then, and readers that
    need current lags (routers) apply them, by replica order, to the report they belong to
    (``report_ms``, the report's ``heartbeat_ms``): a few hundred bytes that decode at once,
    where the report is kilobytes of JSON and objects per replica.
    """

    report_ms: int
    observed_ms: int  # when these positions were true (the node's clock)
    # (applied, end, staleness_ms) for each replica, in the report's order. An array: decoding
    # is a copy of the bytes, and the garbage collector never walks it.
    values: array[int]

    def __post_init__(self) -> None:
        if not isinstance(self.values, array):
            object.__setattr__(self, "values", array("q", self.values))

    @classmethod
    def of(cls, report: "NodeReport", report_ms: int) -> "NodePositions":
        return cls(report_ms, report.heartbeat_ms,
                   array("q", (x for r in report.replicas
                               for x in (r.applied, UNKNOWN_END if r.end is None else r.end, r.staleness_ms))))

    def fits(self, report: "NodeReport") -> bool:
        """Whether these are positions of ``report``'s replicas."""
        return self.report_ms == report.heartbeat_ms and len(self.values) == 3 * len(report.replicas)

    def applied_to(self, report: "NodeReport") -> "NodeReport":
        """``report`` as these positions move it (itself if they do not fit it or are older)."""
        if not self.fits(report) or self.observed_ms <= report.heartbeat_ms:
            return report
        moved = (self.replica(i) for i in range(len(report.replicas)))
        return replace(report, heartbeat_ms=self.observed_ms, replicas=tuple(
            replace(r, applied=a, end=e, staleness_ms=s) for r, (a, e, s) in zip(report.replicas, moved)))

    def replica(self, slot: int) -> tuple[int, int | None, int]:
        """(applied, end, staleness_ms) of the report's ``slot``-th replica (end None: not known yet)."""
        i = 3 * slot
        v = self.values
        end = v[i + 1]
        return v[i], None if end == UNKNOWN_END else end, v[i + 2]

    def to_bytes(self) -> bytes:
        values = self.values
        if sys.byteorder != "little":
            values = array("q", values)
            values.byteswap()
        return _POSITIONS_HEAD.pack(POSITIONS_VERSION, self.report_ms, self.observed_ms) + values.tobytes()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "NodePositions":
        """Decode; raises :class:`OversizedReport`, :class:`UnknownReportVersion`, or ValueError for
        bytes that are not positions."""
        size = len(raw)
        if size > MAX_REPORT_BYTES:
            raise OversizedReport(f"positions of {size} bytes are over the limit of {MAX_REPORT_BYTES}")
        if size < _POSITIONS_HEAD.size or size % 24:  # the head is one triple long
            raise ValueError(f"positions of {size} bytes are not a whole number of replicas")
        version, report_ms, observed_ms = _POSITIONS_HEAD.unpack_from(raw)
        if version != POSITIONS_VERSION:
            raise UnknownReportVersion(f"positions version {version} is unknown (this reader knows {POSITIONS_VERSION})")
        values = array("q", raw[_POSITIONS_HEAD.size:])
        if sys.byteorder != "little":
            values.byteswap()
        return cls(report_ms, observed_ms, values)


POSITIONS_VERSION = 1
UNKNOWN_END = -1  # an end offset not learnt yet, in positions' int64 triples (real ends are never negative)
_POSITIONS_HEAD = struct.Struct("<qqq")  # version, report_ms, observed_ms; then int64 triples

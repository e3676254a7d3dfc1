"""The metadata schema in Redis, and the value objects that cross role boundaries.

Redis holds only soft state: table specs, node heartbeats with per-replica lag, the
current assignment and the assignor lease. Losing Redis loses no data; every role keeps
working from what it last saw. All keys live under one namespace so that several stacks
(or tests) can share a Redis server.

The schema is made for clusters of a thousand nodes: what every node writes often is
small, and what readers poll is a version or a change log, never the whole cluster.

Keys (``ns`` is the namespace, ``freshroute`` by default):

- ``{ns}:tables``              hash  table name → TableSpec JSON (written by the pipeline)
- ``{ns}:tables:version``      str   changes with every write of the table specs
- ``{ns}:input``               hash  table name → InputLag JSON: where the pipeline is in the table's input
- ``{ns}:input:ends``          hash  input topic → InputEnds JSON: where it ends (written by the assignor lease holder)
                                     (written by the pipeline after every micro-batch it sees)
- ``{ns}:beats``               hash  node id → its latest heartbeat time (ms, the node's clock)
- ``{ns}:node:{id}``           str   NodeReport JSON, rewritten only when its shape changed (address,
                                     replicas, roles, states, warmth); every beat renews its TTL
- ``{ns}:reports``             zset  node id → sequence number of its latest report (what changed since)
- ``{ns}:positions:{id}``      str   NodePositions, packed: the report's replicas' positions as they move
                                     between reports (under writes, at every beat)
- ``{ns}:positions``           zset  node id → sequence number of its latest positions
- ``{ns}:reports:seq``         int   the sequence of both logs; starts at the server's clock in µs,
                                     so it only grows, even across a Redis that lost its state
- ``{ns}:assignment``          str   Assignment JSON (written only by the assignor lease holder)
- ``{ns}:assignment:version``  str   changes with every assignment written
- ``{ns}:placements``          hash  node id → Placement JSON, that node's part of the assignment
- ``{ns}:assignor``            str   "{node_id}:{generation}", the assignor lease (SET NX PX)
- ``{ns}:assignor:generation`` int   fencing generation, INCR'd by each new lease holder
- ``{ns}:rate:{principal}``    hash  a principal's read-rate bucket, shared by the routers (router/rate_limit.py)
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, Container, Iterable, Mapping, Sequence

import orjson

from freshroute.lag import ReplicaLag
from freshroute.progress import InputEnds, InputLag, InputMark, marks_from_json, marks_to_json, rejections_from_json, rejections_to_json
from freshroute.windows import WindowSpec

if TYPE_CHECKING:
    from freshroute.redis_location import RedisLocation


class Role(str, Enum):
    ACTIVE = "active"
    STANDBY = "standby"


class ReplicaState(str, Enum):
    RESTORING = "RESTORING"
    ACTIVE = "ACTIVE"
    STANDBY = "STANDBY"
    FAILED = "FAILED"  # its store cannot be written (e.g. the disk is full): never read; its report says why


# A standby per node on the largest clusters anyone runs from one assignor: more is a typo.
MAX_STANDBY_REPLICAS = 16


@dataclass(frozen=True)
class TableSpec:
    """A table the pipeline materializes and store nodes serve."""

    name: str
    topic: str
    partitions: int
    key_column: str
    value_schema: dict[str, str] = field(default_factory=dict)
    standby_replicas: int = 1
    default_max_lag: int | None = None
    default_max_staleness_ms: int | None = None
    window: WindowSpec | None = None  # a windowed table's windows; None: a plain keyed table
    input_topic: str | None = None  # the Kafka topic the table is computed from
    # How the topic holds keys and values (freshroute.formats); "topic": a compacted topic served as it is
    # (`freshroute table add`), not written by the pipeline.
    key_format: str = "string"
    value_format: str = "json"
    origin: str = "pipeline"
    pipeline_mode: str | None = None  # how the pipeline runs its query: "realtime" or "microbatch" (None: a topic's)
    query: str | None = None  # the pipeline's streaming query that computes it (None: a topic's)
    # A versioned table keeps every version of a key this long after it stopped being true (store_node/history.py);
    # 0: only the latest value.
    history_retention_ms: int = 0

    @property
    def versioned(self) -> bool:
        return self.history_retention_ms > 0

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "TableSpec":
        d = orjson.loads(raw)
        window = d.pop("window", None)
        # Fields a newer pipeline added are ignored, so a rolling upgrade keeps older readers working.
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known, window=WindowSpec.from_dict(window) if window else None)


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
    node's liveness is its latest beat, kept apart (see :meth:`MetadataStore.beats`).
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
    values: array

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


@dataclass(frozen=True)
class Assignment:
    """Who hosts what: for each (table, partition), node ids with the active first."""

    generation: int
    replicas: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)

    def active(self, table: str, partition: int) -> str | None:
        nodes = self.replicas.get((table, partition), ())
        return nodes[0] if nodes else None

    def hosted_by(self, node_id: str) -> dict[tuple[str, int], Role]:
        return self.placements().get(node_id, {})

    def placements(self, only: Container[str] | None = None) -> dict[str, dict[tuple[str, int], Role]]:
        """Each node's part (or only these nodes' parts): its replicas and their roles."""
        out: dict[str, dict[tuple[str, int], Role]] = {}
        for tp, nodes in self.replicas.items():
            for i, node_id in enumerate(nodes):
                if only is None or node_id in only:
                    out.setdefault(node_id, {})[tp] = Role.ACTIVE if i == 0 else Role.STANDBY
        return out

    def differing(self, other: "Assignment | None") -> list[tuple[str, int]]:
        """The partitions whose replicas (or their order) differ from ``other``'s."""
        theirs = other.replicas if other is not None else {}
        return [k for k in self.replicas.keys() | theirs.keys() if self.replicas.get(k) != theirs.get(k)]

    def to_json(self) -> bytes:
        return orjson.dumps({"generation": self.generation,
                             "replicas": [[t, p, list(n)] for (t, p), n in sorted(self.replicas.items())]})

    @classmethod
    def from_json(cls, raw: bytes | str) -> "Assignment":
        d = orjson.loads(raw)
        return cls(int(d["generation"]), {(t, int(p)): tuple(n) for t, p, n in d["replicas"]})


def placement_json(hosted: dict[tuple[str, int], Role]) -> bytes:
    """One node's part of an assignment, as the node reads it."""
    return orjson.dumps(sorted([t, p, r.value] for (t, p), r in hosted.items()))


def placement_from_json(raw: bytes | str) -> dict[tuple[str, int], Role]:
    return {(t, int(p)): Role(r) for t, p, r in orjson.loads(raw)}


@dataclass(frozen=True)
class Keys:
    """Redis key names under one namespace."""

    ns: str = "freshroute"

    @property
    def tables(self) -> str:
        return f"{self.ns}:tables"

    @property
    def tables_version(self) -> str:
        return f"{self.ns}:tables:version"

    @property
    def input_lag(self) -> str:
        return f"{self.ns}:input"

    @property
    def input_ends(self) -> str:
        return f"{self.ns}:input:ends"

    @property
    def input_marks(self) -> str:
        return f"{self.ns}:input:marks"

    @property
    def input_rejected(self) -> str:
        return f"{self.ns}:input:rejected"

    @property
    def beats(self) -> str:
        return f"{self.ns}:beats"

    def node(self, node_id: str) -> str:
        return f"{self.ns}:node:{node_id}"

    def node_positions(self, node_id: str) -> str:
        return f"{self.ns}:positions:{node_id}"

    @property
    def positions(self) -> str:
        return f"{self.ns}:positions"

    @property
    def reports(self) -> str:
        return f"{self.ns}:reports"

    @property
    def reports_seq(self) -> str:
        return f"{self.ns}:reports:seq"

    @property
    def assignment(self) -> str:
        return f"{self.ns}:assignment"

    @property
    def assignment_version(self) -> str:
        return f"{self.ns}:assignment:version"

    @property
    def placements(self) -> str:
        return f"{self.ns}:placements"

    @property
    def assignor(self) -> str:
        return f"{self.ns}:assignor"

    @property
    def assignor_generation(self) -> str:
        return f"{self.ns}:assignor:generation"


@dataclass(frozen=True)
class RoundRequest:
    """What one membership round sends: the beat (None: not this round), and the report when its
    shape changed or else the positions when they moved."""

    node_id: str
    beat_ms: int | None
    ttl_ms: int
    report: bytes | None
    positions: bytes | None = None


@dataclass(frozen=True)
class Round:
    """What one membership round learns in one round trip: the lease and the versions to follow."""

    report_held: bool  # False: Redis no longer holds this node's report (it lost its state); publish it again
    lease: str | None  # the assignor lease's value, "{node_id}:{generation}"
    tables_version: bytes | None
    assignment_version: bytes | None


UNREAD: Any = object()  # "not read yet", where None is a value read

# Numbers that never repeat, even after Redis lost its state, start from the server's clock in µs.
# A version differs from every earlier one: the clock, or one more than the last version if the
# clock went back.
_CLOCK = """
local function clock_us()
    local t = redis.call('TIME')
    return t[1] * 1000000 + t[2]
end
local function new_version(key)
    local v = clock_us()
    local prev = tonumber(redis.call('GET', key))
    if prev and v <= prev then v = prev + 1 end
    v = string.format('%d', v)
    redis.call('SET', key, v)
    return v
end
"""


class MetadataStore:
    """Synchronous access to the metadata schema (pipeline, store nodes, tools).

    The router reads the same keys with ``redis.asyncio`` through the same codecs.
    """

    # A beat renews the node's liveness and its report's TTL; with a report (or positions), it
    # also replaces the report (or the positions) and logs the change. Returns 0 when Redis has
    # lost the report.
    _BEAT = _CLOCK + """
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
    local function log_change(key, log, value)
        if redis.call('EXISTS', KEYS[4]) == 0 then
            redis.call('SET', KEYS[4], string.format('%d', clock_us()))
        end
        redis.call('SET', key, value, 'PX', ARGV[3])
        redis.call('ZADD', log, redis.call('INCR', KEYS[4]), ARGV[1])
    end
    if ARGV[4] ~= '' then
        log_change(KEYS[2], KEYS[3], ARGV[4])
        return 1
    end
    if ARGV[5] ~= '' then
        log_change(KEYS[5], KEYS[6], ARGV[5])
    end
    return redis.call('PEXPIRE', KEYS[2], ARGV[3])
    """

    # Write the assignment only while holding the lease of the given generation: a
    # deposed assignor that wakes up late can never overwrite its successor's work.
    # ARGV: lease value, assignment JSON, n, then n (node, placement) pairs to set, then nodes to drop.
    _FENCED_WRITE = _CLOCK + """
    if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
    redis.call('SET', KEYS[2], ARGV[2])
    local n = tonumber(ARGV[3])
    for i = 0, n - 1 do redis.call('HSET', KEYS[4], ARGV[4 + 2 * i], ARGV[5 + 2 * i]) end
    for i = 4 + 2 * n, #ARGV do redis.call('HDEL', KEYS[4], ARGV[i]) end
    return new_version(KEYS[3])
    """

    _REGISTER_TABLES = _CLOCK + """
    for i = 1, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
    new_version(KEYS[2])
    """

    _REMOVE_TABLE = _CLOCK + """
    if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then new_version(KEYS[2]) end
    """

    def __init__(self, client: Any, namespace: str = "freshroute") -> None:
        self.redis = client
        self.keys = Keys(namespace)
        self._beat = client.register_script(self._BEAT)
        self._fenced_write = client.register_script(self._FENCED_WRITE)
        self._register_tables = client.register_script(self._REGISTER_TABLES)
        self._remove_table = client.register_script(self._REMOVE_TABLE)

    @classmethod
    def from_url(cls, url: str, namespace: str = "freshroute", timeout_s: float = 1.0) -> "MetadataStore":
        from freshroute.redis_location import RedisLocation

        return cls.at(RedisLocation(url), namespace, timeout_s)

    @classmethod
    def at(cls, location: "RedisLocation", namespace: str = "freshroute", timeout_s: float = 1.0) -> "MetadataStore":
        return cls(location.client(timeout_s), namespace)

    # tables
    def register_tables(self, specs: Iterable[TableSpec]) -> None:
        args = [x for s in specs for x in (s.name, s.to_json())]
        if args:
            self._register_tables(keys=[self.keys.tables, self.keys.tables_version], args=args)

    def remove_table(self, name: str) -> None:
        """Stop serving a table: routers forget it and the assignor places it no more at their next round."""
        self._remove_table(keys=[self.keys.tables, self.keys.tables_version], args=[name])

    def tables(self) -> dict[str, TableSpec]:
        raw = self.redis.hgetall(self.keys.tables)
        return {text(k): TableSpec.from_json(v) for k, v in raw.items()}

    def publish_input_lag(self, table: str, lag: InputLag) -> None:
        self.redis.hset(self.keys.input_lag, table, lag.to_json())

    def input_lags(self) -> dict[str, InputLag]:
        return {text(k): InputLag.from_json(v) for k, v in self.redis.hgetall(self.keys.input_lag).items()}

    def publish_input_ends(self, ends: dict[str, InputEnds]) -> None:
        if ends:
            self.redis.hset(self.keys.input_ends, mapping={topic: e.to_json() for topic, e in ends.items()})

    def input_ends(self) -> dict[str, InputEnds]:
        return {text(k): InputEnds.from_json(v) for k, v in self.redis.hgetall(self.keys.input_ends).items()}

    def publish_input_marks(self, table: str, marks: Sequence[InputMark]) -> None:
        """A table's latest marks (:class:`freshroute.progress.InputMark`), oldest first."""
        self.redis.hset(self.keys.input_marks, table, marks_to_json(marks))

    def input_marks(self) -> dict[str, tuple[InputMark, ...]]:
        return {text(k): marks_from_json(v) for k, v in self.redis.hgetall(self.keys.input_marks).items()}

    def publish_rejections(self, topic: str, rejected: Mapping[int, Sequence[tuple[int, str]]]) -> None:
        """The latest input records of ``topic`` the pipeline rejected (partition → (offset, reason)), oldest first."""
        self.redis.hset(self.keys.input_rejected, topic, rejections_to_json(rejected))

    def rejections(self) -> dict[str, dict[int, dict[int, str]]]:
        return {text(k): rejections_from_json(v) for k, v in self.redis.hgetall(self.keys.input_rejected).items()}

    # nodes
    def _beat_args(self, node_id: str, beat_ms: int, ttl_ms: int, report: bytes | None,
                   positions: bytes | None = None) -> dict[str, list]:
        keys = self.keys
        return {"keys": [keys.beats, keys.node(node_id), keys.reports, keys.reports_seq,
                         keys.node_positions(node_id), keys.positions],
                "args": [node_id, beat_ms, ttl_ms, report or b"", positions or b""]}

    def publish_node(self, report: NodeReport, ttl_ms: int) -> None:
        """A heartbeat with the full report."""
        self._beat(**self._beat_args(report.node_id, report.heartbeat_ms, ttl_ms, report.to_json()))

    def rounds(self, requests: Sequence[RoundRequest]) -> list[Round]:
        """Membership rounds in one round trip (one node's, or many in the scale simulator): each a
        beat (when the request carries one, with the report when it changed), the lease, and the
        versions of the tables and the assignment."""
        pipe = self.redis.pipeline(transaction=False)
        for r in requests:
            if r.beat_ms is not None:
                self._beat(**self._beat_args(r.node_id, r.beat_ms, r.ttl_ms, r.report, r.positions), client=pipe)
            pipe.get(self.keys.assignor)
            pipe.mget([self.keys.tables_version, self.keys.assignment_version])
        out = iter(pipe.execute())
        found = []
        for r in requests:
            held = bool(next(out)) if r.beat_ms is not None else True
            lease, (tables_version, assignment_version) = next(out), next(out)
            found.append(Round(held, text(lease) if lease is not None else None, tables_version, assignment_version))
        return found

    def remove_node(self, node_id: str) -> None:
        """Leave the cluster (a node stopping)."""
        self.forget_nodes([node_id])

    def beats(self) -> dict[str, int]:
        """Every node's latest heartbeat time."""
        return {text(k): int(v) for k, v in self.redis.hgetall(self.keys.beats).items()}

    def nodes(self) -> dict[str, NodeReport]:
        """Every node's latest report, with the positions it published since (a full read, for
        tools and tests; roles read changes only)."""
        ids = sorted(self.beats())
        if not ids:
            return {}
        raws = self.redis.mget([self.keys.node(i) for i in ids] + [self.keys.node_positions(i) for i in ids])
        out = {}
        for i, raw, moved in zip(ids, raws, raws[len(ids):]):
            try:
                if raw is not None:
                    out[i] = NodeReport.from_json(raw)
            except (ValueError, KeyError, TypeError):
                continue  # a bad report is no node (the roles count and log them: see freshroute.heartbeats)
            try:
                if moved and i in out:
                    out[i] = NodePositions.from_bytes(moved).applied_to(out[i])
            except ValueError:
                pass  # bad positions: the report's own stand
        return out

    # assignment
    def assignment(self) -> Assignment | None:
        raw = self.redis.get(self.keys.assignment)
        return Assignment.from_json(raw) if raw else None

    def placement(self, node_id: str) -> dict[tuple[str, int], Role] | None:
        """This node's part of the assignment; None when there is no assignment at all."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.exists(self.keys.assignment)
        pipe.hget(self.keys.placements, node_id)
        exists, raw = pipe.execute()
        if not exists:
            return None
        return placement_from_json(raw) if raw else {}

    def try_acquire_assignor(self, node_id: str, lease_ms: int, current: Any = UNREAD) -> int | None:
        """Take the assignor lease if it is free; returns the new fencing generation, or None.

        ``current`` is the lease's value if the caller has just read it (saves a round trip)."""
        if current is UNREAD:
            raw = self.redis.get(self.keys.assignor)
            current = text(raw) if raw is not None else None
        if current is not None:
            holder, _, gen = current.rpartition(":")
            if holder == node_id:
                return self.renew_assignor(node_id, int(gen), lease_ms) and int(gen) or None
            return None
        generation = int(self.redis.incr(self.keys.assignor_generation))
        if self.redis.set(self.keys.assignor, f"{node_id}:{generation}", nx=True, px=lease_ms):
            return generation
        return None

    def renew_assignor(self, node_id: str, generation: int, lease_ms: int) -> bool:
        """Extend the lease only if this node still holds this generation."""
        script = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
        return bool(self.redis.eval(script, 1, self.keys.assignor, f"{node_id}:{generation}", lease_ms))

    def release_assignor(self, node_id: str, generation: int) -> None:
        script = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
        self.redis.eval(script, 1, self.keys.assignor, f"{node_id}:{generation}")

    def versions(self) -> tuple[bytes | None, bytes | None]:
        """(tables version, assignment version)."""
        tables, assignment = self.redis.mget([self.keys.tables_version, self.keys.assignment_version])
        return tables, assignment

    def write_assignment(self, assignment: Assignment, node_id: str, generation: int,
                         previous: Assignment | None = None) -> bytes | None:
        """Fenced write: succeeds only while ``node_id`` holds lease ``generation``; returns the new
        assignment version, or None when fenced off.

        Only the placements that differ from ``previous`` (the assignment in Redis) are written."""
        if previous is None:
            now = {n: placement_json(h) for n, h in assignment.placements().items()}
            # Drop whatever placements a lost assignment left behind.
            dropped = sorted(set(map(text, self.redis.hkeys(self.keys.placements))) - set(now))
        else:
            # The nodes of partitions whose replicas changed: a death touches a few dozen of a thousand.
            after, before = assignment.replicas, previous.replicas
            touched = {n for k in assignment.differing(previous) for n in (*after.get(k, ()), *before.get(k, ()))}
            now = {n: placement_json(h) for n, h in assignment.placements(touched).items()}
            dropped = sorted(touched - set(now))
        changed = [x for n, p in sorted(now.items()) for x in (n, p)]
        version = self._fenced_write(
            keys=[self.keys.assignor, self.keys.assignment, self.keys.assignment_version, self.keys.placements],
            args=[f"{node_id}:{generation}", assignment.to_json(), len(changed) // 2, *changed, *dropped])
        return version or None

    def poll(self, feed: Any) -> set[str]:
        """Bring ``feed`` (a :class:`freshroute.heartbeats.NodeFeed`) up to date; returns the nodes
        whose report changed or is gone."""
        return feed.poll(self.redis, self.keys)

    def forget_nodes(self, node_ids: Iterable[str]) -> None:
        """Remove nodes from the cluster: their beats and reports. The lease holder forgets those
        silent for longer than any report lives.

        Their reports go too: a node that was only stalled finds its report gone at its next beat
        and publishes it again, so readers learn of it anew."""
        ids = list(node_ids)
        if ids:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hdel(self.keys.beats, *ids)
            pipe.zrem(self.keys.reports, *ids)
            pipe.zrem(self.keys.positions, *ids)
            pipe.delete(*(self.keys.node(i) for i in ids), *(self.keys.node_positions(i) for i in ids))
            pipe.execute()


def text(v: bytes | str) -> str:
    """A Redis reply as text (clients may or may not decode replies)."""
    return v.decode() if isinstance(v, bytes) else v

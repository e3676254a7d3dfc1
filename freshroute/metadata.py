"""The metadata schema in Redis, and the value objects that cross role boundaries.

Redis holds only soft state: table specs, node heartbeats with per-replica lag, the
current assignment and the assignor lease. Losing Redis loses no data; every role keeps
working from what it last saw. All keys live under one namespace so that several stacks
(or tests) can share a Redis server.

Keys (``ns`` is the namespace, ``freshroute`` by default):

- ``{ns}:tables``            hash  table name → TableSpec JSON (written by the pipeline)
- ``{ns}:nodes``             set   node ids that ever registered
- ``{ns}:node:{id}``         str   NodeReport JSON, rewritten by every heartbeat, with a TTL
- ``{ns}:assignment``        str   Assignment JSON (written only by the assignor lease holder)
- ``{ns}:assignor``          str   "{node_id}:{generation}", the assignor lease (SET NX PX)
- ``{ns}:assignor:generation`` int fencing generation, INCR'd by each new lease holder
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Iterable

import orjson


class Role(str, Enum):
    ACTIVE = "active"
    STANDBY = "standby"


class ReplicaState(str, Enum):
    RESTORING = "RESTORING"
    ACTIVE = "ACTIVE"
    STANDBY = "STANDBY"


def now_ms() -> int:
    return int(time.time() * 1000)


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

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "TableSpec":
        return cls(**orjson.loads(raw))


@dataclass(frozen=True)
class ReplicaLag:
    """Applied offset (next offset to apply) against the partition's end offset; lag never negative."""

    applied: int
    end: int
    staleness_ms: int = 0

    @property
    def offsets(self) -> int:
        return max(0, self.end - self.applied)


@dataclass(frozen=True)
class ReplicaReport:
    """One hosted replica as its node reports it."""

    table: str
    partition: int
    role: Role
    state: ReplicaState
    applied: int
    end: int
    staleness_ms: int

    @property
    def lag(self) -> ReplicaLag:
        return ReplicaLag(self.applied, self.end, self.staleness_ms)

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "partition": self.partition, "role": self.role.value,
                "state": self.state.value, "applied": self.applied, "end": self.end,
                "staleness_ms": self.staleness_ms}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReplicaReport":
        return cls(d["table"], int(d["partition"]), Role(d["role"]), ReplicaState(d["state"]),
                   int(d["applied"]), int(d["end"]), int(d["staleness_ms"]))


@dataclass(frozen=True)
class NodeReport:
    """A store node's heartbeat: who it is, where it serves, and every replica's lag."""

    node_id: str
    address: str
    heartbeat_ms: int
    replicas: tuple[ReplicaReport, ...] = ()
    rack: str | None = None
    draining: bool = False
    read_address: str | None = None  # the node's read port, if it offers one (else reads use gRPC)

    def to_json(self) -> bytes:
        return orjson.dumps({"node_id": self.node_id, "address": self.address, "rack": self.rack,
                             "heartbeat_ms": self.heartbeat_ms, "draining": self.draining,
                             "read_address": self.read_address,
                             "replicas": [r.to_dict() for r in self.replicas]})

    @classmethod
    def from_json(cls, raw: bytes | str) -> "NodeReport":
        d = orjson.loads(raw)
        return cls(d["node_id"], d["address"], int(d["heartbeat_ms"]),
                   tuple(ReplicaReport.from_dict(r) for r in d.get("replicas", ())),
                   d.get("rack"), bool(d.get("draining", False)), d.get("read_address"))


@dataclass(frozen=True)
class Assignment:
    """Who hosts what: for each (table, partition), node ids with the active first."""

    generation: int
    replicas: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)

    def active(self, table: str, partition: int) -> str | None:
        nodes = self.replicas.get((table, partition), ())
        return nodes[0] if nodes else None

    def hosted_by(self, node_id: str) -> dict[tuple[str, int], Role]:
        out: dict[tuple[str, int], Role] = {}
        for tp, nodes in self.replicas.items():
            if node_id in nodes:
                out[tp] = Role.ACTIVE if nodes[0] == node_id else Role.STANDBY
        return out

    def to_json(self) -> bytes:
        return orjson.dumps({"generation": self.generation,
                             "replicas": [[t, p, list(n)] for (t, p), n in sorted(self.replicas.items())]})

    @classmethod
    def from_json(cls, raw: bytes | str) -> "Assignment":
        d = orjson.loads(raw)
        return cls(int(d["generation"]), {(t, int(p)): tuple(n) for t, p, n in d["replicas"]})


@dataclass(frozen=True)
class Keys:
    """Redis key names under one namespace."""

    ns: str = "freshroute"

    @property
    def tables(self) -> str:
        return f"{self.ns}:tables"

    @property
    def nodes(self) -> str:
        return f"{self.ns}:nodes"

    def node(self, node_id: str) -> str:
        return f"{self.ns}:node:{node_id}"

    @property
    def assignment(self) -> str:
        return f"{self.ns}:assignment"

    @property
    def assignor(self) -> str:
        return f"{self.ns}:assignor"

    @property
    def assignor_generation(self) -> str:
        return f"{self.ns}:assignor:generation"


class MetadataStore:
    """Synchronous access to the metadata schema (pipeline, store nodes, tools).

    The router reads the same keys with ``redis.asyncio`` through the same codecs.
    """

    # Write the assignment only while holding the lease of the given generation: a
    # deposed assignor that wakes up late can never overwrite its successor's work.
    _FENCED_WRITE = """
    if redis.call('GET', KEYS[1]) == ARGV[1] then
        redis.call('SET', KEYS[2], ARGV[2])
        return 1
    end
    return 0
    """

    def __init__(self, client: Any, namespace: str = "freshroute") -> None:
        self.redis = client
        self.keys = Keys(namespace)
        self._fenced_write = client.register_script(self._FENCED_WRITE)

    @classmethod
    def from_url(cls, url: str, namespace: str = "freshroute", timeout_s: float = 1.0) -> "MetadataStore":
        import redis

        return cls(redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s), namespace)

    # tables
    def register_tables(self, specs: Iterable[TableSpec]) -> None:
        mapping = {s.name: s.to_json() for s in specs}
        if mapping:
            self.redis.hset(self.keys.tables, mapping=mapping)

    def tables(self) -> dict[str, TableSpec]:
        raw = self.redis.hgetall(self.keys.tables)
        return {k.decode() if isinstance(k, bytes) else k: TableSpec.from_json(v) for k, v in raw.items()}

    # nodes
    def publish_node(self, report: NodeReport, ttl_ms: int) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.sadd(self.keys.nodes, report.node_id)
        pipe.set(self.keys.node(report.node_id), report.to_json(), px=ttl_ms)
        pipe.execute()

    def remove_node(self, node_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.srem(self.keys.nodes, node_id)
        pipe.delete(self.keys.node(node_id))
        pipe.execute()

    def nodes(self) -> dict[str, NodeReport]:
        ids = sorted(i.decode() if isinstance(i, bytes) else i for i in self.redis.smembers(self.keys.nodes))
        if not ids:
            return {}
        raws = self.redis.mget([self.keys.node(i) for i in ids])
        return {i: NodeReport.from_json(r) for i, r in zip(ids, raws) if r is not None}

    # assignment
    def assignment(self) -> Assignment | None:
        raw = self.redis.get(self.keys.assignment)
        return Assignment.from_json(raw) if raw else None

    def try_acquire_assignor(self, node_id: str, lease_ms: int) -> int | None:
        """Take the assignor lease if it is free; returns the new fencing generation, or None."""
        current = self.redis.get(self.keys.assignor)
        if current is not None:
            holder, _, gen = (current.decode() if isinstance(current, bytes) else current).rpartition(":")
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

    def write_assignment(self, assignment: Assignment, node_id: str, generation: int) -> bool:
        """Fenced write: succeeds only while ``node_id`` holds lease ``generation``."""
        return bool(self._fenced_write(keys=[self.keys.assignor, self.keys.assignment],
                                       args=[f"{node_id}:{generation}", assignment.to_json()]))

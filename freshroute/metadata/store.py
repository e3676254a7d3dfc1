"""The metadata store's client: synchronous reads and writes of the schema in Redis (freshroute.metadata.schema)
for the pipeline, the store nodes and the tools — table specs, the pipeline's progress, heartbeats, the assignor
lease and the fenced assignment.

Redis holds only soft state; losing it loses no data, and every role keeps working from what it last saw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from freshroute.metadata.assignment import Assignment, placement_from_json, placement_json
from freshroute.metadata.progress import (InputEnds, InputLag, InputMark, marks_from_json, marks_to_json,
                                          rejections_from_json, rejections_to_json)
from freshroute.metadata.reports import NodePositions, NodeReport
from freshroute.metadata.roles import Role
from freshroute.metadata.rounds import UNREAD, Round, RoundRequest
from freshroute.metadata.schema import Keys
from freshroute.metadata.tables import TableSpec

if TYPE_CHECKING:
    from freshroute.heartbeats import NodeFeed
    from freshroute.redis_location import RedisLocation


# Numbers that never repeat, even after Redis lost its state, start from the server's clock in µs (for every script
# that moves a version).
# A version differs from every earlier one: the clock, or one more than the last version if the
# clock went back.
CLOCK_LUA = """
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
    _BEAT = CLOCK_LUA + """
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
    _FENCED_WRITE = CLOCK_LUA + """
    if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
    redis.call('SET', KEYS[2], ARGV[2])
    local n = tonumber(ARGV[3])
    for i = 0, n - 1 do redis.call('HSET', KEYS[4], ARGV[4 + 2 * i], ARGV[5 + 2 * i]) end
    for i = 4 + 2 * n, #ARGV do redis.call('HDEL', KEYS[4], ARGV[i]) end
    return new_version(KEYS[3])
    """

    _REGISTER_TABLES = CLOCK_LUA + """
    for i = 1, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
    new_version(KEYS[2])
    """

    _REMOVE_TABLE = CLOCK_LUA + """
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
        """A table's latest marks (:class:`freshroute.metadata.progress.InputMark`), oldest first."""
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
                   positions: bytes | None = None) -> dict[str, list[str | int | bytes]]:
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

    def poll(self, feed: NodeFeed) -> set[str]:
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

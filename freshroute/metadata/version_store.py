"""Tables' version records in Redis (freshroute.metadata.table_versions): each change one compare-and-set write of
the table's record that also moves ``tables:version``, so every router and client reads it at its next refresh of
the tables, and a change made from a record someone else changed meanwhile is made again from theirs.

One version builds at a time in a cluster: a marker names it from its start until it serves or fails, and a second
start is refused naming it.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from freshroute.errors import FreshrouteError, TableDeployInProgress, TableVersionNotFound
from freshroute.metadata.schema import Keys
from freshroute.metadata.store import CLOCK_LUA, text
from freshroute.metadata.table_versions import TableVersion, VersionedTable, VersionState, physical_name

# Tries of a change whose record moved under it; each retry follows another writer's completed change.
_CHANGE_TRIES = 8

# KEYS: the records, tables:version, the building marker, the table specs.
# ARGV: table, the record the change was made from ('' for none), the new record, what becomes of the marker
# ('' nothing, 'set' it to ARGV[5], 'clear' it if it names ARGV[5]), ARGV[5] a physical name, and a physical name
# whose spec must be registered ('' none).
# Returns {1} written, {0} the record moved, {2, marker} another version builds, {3} the spec is not registered.
_WRITE = CLOCK_LUA + """
local current = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if current ~= ARGV[2] then return {0} end
if ARGV[4] == 'set' then
    local building = redis.call('GET', KEYS[3])
    if building then return {2, building} end
end
if ARGV[6] ~= '' and redis.call('HEXISTS', KEYS[4], ARGV[6]) == 0 then return {3} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] == 'set' then
    redis.call('SET', KEYS[3], ARGV[5])
elseif ARGV[4] == 'clear' and redis.call('GET', KEYS[3]) == ARGV[5] then
    redis.call('DEL', KEYS[3])
end
new_version(KEYS[2])
return {1}
"""


class _Change(NamedTuple):
    """What one change writes: the new record, what becomes of the building marker ("", "set" or "clear" for the
    version of ``physical``), and the physical table whose spec must be registered first ("": none)."""

    record: VersionedTable
    marker: str = ""
    physical: str = ""
    needs_spec: str = ""


class TableVersionStore:
    """The tables' version records: read, and changed by the transitions of
    :class:`~freshroute.metadata.table_versions.VersionedTable`."""

    def __init__(self, client: Any, namespace: str = "freshroute") -> None:
        self.redis = client
        self.keys = Keys(namespace)
        self._write = client.register_script(_WRITE)

    def record(self, table: str) -> VersionedTable | None:
        return self._read(table)[1]

    def _read(self, table: str) -> tuple[bytes | None, VersionedTable | None]:
        """The table's record as Redis holds it, and decoded."""
        raw = self.redis.hget(self.keys.table_versions, table)
        return raw, None if raw is None else VersionedTable.from_json(raw)

    def records(self) -> dict[str, VersionedTable]:
        return {text(k): VersionedTable.from_json(v) for k, v in self.redis.hgetall(self.keys.table_versions).items()}

    def building(self) -> str | None:
        """The physical name of the version being built in the cluster, if one is."""
        raw = self.redis.get(self.keys.table_versions_building)
        return None if raw is None else text(raw)

    def adopt(self, table: str, fingerprint: str, now_ms: int, definition: str | None = None) -> VersionedTable:
        """The table's record, made for a table that has none (one served version of this definition)."""
        return self._change(table, lambda r: _Change(r if r is not None else
                                                     VersionedTable.first(table, fingerprint, now_ms, definition)))

    def restore(self, record: VersionedTable) -> VersionedTable:
        """A record Redis lost, as the pipeline kept it (its version building marked again); kept as it is where
        the table has one."""
        building = record.of_state(VersionState.BUILDING)

        def back(r: VersionedTable | None) -> _Change:
            if r is not None or building is None:
                return _Change(r if r is not None else record)
            return _Change(record, "set", record.physical(building.version))

        return self._change(record.name, back)

    def begin(self, table: str, fingerprint: str, now_ms: int, definition: str | None = None) -> TableVersion:
        """Start a new version of ``table`` computing the definition of ``fingerprint``; refused while another
        version builds anywhere in the cluster (TABLE_DEPLOY_IN_PROGRESS naming it)."""
        def start(r: VersionedTable | None) -> _Change:
            if r is None:
                raise TableVersionNotFound(f"table {table!r} has no version record: it is not served yet",
                                           table=table)
            record, new = r.begun(fingerprint, now_ms, definition)
            return _Change(record, "set", record.physical(new.version))

        record = self._change(table, start)
        return record.versions[max(record.versions)]  # a new version takes the next number

    def switch(self, table: str, to: int, now_ms: int, retain_ms: int) -> VersionedTable:
        """Serve version ``to`` of ``table``: the one write every read of the table follows (once its spec is
        registered, so that its replicas are placed)."""
        return self._change(table, lambda r: _Change(self._existing(table, r).switched(to, now_ms, retain_ms),
                                                     "clear", physical_name(table, to), physical_name(table, to)))

    def rollback(self, table: str, now_ms: int, retain_ms: int) -> VersionedTable:
        """Serve the previous version of ``table`` again."""
        def back(r: VersionedTable | None) -> _Change:
            record = self._existing(table, r).rolled_back(now_ms, retain_ms)
            return _Change(record, needs_spec=record.physical())

        return self._change(table, back)

    def recompute(self, table: str, fingerprint: str, definition: str | None = None) -> VersionedTable:
        """The served version of ``table`` is computed again from the input by the definition of ``fingerprint``."""
        return self._change(table, lambda r: _Change(self._existing(table, r).recomputed(fingerprint, definition)))

    def propose(self, table: str, fingerprint: str) -> VersionedTable:
        """The tables file the pipeline started with defines ``table`` as ``fingerprint`` (no write if it did)."""
        return self._change(table, lambda r: _Change(self._existing(table, r).proposing(fingerprint)))

    def fail(self, table: str, version: int, reason: str) -> VersionedTable:
        """Version ``version`` could not be built: ``reason`` says why, and the next may start."""
        return self._change(table, lambda r: _Change(self._existing(table, r).failed(version, reason), "clear",
                                                     physical_name(table, version)))

    def retire(self, table: str, version: int) -> VersionedTable:
        """Version ``version`` is gone: its query stopped, its changelog and its replicas' data deleted."""
        return self._change(table, lambda r: _Change(self._existing(table, r).retired(version), "clear",
                                                     physical_name(table, version)))

    @staticmethod
    def _existing(table: str, r: VersionedTable | None) -> VersionedTable:
        if r is None:
            raise TableVersionNotFound(f"table {table!r} has no version record", table=table)
        return r

    def _change(self, table: str, make: Callable[[VersionedTable | None], _Change]) -> VersionedTable:
        keys = [self.keys.table_versions, self.keys.tables_version, self.keys.table_versions_building,
                self.keys.tables]
        for _ in range(_CHANGE_TRIES):
            raw, current = self._read(table)
            change = make(current)
            if current is not None and change.record == current:
                return current  # nothing to write
            done = self._write(keys=keys, args=[table, raw or b"", change.record.to_json(), change.marker,
                                                change.physical, change.needs_spec])
            if done[0] == 1:
                return change.record
            if done[0] == 2:
                raise TableDeployInProgress(f"version {text(done[1])} is still building: one table version builds "
                                            f"at a time", building=text(done[1]))
            if done[0] == 3:
                raise TableVersionNotFound(f"{change.needs_spec} has no table spec registered yet: its replicas "
                                           f"are not placed", table=table)
        raise FreshrouteError(f"the version record of table {table!r} kept changing under {_CHANGE_TRIES} tries",
                              table=table)


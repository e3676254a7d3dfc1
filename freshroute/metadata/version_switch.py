"""A table's switch to another version (freshroute.metadata.table_versions): whether the version has caught up — its
changelog within ``switch_lag`` records of its input, and every partition with an active replica within ``switch_lag``
offsets of its changelog's end — and the one metadata write every read follows. ``freshroute table switch`` checks
it unless forced; the pipeline waits for it before it switches by itself.

Readiness is read from the metadata store as every router reads it: the pipeline's progress in the version's input,
where the input ends, and the store nodes' reports of their replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

from freshroute.errors import TableVersionNotFound, TableVersionNotReady
# Records behind its input, and offsets behind its changelog, a version may switch at (re-exported here, its home of old)
from freshroute.metadata.catch_up import DEFAULT_SWITCH_LAG as DEFAULT_SWITCH_LAG
from freshroute.metadata.progress import input_lag_at
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.table_versions import VersionedTable, VersionState
from freshroute.metadata.tables import TableSpec
from freshroute.metadata.version_store import TableVersionStore


@dataclass(frozen=True)
class Readiness:
    """How far a version is from being servable."""

    physical: str
    input_lag: tuple[int, int] | None  # (records, ms) behind its input; None: the pipeline has said nothing of it
    behind: tuple[int, ...]  # partitions without an active replica known to be caught up with the changelog

    def refusal(self, switch_lag: int) -> str | None:
        """Why it may not be served yet, or None."""
        if self.input_lag is None:
            return f"{self.physical}: the pipeline has published no progress of it yet"
        records, ms = self.input_lag
        if records > switch_lag:
            return f"{self.physical} is {records} input records ({ms} ms) behind its input, switch_lag is {switch_lag}"
        if self.behind:
            shown = ", ".join(map(str, self.behind[:8])) + (", …" if len(self.behind) > 8 else "")
            return (f"{self.physical}: partitions {shown} have no active replica within {switch_lag} offsets of "
                    f"the changelog's end yet")
        return None


def readiness(store: MetadataStore, spec: TableSpec, now_ms: int, switch_lag: int) -> Readiness:
    """Where version table ``spec`` stands, read from ``store`` now."""
    lag = store.input_lags().get(spec.name)
    ends = store.input_ends().get(spec.input_topic) if spec.input_topic else None
    caught_up = {r.partition for report in store.nodes().values() for r in report.replicas
                 if r.table == spec.name and r.role is Role.ACTIVE and r.state is not ReplicaState.FAILED
                 and r.within(switch_lag)}
    return Readiness(spec.name, None if lag is None else input_lag_at(lag, ends, now_ms),
                     tuple(p for p in range(spec.partitions) if p not in caught_up))


def check_ready(store: MetadataStore, spec: TableSpec, now_ms: int, switch_lag: int) -> None:
    """Refuse (TABLE_VERSION_NOT_READY, naming its input lag) a version that has not caught up."""
    r = readiness(store, spec, now_ms, switch_lag)
    why = r.refusal(switch_lag)
    if why is not None:
        raise TableVersionNotReady(f"not switched: {why} (--force switches all the same)", table=spec.name,
                                   input_lag=None if r.input_lag is None else {"records": r.input_lag[0],
                                                                               "ms": r.input_lag[1]},
                                   partitions_behind=list(r.behind))


def switch(store: MetadataStore, versions: TableVersionStore, table: str, version: int | None, now_ms: int,
           switch_lag: int, retain_ms: int, force: bool = False) -> VersionedTable:
    """Serve version ``version`` of ``table`` (default: the one building) once it has caught up (``force``: at once);
    the one served until now becomes previous, kept ``retain_ms`` for a rollback."""
    record = versions.record(table)
    if record is None:
        raise TableVersionNotFound(f"table {table!r} has no version record: it has one version", table=table)
    if version is None:
        building = record.of_state(VersionState.BUILDING)
        if building is None:
            raise TableVersionNotFound(f"table {table!r} has no version building to switch to (it serves version "
                                       f"{record.serving}); name one with --version", table=table)
        version = building.version
    record.readable(version)
    spec = store.tables().get(record.physical(version))
    if spec is None:
        raise TableVersionNotFound(f"version {version} of table {table!r} has no table spec registered yet: its "
                                   f"replicas are not placed", table=table, table_version=version)
    if not force and version != record.serving:
        check_ready(store, spec, now_ms, switch_lag)
    return versions.switch(table, version, now_ms, retain_ms)

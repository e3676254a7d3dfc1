"""Which versions of each table a pipeline runs, and by which definition (freshroute.metadata.table_versions).

The served version goes on computing the definition it was built with — its tables file is kept beside the
checkpoints (:mod:`pipeline.definitions`) — so its rows never mix two definitions. A version building, or kept for a
rollback, computes its own. A table the tables file now defines otherwise gets a new version, begun beside the one
served: a table of its own (``<name>-vN``) in a query of its own, computed from the input's beginning as the broker
holds it. Where the served version cannot go on by its own definition — none kept, a source the tables file has
since changed, or a release that computes tables otherwise (``pipeline.fingerprint.QUERY_LAYOUTS``) — it is *held*:
served as it stands, its input lag growing, no query computing it, until the version built beside it by the new
definition is switched to. Only a served version whose query has nothing to resume from is computed by the new one
in place. A new version's input must go back to its beginning on the broker (:mod:`pipeline.input_held`), unless its
table says to compute it from what the broker holds.

A retired version whose query computes other tables too (a Real-time query of a source's tables, or ``query=`` in
the tables file) and whose checkpoint holds its state is a *ghost*: computed by the definition it was built with, so
that the query's plan and state stay those its checkpoint holds, but written nowhere — no changelog, no spec.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from freshroute.errors import FreshrouteError
from freshroute.metadata.table_versions import LIVE, TableVersion, VersionedTable, VersionState, physical_name
from pipeline.fingerprint import fingerprint
from pipeline.logs import first_line
from pipeline.tables import Table, TablesDefinition

log = logging.getLogger("pipeline")

@dataclass(frozen=True)
class PlannedVersion:
    """A version the pipeline runs: which table and number, and what it is doing."""

    table: str
    version: int
    state: VersionState

    @property
    def physical(self) -> str:
        return physical_name(self.table, self.version)


@dataclass(frozen=True)
class VersionPlan:
    """The tables a pipeline runs, by the names they are built under, and what each is a version of."""

    definition: TablesDefinition  # its tables by physical name, each with the definition it computes
    versions: dict[str, PlannedVersion] = field(default_factory=dict)  # physical name → its version
    fingerprints: dict[str, str] = field(default_factory=dict)  # table → the fingerprint its served version runs
    held: dict[str, PlannedVersion] = field(default_factory=dict)  # physical name → a served version no query runs
    proposed: dict[str, str] = field(default_factory=dict)  # table → its fingerprint as the tables file defines it
    refused: dict[str, str] = field(default_factory=dict)  # table → why the new definition it was given did not begin
    begun: dict[str, int] = field(default_factory=dict)  # table → the version this plan began of it

    @property
    def beside(self) -> frozenset[str]:
        """The physical tables built or kept beside the served ones: they write no rejected records, and a failure
        of theirs fails their version, not the pipeline."""
        return frozenset(p for p, v in self.versions.items() if v.state is not VersionState.SERVING)

    @property
    def ghosts(self) -> frozenset[str]:
        """The retired versions computed only so that the query they share keeps its plan and state: written
        nowhere."""
        return frozenset(p for p, v in self.versions.items() if v.state is VersionState.RETIRED)


class Planner:
    """Plans the versions a pipeline runs from its tables file, the tables' version records and the definitions kept.

    ``mode``: a table's pipeline mode as its fingerprint counts it; ``resumes``: whether the query of a physical table
    has batches to resume from (one without is computed afresh, in place); ``kept``: the tables file kept under a
    digest; ``begin``/``fail``: the version store's, for a new version (of a fingerprint, defined in the tables file
    of a digest, None: the pipeline's) and for one that cannot run; ``expired``: why a table's input can no longer be
    read from its beginning (None: it can; :mod:`pipeline.input_held`); ``shared``: the checkpoint of the query of a
    physical table when it records that table among others and has state to resume (None: it does not), where a
    retired version goes on as a ghost.
    """

    def __init__(self, mode: Callable[[Table], str], resumes: Callable[[str], bool],
                 kept: Callable[[str], TablesDefinition], begin: Callable[[str, str, str | None], TableVersion],
                 fail: Callable[[str, int, str], Any], expired: Callable[[Table], str | None] = lambda t: None,
                 shared: Callable[[str], Path | None] = lambda physical: None) -> None:
        self.mode = mode
        self.resumes = resumes
        self.kept = kept
        self.begin = begin
        self.fail = fail
        self.expired = expired
        self.shared = shared
        self._refused: dict[str, str] = {}  # of the plan being made: why a new definition did not begin
        self._begun_now: dict[str, int] = {}  # of the plan being made: the versions it began

    def plan(self, definition: TablesDefinition, records: Mapping[str, VersionedTable],
             deployed: Mapping[str, tuple[Table, str]] | None = None) -> VersionPlan:
        """``deployed``: tables given a new definition by ``freshroute table deploy`` (each with the digest of the
        tables file it came in), which it proposes in the place of the tables file's."""
        tables: dict[str, Table] = {}
        versions: dict[str, PlannedVersion] = {}
        fingerprints: dict[str, str] = {}
        held: dict[str, PlannedVersion] = {}
        proposed: dict[str, str] = {}
        self._refused, self._begun_now = {}, {}
        for name, t in definition.tables.items():
            fp = proposed[name] = fingerprint(t, definition.sources[t.source], self.mode(t))
            record = records.get(name)
            # A tables file proposes a new version only once it defines the table otherwise than it did.
            proposing, digest = record is None or record.proposal() != fp, None
            if deployed and name in deployed:
                t, digest = deployed[name]
                fp, proposing = fingerprint(t, definition.sources[t.source], self.mode(t)), True
            runs = self._versions_of(definition, t, fp, record, proposing, digest)
            for v, table in runs.items():
                physical = physical_name(name, v.version)
                if table is None:
                    held[physical] = v
                    continue
                tables[physical] = table if v.version == 1 else replace(table, name=physical, query=physical)
                versions[physical] = v
            served = next(v for v in runs if v.state is VersionState.SERVING)
            # What the served version computes: this definition, or the one it was built with.
            fingerprints[name] = fp if record is None or runs[served] is t \
                else record.versions[served.version].fingerprint
        return VersionPlan(replace(definition, tables=tables), versions, fingerprints, held, proposed, self._refused,
                           self._begun_now)

    def _versions_of(self, definition: TablesDefinition, t: Table, fp: str, record: VersionedTable | None,
                     proposing: bool, digest: str | None) -> dict[PlannedVersion, Table | None]:
        """The versions of table ``t`` (of fingerprint ``fp``, defined in the tables file of ``digest``) to run, each
        with the table it computes (None: the served version, held as it stands); ``proposing``: whether ``t`` is
        to be built if no version computes it."""
        name = t.name
        if record is None:
            return {PlannedVersion(name, 1, VersionState.SERVING): t}
        live = [v for v in record.listed() if v.state in LIVE]
        ours = next((v for v in live if v.fingerprint == fp), None)
        served = record.versions[record.serving]
        if ours is None and proposing and not self.resumes(record.physical()):
            ours = served  # computed afresh from the input: by the new definition, in place
        runs: dict[PlannedVersion, Table | None] = {}
        held = False
        for v in live:
            table: Table | str = t if v is ours else self._kept(definition, name, v)
            if isinstance(table, str) and v is served:
                # Its query's state is of another definition: resumed by this one, its rows would mix the two.
                log.warning("table %s: version %d cannot go on by the definition it was built with (%s): it is held, "
                            "served as it stands with its input lag growing, until the version of the new definition "
                            "is switched to", name, v.version, table)
                runs[PlannedVersion(name, v.version, v.state)] = None
                held = True
                continue
            if isinstance(table, str):
                record_failure(self.fail, name, v.version, f"its definition cannot be run again: {table}")
                continue
            runs[PlannedVersion(name, v.version, v.state)] = table
        for v in record.listed():
            if v.state is VersionState.RETIRED and (checkpoint := self.shared(physical_name(name, v.version))):
                ghost = self._ghost(definition, name, v, checkpoint)
                if ghost is not None:
                    runs[PlannedVersion(name, v.version, v.state)] = ghost
        if ours is None and not proposing:
            log.info("table %s: the tables file defines it as when the pipeline last started (fingerprint %s), which "
                     "no version computes now: not built again; version %d is served (change the table in the tables "
                     "file, or `freshroute table deploy` it, to build a new version)", name, fp, record.serving)
        elif ours is None:
            begun = self._begun(t, fp, record, held, digest)
            if begun is not None:
                self._begun_now[name] = begun.version
                runs[PlannedVersion(name, begun.version, VersionState.BUILDING)] = t
        return runs

    def _ghost(self, definition: TablesDefinition, name: str, v: TableVersion, checkpoint: Path) -> Table | None:
        """Retired version ``v`` of ``name`` as its shared query (of ``checkpoint``) computed it, or None (said) when
        its definition cannot be run again: that query then cannot resume."""
        table = self._kept(definition, name, v)
        if isinstance(table, str):
            log.error("table %s: version %d is retired, but the checkpoint %s of the query it shares still holds its "
                      "state, and its definition cannot be run again (%s): that query cannot resume; delete %s to "
                      "recompute its other tables from the input", name, v.version, checkpoint, table, checkpoint)
            return None
        log.info("table %s: version %d is retired, computed in the query it shares (checkpoint %s) by its own "
                 "definition so that the query's state stays as it is, and written nowhere", name, v.version,
                 checkpoint)
        return table

    def _kept(self, definition: TablesDefinition, name: str, v: TableVersion) -> Table | str:
        """Version ``v`` of table ``name`` as the tables file it was built from defines it, or why it cannot run."""
        if v.definition is None:
            return "no tables file of it is kept"
        try:
            kept = self.kept(v.definition)
        except FreshrouteError as e:
            return e.message
        t = kept.tables.get(name)
        if t is None:
            return f"the tables file kept of it ({v.definition}) no longer declares it"
        source = kept.sources[t.source]
        if definition.sources.get(t.source) != source:
            return f"its source {t.source!r} is declared otherwise in the tables file now"
        if fingerprint(t, source, self.mode(t)) != v.fingerprint:
            return f"the tables file kept of it ({v.definition}) computes something else under this release"
        return t

    def _begun(self, t: Table, fp: str, record: VersionedTable, held: bool, digest: str | None
               ) -> TableVersion | None:
        """A new version of table ``t`` computing ``fp``, unless one of it failed already, none can begin now, or its
        input no longer goes back to its beginning (``held``: the served version is held meanwhile)."""
        name = t.name
        how = "held as it stands" if held else "by its own definition"
        failed = next((v for v in record.listed() if v.state is VersionState.FAILED and v.fingerprint == fp), None)
        if failed is not None:
            self._refused[name] = f"this definition is that of version {failed.version}, which failed: {failed.reason}"
            log.warning("table %s: its new definition is that of version %d, which failed (%s): not built again; "
                        "version %d is served %s", name, failed.version, failed.reason, record.serving, how)
            return None
        try:
            begun = self.begin(name, fp, digest)
        except Exception as e:  # another version building, or Redis away: the served one goes on as it is
            self._refused[name] = first_line(str(e))
            log.warning("table %s: its new definition is not built now (%s): version %d goes on being served %s; "
                        "start the pipeline again to build it", name, first_line(str(e)), record.serving, how)
            return None
        expired = self.expired(t) if t.versions_from == "beginning" else None
        if expired is not None:  # refused before it starts: its record says why, and the served version goes on
            self._refused[name] = f"version {begun.version} failed: {expired}"
            record_failure(self.fail, name, begun.version, expired)
            return None
        log.info("table %s: its definition changed (fingerprint %s): version %d is built beside version %d as "
                 "table %s, from the input's beginning as the broker holds it", name, fp, begun.version,
                 record.serving, physical_name(name, begun.version))
        return begun


def record_failure(fail: Callable[[str, int, str], Any], table: str, version: int, reason: str) -> None:
    """Say that version ``version`` of ``table`` failed, and record it with ``fail`` (the version store's) where
    Redis can be reached; where not, it is said again at the next start, which fails it again."""
    log.error("table %s: version %d failed, the version served goes on: %s", table, version, reason)
    try:
        fail(table, version, reason)
    except Exception as e:  # Redis away: said again at the next start
        log.warning("table %s: version %d's failure not recorded (%s)", table, version, first_line(str(e)))

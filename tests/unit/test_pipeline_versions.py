"""Which versions of a table the pipeline runs, and by which definition: the served one by its own, a changed one
begun beside it, a building or previous one by its own, and where none of that can be, the new one in place."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from freshroute.errors import TableDeployInProgress
from freshroute.metadata.table_versions import TableVersion, VersionedTable, VersionState
from pipeline import fingerprint as fingerprinting
from pipeline.fingerprint import fingerprint
from pipeline.tables import Source, Table, TablesDefinition, TablesFileError
from pipeline.versions import PlannedVersion, Planner

SOURCE = Source("sensors", "sensor STRING, value DOUBLE", "readings")
OLD = Table("stats", key="sensor", source="sensors", sql="SELECT sensor, count(*) AS n FROM sensors GROUP BY sensor")
NEW = replace(OLD, sql="SELECT sensor, count(*) AS n, max(value) AS top FROM sensors GROUP BY sensor")
OTHER = Table("peaks", key="sensor", source="sensors", sql="SELECT sensor, max(value) AS v FROM sensors GROUP BY sensor")


def definition(*tables: Table, source: Source = SOURCE) -> TablesDefinition:
    return TablesDefinition(Path("tables.py"), {source.name: source}, {t.name: t for t in tables})


def fp(t: Table, source: Source = SOURCE) -> str:
    return fingerprint(t, source, "realtime")


def fp_before_release(t: Table) -> str:
    """The fingerprint of ``t`` as the release before a change of layouts made it."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fingerprinting, "QUERY_LAYOUTS", {"realtime": 1, "microbatch": 1})
        return fp(t)


KEPT = {"old-file": definition(OLD, OTHER), "new-file": definition(NEW, OTHER)}


class Versions:
    """The version store's begin and fail, as the planner calls them."""

    def __init__(self, refuse: Exception | None = None, next_version: int = 2) -> None:
        self.refuse = refuse
        self.next_version = next_version
        self.begun: list[tuple[str, str]] = []
        self.failed: list[tuple[str, int, str]] = []

    def begin(self, table: str, fingerprint_: str, digest: str | None) -> TableVersion:
        if self.refuse is not None:
            raise self.refuse
        self.begun.append((table, fingerprint_))
        return TableVersion(self.next_version, VersionState.BUILDING, fingerprint_, 2_000,
                            definition=digest or "new-file")

    def fail(self, table: str, version: int, reason: str) -> None:
        self.failed.append((table, version, reason))


def planner(versions: Versions, resumes: bool = True, kept: dict[str, TablesDefinition] | None = None,
            shared: dict[str, Path] | None = None) -> Planner:
    kept = KEPT if kept is None else kept

    def load(digest: str) -> TablesDefinition:
        if digest not in kept:
            raise TablesFileError(f"the tables file of digest {digest} is not kept")
        return kept[digest]

    return Planner(lambda t: "realtime", lambda physical: resumes, load, versions.begin, versions.fail,
                   shared=lambda physical: (shared or {}).get(physical))


def served_old() -> VersionedTable:
    return VersionedTable.first("stats", fp(OLD), 1_000, definition="old-file")


def building_new() -> VersionedTable:
    return served_old().begun(fp(NEW), 2_000, "new-file")[0]


def test_a_table_without_a_record_runs_as_its_tables_file_says():
    versions = Versions()
    plan = planner(versions).plan(definition(NEW, OTHER), {})
    assert plan.definition.tables == {"stats": NEW, "peaks": OTHER}
    assert plan.versions["stats"] == PlannedVersion("stats", 1, VersionState.SERVING)
    assert plan.fingerprints == {"stats": fp(NEW), "peaks": fp(OTHER)} and plan.beside == frozenset()
    assert versions.begun == []


def test_an_unchanged_definition_builds_nothing_new():
    versions = Versions()
    plan = planner(versions).plan(definition(OLD, OTHER), {"stats": served_old()})
    assert plan.definition.tables == {"stats": OLD, "peaks": OTHER}
    assert versions.begun == [] and plan.beside == frozenset()


def test_a_changed_definition_is_begun_beside_the_served_one_which_goes_on_by_its_own(caplog):
    versions = Versions()
    caplog.set_level(logging.INFO, logger="pipeline")
    plan = planner(versions).plan(definition(NEW, OTHER), {"stats": served_old()})
    assert versions.begun == [("stats", fp(NEW))]
    assert plan.definition.tables["stats"] == OLD  # the served version: its rows never mix two definitions
    assert plan.definition.tables["stats-v2"] == replace(NEW, name="stats-v2", query="stats-v2")  # a query of its own
    assert plan.versions["stats-v2"] == PlannedVersion("stats", 2, VersionState.BUILDING)
    assert plan.beside == frozenset({"stats-v2"})
    assert plan.fingerprints["stats"] == fp(OLD)  # what the served version computes
    assert ("table stats: its definition changed (fingerprint %s): version 2 is built beside version 1 as table "
            "stats-v2, from the input's beginning as the broker holds it" % fp(NEW)) in caplog.messages


def test_a_restart_goes_on_building_the_version_begun():
    versions = Versions()
    plan = planner(versions).plan(definition(NEW, OTHER), {"stats": building_new()})
    assert versions.begun == []
    assert plan.definition.tables["stats"] == OLD and plan.definition.tables["stats-v2"].sql == NEW.sql
    assert plan.beside == frozenset({"stats-v2"})


def test_after_a_switch_the_new_version_is_served_and_the_old_one_kept_by_its_own_definition():
    record = building_new().switched(2, 3_000, 3_600_000)
    plan = planner(Versions()).plan(definition(NEW, OTHER), {"stats": record})
    assert plan.versions == {"stats": PlannedVersion("stats", 1, VersionState.PREVIOUS),
                             "stats-v2": PlannedVersion("stats", 2, VersionState.SERVING),
                             "peaks": PlannedVersion("peaks", 1, VersionState.SERVING)}
    assert plan.definition.tables["stats"] == OLD and plan.beside == frozenset({"stats"})
    assert plan.fingerprints["stats"] == fp(NEW)


def test_a_query_started_afresh_computes_the_new_definition_in_place():
    versions = Versions()
    plan = planner(versions, resumes=False).plan(definition(NEW, OTHER), {"stats": served_old()})
    assert plan.definition.tables["stats"] == NEW and "stats-v2" not in plan.definition.tables
    assert versions.begun == [] and plan.fingerprints["stats"] == fp(NEW)  # the registrar records it recomputed


def test_a_served_version_whose_definition_is_not_kept_is_held_while_the_new_one_is_built_beside(caplog):
    versions = Versions()
    plan = planner(versions, kept={}).plan(definition(NEW, OTHER), {"stats": served_old()})
    assert "stats" not in plan.definition.tables and plan.held == {"stats": PlannedVersion("stats", 1,
                                                                                           VersionState.SERVING)}
    assert versions.begun == [("stats", fp(NEW))] and plan.definition.tables["stats-v2"].sql == NEW.sql
    assert plan.fingerprints["stats"] == fp(OLD)  # what the version served was built by, as its record says
    assert ("table stats: version 1 cannot go on by the definition it was built with (the tables file of digest "
            "old-file is not kept): it is held, served as it stands with its input lag growing, until the version "
            "of the new definition is switched to") in caplog.messages


def test_a_source_declared_otherwise_now_holds_the_served_version_and_builds_the_new_one_beside():
    changed = replace(SOURCE, schema="sensor STRING, value DOUBLE, site STRING")
    versions = Versions()
    plan = planner(versions).plan(definition(NEW, OTHER, source=changed), {"stats": served_old()})
    assert set(plan.held) == {"stats"} and set(plan.definition.tables) == {"stats-v2", "peaks"}
    assert versions.begun == [("stats", fp(NEW, changed))]


def test_a_release_that_lays_out_queries_otherwise_builds_each_table_again_beside_the_one_held(monkeypatch):
    # The same tables file under a release whose Real-time queries keep their state otherwise.
    monkeypatch.setitem(fingerprinting.QUERY_LAYOUTS, "realtime", 2)
    versions = Versions()
    records = {t.name: VersionedTable.first(t.name, fp_before_release(t), 1_000, definition="old-file")
               for t in (OLD, OTHER)}
    assert fp(OLD) != fp_before_release(OLD)
    plan = planner(versions).plan(definition(OLD, OTHER), records)
    assert set(plan.held) == {"stats", "peaks"} and set(plan.definition.tables) == {"stats-v2", "peaks-v2"}
    assert versions.begun == [("stats", fp(OLD)), ("peaks", fp(OTHER))]
    assert plan.fingerprints == {"stats": fp_before_release(OLD), "peaks": fp_before_release(OTHER)}


def test_a_held_version_that_cannot_be_followed_now_stays_held(caplog):
    versions = Versions(refuse=TableDeployInProgress("version peaks-v3 is still building"))
    plan = planner(versions, kept={}).plan(definition(NEW, OTHER), {"stats": served_old()})
    assert set(plan.held) == {"stats"} and "stats-v2" not in plan.definition.tables
    assert ("table stats: its new definition is not built now (version peaks-v3 is still building): version 1 goes "
            "on being served held as it stands; start the pipeline again to build it") in caplog.messages


def test_a_version_that_cannot_begin_leaves_the_served_one_by_its_own_definition(caplog):
    versions = Versions(refuse=TableDeployInProgress("version peaks-v3 is still building"))
    plan = planner(versions).plan(definition(NEW, OTHER), {"stats": served_old()})
    assert plan.definition.tables == {"stats": OLD, "peaks": OTHER}
    assert ("table stats: its new definition is not built now (version peaks-v3 is still building): version 1 goes "
            "on being served by its own definition; start the pipeline again to build it") in caplog.messages


def test_a_definition_that_failed_is_not_built_again():
    record = building_new().failed(2, "Spark: [UNRESOLVED_COLUMN] top")
    versions = Versions()
    plan = planner(versions).plan(definition(NEW, OTHER), {"stats": record})
    assert versions.begun == [] and set(plan.definition.tables) == {"stats", "peaks"}
    assert plan.definition.tables["stats"] == OLD


def test_a_version_beside_whose_definition_is_lost_fails_and_the_served_one_goes_on():
    third = replace(NEW, sql="SELECT sensor, min(value) AS low FROM sensors GROUP BY sensor")
    versions = Versions(next_version=3)
    plan = planner(versions, kept={"old-file": KEPT["old-file"]}).plan(definition(third, OTHER),
                                                                      {"stats": building_new()})
    assert versions.failed == [("stats", 2, "its definition cannot be run again: the tables file of digest new-file "
                                            "is not kept")]
    assert plan.definition.tables["stats"] == OLD and "stats-v2" not in plan.definition.tables
    assert versions.begun == [("stats", fp(third))] and plan.definition.tables["stats-v3"].sql == third.sql


@pytest.mark.parametrize("state", [VersionState.RETIRED, VersionState.FAILED])
def test_versions_over_are_not_run(state):
    record = building_new()
    record = record.retired(2) if state is VersionState.RETIRED else record.failed(2, "refused")
    plan = planner(Versions()).plan(definition(OLD, OTHER), {"stats": record})
    assert set(plan.definition.tables) == {"stats", "peaks"} and plan.beside == frozenset()


def test_a_version_whose_input_has_expired_is_refused_before_it_starts_and_the_served_one_goes_on():
    versions = Versions()
    why = "its input has expired from the broker: topic readings holds records from 2026-12-01 10:00:00 UTC on"
    p = Planner(lambda t: "realtime", lambda physical: True, KEPT.__getitem__, versions.begin, versions.fail,
                lambda t: why)
    plan = p.plan(definition(NEW, OTHER), {"stats": served_old()})
    assert versions.begun == [("stats", fp(NEW))] and versions.failed == [("stats", 2, why)]
    assert plan.definition.tables == {"stats": OLD, "peaks": OTHER} and plan.beside == frozenset()
    # Declared to be computed from what the broker holds: a definition of its own, built.
    held = replace(NEW, versions_from="held")
    versions = Versions()
    p = Planner(lambda t: "realtime", lambda physical: True, KEPT.__getitem__, versions.begin, versions.fail,
                lambda t: why)
    plan = p.plan(definition(held, OTHER), {"stats": building_new().failed(2, why)})
    assert fp(held) != fp(NEW) and versions.begun == [("stats", fp(held))] and versions.failed == []
    assert plan.definition.tables["stats-v2"].versions_from == "held"


def test_a_definition_rolled_back_from_and_retired_is_not_built_again_until_the_tables_file_changes_it(caplog):
    caplog.set_level(logging.INFO, "pipeline")
    record = building_new().switched(2, 3_000, 60_000).rolled_back(4_000, 60_000).retired(2)
    assert record.serving == 1 and record.proposal() == fp(NEW)  # a record of before proposals: its newest's
    versions = Versions(next_version=3)
    plan = planner(versions).plan(definition(NEW, OTHER), {"stats": record})
    assert versions.begun == [] and plan.definition.tables == {"stats": OLD, "peaks": OTHER}
    assert plan.proposed == {"stats": fp(NEW), "peaks": fp(OTHER)}
    assert any("the tables file defines it as when the pipeline last started" in m for m in caplog.messages)
    # The tables file changed since (the pipeline last started with the one it was rolled back to): built.
    plan = planner(versions).plan(definition(NEW, OTHER), {"stats": record.proposing(fp(OLD))})
    assert versions.begun == [("stats", fp(NEW))] and set(plan.definition.tables) == {"stats", "stats-v3", "peaks"}


def test_a_deployed_definition_is_built_beside_in_the_place_of_the_tables_file_s():
    versions = Versions()
    record = served_old().proposing(fp(OLD))
    plan = planner(versions).plan(definition(OLD, OTHER), {"stats": record}, {"stats": (NEW, "deployed-file")})
    assert versions.begun == [("stats", fp(NEW))] and plan.definition.tables["stats-v2"].sql == NEW.sql
    assert plan.definition.tables["stats"] == OLD
    assert plan.proposed["stats"] == fp(OLD)  # the tables file still says what it said: no version of its own next
    assert plan.refused == {}
    # Deployed while another version builds: refused, saying why.
    versions = Versions(refuse=TableDeployInProgress("version peaks-v3 is still building"))
    plan = planner(versions).plan(definition(OLD, OTHER), {"stats": record}, {"stats": (NEW, "deployed-file")})
    assert plan.refused == {"stats": "version peaks-v3 is still building"} and "stats-v2" not in plan.definition.tables


def retired_old() -> VersionedTable:
    return building_new().switched(2, 3_000, 0).retired(1)


def test_a_retired_version_its_shared_query_still_holds_is_a_ghost_computed_by_its_own_definition(caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    checkpoint = Path("/checkpoints/sensors.tables")
    plan = planner(Versions(), shared={"stats": checkpoint}).plan(definition(NEW, OTHER), {"stats": retired_old()})
    # The shared query's tables and their definitions stay those its checkpoint holds the state of.
    assert plan.definition.tables["stats"] == OLD and plan.definition.tables["peaks"] == OTHER
    assert plan.versions["stats"] == PlannedVersion("stats", 1, VersionState.RETIRED)
    assert plan.ghosts == frozenset({"stats"}) and "stats" in plan.beside
    assert plan.versions["stats-v2"] == PlannedVersion("stats", 2, VersionState.SERVING)
    assert plan.fingerprints["stats"] == fp(NEW)
    assert ("table stats: version 1 is retired, computed in the query it shares (checkpoint "
            "/checkpoints/sensors.tables) by its own definition so that the query's state stays as it is, and "
            "written nowhere") in caplog.messages


def test_a_retired_version_no_shared_query_holds_is_not_computed():
    plan = planner(Versions()).plan(definition(NEW, OTHER), {"stats": retired_old()})
    assert set(plan.definition.tables) == {"stats-v2", "peaks"} and plan.ghosts == frozenset()


def test_a_ghost_whose_definition_is_lost_names_the_checkpoint_to_delete(caplog):
    versions = Versions()
    checkpoint = Path("/checkpoints/sensors.tables")
    plan = planner(versions, kept={}, shared={"stats": checkpoint}).plan(definition(NEW, OTHER),
                                                                         {"stats": retired_old()})
    assert set(plan.definition.tables) == {"stats-v2", "peaks"} and plan.ghosts == frozenset()
    assert versions.failed == []  # retired it stays
    assert ("table stats: version 1 is retired, but the checkpoint /checkpoints/sensors.tables of the query it shares "
            "still holds its state, and its definition cannot be run again (the tables file of digest old-file is not "
            "kept): that query cannot resume; delete /checkpoints/sensors.tables to recompute its other tables from "
            "the input") in caplog.messages

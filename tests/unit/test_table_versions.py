"""Table versions in the metadata store: a version built beside the served one, the switch and the rollback as one
write each, failures and retirement, and the refusals (a second build, no previous version, a version not there)."""

from __future__ import annotations

import pytest

from freshroute.errors import NoPreviousTableVersion, TableDeployInProgress, TableVersionNotFound
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.table_versions import (VersionedTable, VersionState, logical_of, physical_name)
from freshroute.metadata.tables import TableSpec
from freshroute.metadata.version_store import TableVersionStore
from tests.unit.memory_redis import MemoryRedis

HOUR_MS = 3_600_000


@pytest.fixture
def redis():
    return MemoryRedis()


@pytest.fixture
def store(redis):
    return TableVersionStore(redis.sync, "t")


def register(redis, *names):
    MetadataStore(redis.sync, "t").register_tables(TableSpec(n, f"{n}-changelog", 4, "id", {"n": "long"}, 1)
                                                   for n in names)


def states(record: VersionedTable) -> dict[int, str]:
    return {n: v.state.value for n, v in record.versions.items()}


def test_version_1_is_the_table_under_its_own_name_and_later_ones_are_tables_of_their_own():
    assert physical_name("sensor_stats", 1) == "sensor_stats"
    assert physical_name("sensor_stats", 2) == "sensor_stats-v2"
    assert logical_of("sensor_stats-v12") == ("sensor_stats", 12)
    assert logical_of("sensor_stats") == ("sensor_stats", 1)
    assert logical_of("x-v0") == ("x-v0", 1) and logical_of("-v2") == ("-v2", 1)


def test_a_record_round_trips_through_its_json():
    record = VersionedTable.first("t", "fp1", 1_000)
    record, _ = record.begun("fp2", 2_000)
    record = record.failed(2, "key column 'id' is missing").switched(1, 3_000, HOUR_MS)
    assert VersionedTable.from_json(record.to_json()) == record and record.proposed is None
    assert record.proposal() == "fp2"  # a record of before proposals proposed its newest version
    proposed = record.proposing("fp1")
    assert VersionedTable.from_json(proposed.to_json()) == proposed and proposed.proposal() == "fp1"


def test_a_listing_says_the_served_version_and_what_the_others_are_doing():
    record = VersionedTable.first("t", "fp1", 1_000)
    assert record.summary() == "1"
    record, _ = record.begun("fp2", 2_000)
    assert record.summary() == "1 (2 building)"
    record = record.switched(2, 3_000, HOUR_MS)
    record, _ = record.begun("fp3", 4_000)
    assert record.summary() == "2 (1 previous, 3 building)"
    assert [v.to_dict() for v in record.listed()][1] == {"version": 2, "state": "serving", "fingerprint": "fp2",
                                                         "created_ms": 2_000, "switched_ms": 3_000}


def test_a_new_version_builds_beside_the_served_one_and_the_switch_is_one_write_readers_see(redis, store):
    version_before = redis.sync.get("t:tables:version")
    first = store.adopt("sensor_stats", "fp1", 1_000)
    assert (first.serving, states(first)) == (1, {1: "serving"})
    assert store.adopt("sensor_stats", "fp-other", 1_500) == first  # a table keeps the record it has

    v2 = store.begin("sensor_stats", "fp2", 2_000)
    assert (v2.version, v2.state, v2.fingerprint) == (2, VersionState.BUILDING, "fp2")
    assert store.building() == "sensor_stats-v2"
    assert store.record("sensor_stats").physical() == "sensor_stats"  # still served: version 1

    register(redis, "sensor_stats-v2")
    moved = redis.sync.get("t:tables:version")
    switched = store.switch("sensor_stats", 2, 5_000, HOUR_MS)
    assert switched.serving == 2 and switched.physical() == "sensor_stats-v2"
    assert states(switched) == {1: "previous", 2: "serving"}
    assert switched.versions[1].retire_at_ms == 5_000 + HOUR_MS and switched.versions[2].switched_ms == 5_000
    assert store.record("sensor_stats") == switched and store.building() is None  # the next may start
    assert redis.sync.get("t:tables:version") not in (version_before, moved)  # readers refresh on it


def test_a_rollback_serves_the_previous_version_again_and_without_one_is_a_named_error(redis, store):
    store.adopt("t1", "fp1", 1_000)
    with pytest.raises(NoPreviousTableVersion) as e:
        store.rollback("t1", 2_000, HOUR_MS)
    assert e.value.code == "NO_PREVIOUS_TABLE_VERSION" and e.value.http_status == 409 and "version 1" in e.value.message
    store.begin("t1", "fp2", 2_000)
    register(redis, "t1", "t1-v2")
    store.switch("t1", 2, 3_000, HOUR_MS)
    back = store.rollback("t1", 4_000, HOUR_MS)
    assert back.serving == 1 and states(back) == {1: "serving", 2: "previous"}
    assert back.versions[2].retire_at_ms == 4_000 + HOUR_MS and back.versions[1].retire_at_ms is None


def test_one_version_builds_at_a_time_in_the_cluster(store):
    store.adopt("a", "fa", 1_000)
    store.adopt("b", "fb", 1_000)
    store.begin("a", "fa2", 2_000)
    with pytest.raises(TableDeployInProgress) as e:
        store.begin("b", "fb2", 2_100)
    assert e.value.details["building"] == "a-v2" and "a-v2 is still building" in e.value.message
    assert states(store.record("b")) == {1: "serving"}  # nothing written
    store.fail("a", 2, "Spark refused the query: [UNRESOLVED_COLUMN] …")
    assert store.building() is None
    assert store.begin("b", "fb2", 2_200).version == 2


def test_a_failed_version_keeps_its_reason_is_never_served_and_its_number_is_not_reused(redis, store):
    store.adopt("t1", "fp1", 1_000)
    store.begin("t1", "fp2", 2_000)
    failed = store.fail("t1", 2, "tables.py, table t1: key column 'id' is not in its output")
    assert failed.serving == 1 and states(failed) == {1: "serving", 2: "failed"}
    register(redis, "t1-v2")
    with pytest.raises(TableVersionNotFound) as e:
        store.switch("t1", 2, 3_000, HOUR_MS)
    assert e.value.code == "TABLE_VERSION_NOT_FOUND" and "key column 'id'" in e.value.message
    assert store.begin("t1", "fp2", 4_000).version == 3


def test_a_switch_to_a_version_whose_replicas_are_not_placed_or_that_is_not_there_is_refused(store):
    store.adopt("t1", "fp1", 1_000)
    store.begin("t1", "fp2", 2_000)
    with pytest.raises(TableVersionNotFound, match="t1-v2 has no table spec registered"):
        store.switch("t1", 2, 3_000, HOUR_MS)
    with pytest.raises(TableVersionNotFound, match="no version 7"):
        store.switch("t1", 7, 3_000, HOUR_MS)
    with pytest.raises(TableVersionNotFound, match="no version record"):
        store.switch("nothing", 2, 3_000, HOUR_MS)
    assert states(store.record("t1")) == {1: "serving", 2: "building"}


def test_a_second_switch_sends_the_version_previous_until_then_to_be_retired_at_once(redis, store):
    store.adopt("t1", "fp1", 1_000)
    for n in (2, 3):
        store.begin("t1", f"fp{n}", n * 1_000)
        register(redis, f"t1-v{n}")
        record = store.switch("t1", n, n * 1_000 + 500, HOUR_MS)
    assert states(record) == {1: "previous", 2: "previous", 3: "serving"}
    assert record.versions[1].retire_at_ms == 3_500  # due now: only the last served is kept for a rollback
    assert record.versions[2].retire_at_ms == 3_500 + HOUR_MS
    retired = store.retire("t1", 1)
    assert states(retired) == {1: "retired", 2: "previous", 3: "serving"}
    with pytest.raises(TableVersionNotFound, match="version 1 of table 't1' is retired"):
        retired.readable(1)
    assert store.rollback("t1", 5_000, HOUR_MS).serving == 2


def test_a_change_made_from_a_record_that_moved_meanwhile_is_made_again_from_the_new_one(redis, store):
    """Two pipelines starting at once both adopt the table: the second keeps the record the first wrote (and the
    version it began meanwhile), never writes its own over it."""
    read = store.redis.hget
    raced = []

    def hget_then_someone_else_writes(key, field):
        raw = read(key, field)
        if not raced:  # between this read and the write, another process adopts the table and begins a version
            raced.append(True)
            other = TableVersionStore(redis.sync, "t")
            other.adopt("t1", "theirs", 1_000)
            other.begin("t1", "theirs-2", 1_500)
        return raw

    store.redis.hget = hget_then_someone_else_writes
    record = store.adopt("t1", "mine", 1_200)
    assert states(record) == {1: "serving", 2: "building"} and record.versions[1].fingerprint == "theirs"
    assert store.record("t1") == record
    with pytest.raises(TableVersionNotFound, match="no version 9"):
        store.fail("t1", 9, "no such build")


def test_a_record_redis_lost_is_restored_whole_with_its_building_marker_and_a_present_one_is_kept(redis, store):
    building = VersionedTable.first("a", "fa", 1_000).begun("fa2", 2_000)[0]
    assert store.restore(building) == building
    assert store.building() == "a-v2"  # a second deploy is refused again, naming it
    with pytest.raises(TableDeployInProgress):
        store.begin("a", "fa3", 3_000)
    other = VersionedTable.first("a", "other", 5_000)
    assert store.restore(other) == building  # what Redis holds is newer than any copy of it

"""A switch to a table's new version: refused, naming why, until it has caught up with its input and its replicas
with its changelog (unless forced); then one write, which a rollback undoes at once; the pipeline switches by itself."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from freshroute.errors import TableVersionNotFound, TableVersionNotReady
from freshroute.lag import now_ms
from freshroute.metadata.progress import InputLag
from freshroute.metadata.reports import NodeReport, ReplicaReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.tables import TableSpec
from freshroute.metadata.version_store import TableVersionStore
from freshroute.metadata.version_switch import readiness, switch
from pipeline.registrar import TableRegistrar
from tests.unit.memory_redis import MemoryRedis

T, V2 = "stats", "stats-v2"
SPECS = [TableSpec(n, f"{n}-changelog", 2, "id", {"n": "long"}, 1) for n in (T, V2)]


@pytest.fixture
def stores():
    redis = MemoryRedis()
    store, versions = MetadataStore(redis.sync, "ns"), TableVersionStore(redis.sync, "ns")
    store.register_tables(SPECS)
    versions.adopt(T, "fp1", 1_000)
    versions.begin(T, "fp2", 2_000)
    return store, versions


def caught_up(store: MetadataStore, records: int = 3, partitions: tuple[int, ...] = (0, 1), behind: int = 0) -> None:
    """The pipeline's progress in version 2's input, and its active replicas on one node."""
    now = now_ms()
    store.publish_input_lag(V2, InputLag(records, now - 50, now, alive_ms=now))
    store.publish_node(NodeReport("n1", "127.0.0.1:1", now, tuple(
        ReplicaReport(V2, p, Role.ACTIVE, ReplicaState.ACTIVE, 100 - behind, 100, 10) for p in partitions)), 10_000)


def test_a_version_that_has_not_caught_up_is_refused_naming_why(stores):
    store, versions = stores
    with pytest.raises(TableVersionNotReady, match="stats-v2: the pipeline has published no progress of it yet"):
        switch(store, versions, T, None, now_ms(), 100, 60_000)
    caught_up(store, records=5_000)
    with pytest.raises(TableVersionNotReady, match=r"stats-v2 is 5000 input records \(\d+ ms\) behind its input, "
                                                   r"switch_lag is 100 \(--force switches all the same\)") as e:
        switch(store, versions, T, None, now_ms(), 100, 60_000)
    assert e.value.details["input_lag"]["records"] == 5_000
    caught_up(store, partitions=(0,))
    with pytest.raises(TableVersionNotReady, match="partitions 1 have no active replica within 100 offsets"):
        switch(store, versions, T, None, now_ms(), 100, 60_000)
    caught_up(store, behind=500)
    assert readiness(store, SPECS[1], now_ms(), 100).behind == (0, 1)
    assert versions.record(T).serving == 1  # nothing was written


def test_a_version_caught_up_is_served_with_one_write_and_a_rollback_serves_the_old_one_again(stores):
    store, versions = stores
    caught_up(store)
    record = switch(store, versions, T, None, 5_000, 100, 60_000)
    assert record.serving == 2 and record.versions[1].state.value == "previous"
    assert record.versions[1].retire_at_ms == 65_000
    assert versions.building() is None
    back = versions.rollback(T, 6_000, 60_000)
    assert back.serving == 1 and back.versions[2].state.value == "previous"


def test_a_forced_switch_does_not_wait_and_a_switch_with_nothing_to_switch_to_is_named(stores):
    store, versions = stores
    assert switch(store, versions, T, 2, now_ms(), 0, 60_000, force=True).serving == 2
    with pytest.raises(TableVersionNotFound, match="table 'stats' has no version building to switch to"):
        switch(store, versions, T, None, now_ms(), 0, 60_000)
    with pytest.raises(TableVersionNotFound, match="table 'other' has no version record"):
        switch(store, versions, "other", None, now_ms(), 0, 60_000)


def test_the_pipeline_serves_a_version_it_builds_once_it_has_caught_up(stores, caplog):
    store, versions = stores
    caplog.set_level(logging.INFO, logger="pipeline")
    stop = threading.Event()
    registrar = TableRegistrar(store, SPECS, stop, "h:1", "ns", every_s=0.02, versions=versions,
                               fingerprints={T: "fp1"}, switch_lag=100, retain_ms=60_000)
    registrar.start()
    try:
        time.sleep(0.2)
        assert versions.record(T).serving == 1  # not caught up: it goes on building
        caught_up(store)
        deadline = time.monotonic() + 5
        while versions.record(T).serving != 2:
            assert time.monotonic() < deadline, "not switched"
            time.sleep(0.02)
    finally:
        stop.set()
        registrar.join(timeout=5)
    assert ("table stats: version 2 has caught up with its input: it is served now; version 1 is kept for a rollback "
            "for 60 s (`freshroute table rollback stats`)") in caplog.messages

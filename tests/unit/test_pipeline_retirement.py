"""A previous table version retired once its time for a rollback is over: its query stopped, its spec, checkpoint and
changelog gone; one that shares its query with other tables leaves that query running, and has the pipeline start its
queries again, computing it there as a ghost."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

from freshroute.metadata.store import MetadataStore
from freshroute.metadata.table_versions import VersionedTable
from freshroute.metadata.tables import TableSpec
from freshroute.metadata.version_store import TableVersionStore
from pipeline import retirement as retirement_module
from pipeline.registrar import TableRegistrar
from pipeline.retirement import Retirement
from tests.unit.memory_redis import MemoryRedis


class Admin:
    """Deletes topics, the first ``failures`` times failing as a broker away does."""

    def __init__(self, failures: int = 0) -> None:
        self.deleted: list[str] = []
        self.failures = failures

    def delete_topics(self, topics, operation_timeout):
        done = {}
        for t in topics:
            done[t] = Future()
            if self.failures:
                self.failures -= 1
                done[t].set_exception(RuntimeError("KafkaError{code=_TRANSPORT}"))
            else:
                self.deleted.append(t)
                done[t].set_result(None)
        return done


def query(name: str, *tables: str) -> SimpleNamespace:
    stopped = []
    q = SimpleNamespace(name=name, tables=[SimpleNamespace(name=t) for t in tables], finished=False, stopped=stopped,
                        query=SimpleNamespace(isActive=True, stop=lambda: stopped.append(name)))
    return q


def retirement(tmp_path, queries, admin) -> Retirement:
    return Retirement(queries, {}, lambda q: tmp_path / q, lambda t: f"{t}-changelog", lambda: admin)


def test_a_version_in_a_query_of_its_own_is_stopped_and_its_checkpoint_and_changelog_deleted(tmp_path, monkeypatch):
    admin = Admin()
    own, shared = query("t-v2", "t-v2"), query("readings.tables", "t", "u")
    queries = {"t-v2": own, "readings.tables": shared}
    (tmp_path / "t-v2" / "commits").mkdir(parents=True)
    r = retirement(tmp_path, queries, admin)
    monkeypatch.setattr(retirement_module, "TOPIC_DELETE_AFTER_S", 0.0)
    assert r.stop("t", 2) is True
    assert own.finished and own.stopped == ["t-v2"] and queries == {"readings.tables": shared}
    assert not (tmp_path / "t-v2").exists()
    r.delete_due()
    assert admin.deleted == ["t-v2-changelog"]


def test_a_changelog_the_broker_did_not_delete_is_deleted_at_a_later_round(tmp_path, monkeypatch):
    admin = Admin(failures=1)
    r = retirement(tmp_path, {"t-v2": query("t-v2", "t-v2")}, admin)
    monkeypatch.setattr(retirement_module, "TOPIC_DELETE_AFTER_S", 0.0)
    assert r.stop("t", 2)
    r.delete_due()
    assert admin.deleted == []  # refused: kept for the next round
    r.delete_due()
    assert admin.deleted == ["t-v2-changelog"]


def test_a_version_sharing_its_query_is_retired_its_query_left_running_and_the_pipeline_asked_to_start_again(
        tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, "pipeline")
    admin, restart = Admin(), threading.Event()
    shared = query("readings.tables", "t", "u")
    (tmp_path / "readings.tables" / "state").mkdir(parents=True)
    runs = {"t": SimpleNamespace(writer=SimpleNamespace(expiry=None)), "u": object()}
    r = Retirement({"readings.tables": shared}, runs, lambda q: tmp_path / q, lambda t: f"{t}-changelog",
                   lambda: admin, restart=restart)
    monkeypatch.setattr(retirement_module, "TOPIC_DELETE_AFTER_S", 0.0)
    assert r.stop("t", 1) is True
    # The query goes on with its state: the start asked for computes t there as a ghost.
    assert shared.stopped == [] and not shared.finished and (tmp_path / "readings.tables" / "state").exists()
    assert list(runs) == ["u"]
    assert not restart.is_set()  # not before the registrar has recorded the retirement
    r.restart_if_due()
    assert restart.is_set()
    r.delete_due()
    assert admin.deleted == ["t-changelog"]
    assert caplog.messages == ["table t: version 1 retired: query readings.tables computes it with u, and goes on "
                               "computing it for its state only, written nowhere, once the queries start again; its "
                               "changelog t-changelog goes in 0 s", "changelog t-changelog of a retired table version "
                               "deleted"]


def test_a_start_deletes_the_changelog_a_stopped_pipeline_had_yet_to_delete_once_and_later(tmp_path, monkeypatch):
    admin = Admin()
    r = retirement(tmp_path, {}, admin)
    r.delete_later("t-changelog")
    r.delete_later("t-changelog")
    r.delete_due()
    assert admin.deleted == []  # not before store nodes have stopped reading it
    monkeypatch.setattr(time, "monotonic", lambda: 1e12)
    r.delete_due()
    assert admin.deleted == ["t-changelog"]


def test_held_versions_no_query_computes_let_their_query_s_checkpoint_go_with_the_last_of_them(tmp_path, monkeypatch):
    admin = Admin()
    (tmp_path / "readings.tables" / "state").mkdir(parents=True)  # the Real-time query t and u were computed in
    r = Retirement({}, {}, lambda q: tmp_path / q, lambda t: f"{t}-changelog", lambda: admin,
                   held={"t": "readings.tables", "u": "readings.tables"})
    monkeypatch.setattr(retirement_module, "TOPIC_DELETE_AFTER_S", 0.0)
    assert r.stop("t", 1) is True
    assert (tmp_path / "readings.tables" / "state").exists()  # u's state: the release before resumes it after a rollback
    assert r.stop("u", 1) is True
    assert not (tmp_path / "readings.tables").exists()
    r.delete_due()
    assert admin.deleted == ["t-changelog", "u-changelog"]


def test_the_pipeline_retires_a_previous_version_once_its_time_for_a_rollback_is_over(tmp_path, monkeypatch):
    redis = MemoryRedis()
    store, versions = MetadataStore(redis.sync, "ns"), TableVersionStore(redis.sync, "ns")
    specs = [TableSpec(n, f"{n}-changelog", 2, "id", {"n": "long"}, 1) for n in ("t", "t-v2")]
    store.register_tables(specs)
    record = VersionedTable.first("t", "fp1", 1_000).begun("fp2", 2_000)[0].switched(2, 3_000, 0)  # due at once
    versions.restore(record)
    admin = Admin()
    monkeypatch.setattr(retirement_module, "TOPIC_DELETE_AFTER_S", 0.0)
    r = retirement(tmp_path, {"t": query("t", "t"), "t-v2": query("t-v2", "t-v2")}, admin)
    stop = threading.Event()
    registrar = TableRegistrar(store, specs, stop, "h:1", "ns", every_s=0.02, versions=versions,
                               fingerprints={"t": "fp2"}, retirement=r)
    registrar.start()
    try:
        deadline = time.monotonic() + 5
        while admin.deleted != ["t-changelog"]:
            assert time.monotonic() < deadline, (versions.record("t"), admin.deleted)
            time.sleep(0.02)
    finally:
        stop.set()
        registrar.join(timeout=5)
    assert {n: v.state.value for n, v in versions.record("t").versions.items()} == {1: "retired", 2: "serving"}
    assert set(store.tables()) == {"t-v2"}  # version 1's replicas are let go; version 2 is the table's now
    assert [s.name for s in registrar.specs] == ["t-v2"]  # and it is registered no more

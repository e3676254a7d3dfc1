"""Empty replicas restored in bulk: the tailer ingests the native reader's table files, then follows on by its consumer.

The reader is faked at its seam (its chunks, each a real table file written by RocksDB's writer); the store, its
ingestion and the tailer are real. tests/integration/test_bulk_restore.py runs the native reader on a real broker.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from confluent_kafka import OFFSET_BEGINNING
from rocksdict import Options, SstFileWriter

from freshroute.metadata.roles import ReplicaState
from store_node.changelog import ChangelogTailer
from store_node.replica import replica_path
from store_node.replica_store import DiskFull, ReplicaStore
from store_node.settings import StoreNodeSettings
from tests.unit.fake_changelog import SPEC, Clock, FakeAdmin, FakeConsumer, eof, host, record, steps_until


def table_file(path: Path, rows: dict) -> Path | None:
    """``rows`` ({key: value or None: a delete}) as a table file at ``path``; None for no rows."""
    if not rows:
        return None
    writer = SstFileWriter(Options(raw_mode=True))
    writer.open(str(path))
    for key, value in sorted(rows.items()):
        if value is None:
            del writer[key]
        else:
            writer[key] = value
    writer.finish()
    return path


class FakeReader:
    """What the native reader hands over, scripted: per partition, a list of chunks (rows, next offset, records)."""

    def __init__(self, clock, config, topic, partitions, key_format, value_format):
        self.clock = clock
        self.config, self.topic, self.formats = config, topic, (key_format, value_format)
        self.partitions = {p: (offset, Path(directory)) for p, offset, directory in partitions}
        self.ready: list = []
        self.failure: Exception | None = None
        self.closed = False
        self.dropped: list[int] = []

    def chunk(self, partition, rows, next_offset, records=None, skipped=0, problems=(), end_offset=-1, last=False,
              positions=None, superseded=0, unpositioned=0):
        """A chunk of ``rows`` ({key: value or None}) and the input ``positions`` they leave ({key: header or None}),
        their table files written as the native reader would."""
        _, directory = self.partitions[partition]
        self.ready.append(SimpleNamespace(partition=partition, next_offset=next_offset, end_offset=end_offset,
                                          end_seen_ms=self.clock() if last else -1,
                                          records=len(rows) if records is None else records, skipped=skipped,
                                          problems=list(problems), superseded=superseded, unpositioned=unpositioned,
                                          rows=len(rows), file=table_file(directory / f"load-{next_offset}.sst", rows),
                                          positions=table_file(directory / f"load-{next_offset}.positions.sst",
                                                               positions or {}),
                                          last=last))

    def next_chunk(self, timeout_s):
        if self.failure is not None:
            raise self.failure
        return self.ready.pop(0) if self.ready else None

    def drop_partition(self, partition):
        self.dropped.append(partition)

    def close(self):
        self.closed = True


@pytest.fixture
def env(tmp_path):
    made = {"readers": []}
    clock = Clock()

    def reader_factory(*args):
        if made.get("refuse"):
            raise ValueError("cannot create the consumer: no")
        made["readers"].append(FakeReader(clock, *args))
        return made["readers"][-1]

    def consumer_factory(config):
        made["consumer"] = FakeConsumer(config)
        return made["consumer"]

    def build(**settings):
        settings = StoreNodeSettings(**{"node_id": "n1", "data_dir": tmp_path, "removed_replica_grace_ms": 0,
                                        "topic_check_ms": 1, "caught_up_threshold": 0, **settings})
        tailer = ChangelogTailer(settings, clock, consumer_factory, FakeAdmin, reader_factory)
        assert tailer.open()
        made["tailer"] = tailer
        return SimpleNamespace(tailer=tailer, consumer=made["consumer"], readers=made["readers"], root=tmp_path,
                               made=made)

    yield build
    if "tailer" in made:
        made["tailer"].close()


def test_an_empty_replica_restores_from_table_files_then_follows_on_by_the_consumer(env):
    env = env()
    host(env, 0, 1)
    [reader] = env.readers
    assert reader.topic == SPEC.topic and reader.formats == ("string", "json")
    assert {p: offset for p, (offset, _) in reader.partitions.items()} == {0: 0, 1: 0}
    assert reader.partitions[0][1] == replica_path(env.root, "counts", 0)
    assert reader.config["client.id"] == "freshroute-store-n1-bulk" and reader.config["enable.partition.eof"] == "true"
    assert env.consumer.assigned == {}  # the consumer fetches neither while the reader reads them

    # Two chunks of partition 0 (the second overwrites a key and deletes one), partition 1 in one.
    reader.chunk(0, {b"a": b'{"n":1}', b"b": b'{"n":2}', b"c": b'{"n":3}'}, next_offset=5, records=5, end_offset=9)
    reader.chunk(0, {b"a": b'{"n":10}', b"c": None}, next_offset=9, records=4, skipped=1,
                 problems=[(7, "value is not JSON")], end_offset=9, last=True)
    reader.chunk(1, {b"x": b'"one"'}, next_offset=2, records=2, last=True)
    env.tailer.step()
    rep0, rep1 = (env.tailer.serving[("counts", p)] for p in (0, 1))
    assert rep0.lag.applied == 9 and rep1.lag.applied == 2
    assert rep0.counters.records_applied == 8 and rep0.counters.records_skipped == 1
    assert rep0.lag.end == 9
    # Read to their ends: the consumer goes on from each checkpoint.
    assert env.consumer.assigned == {(SPEC.topic, 0): 9, (SPEC.topic, 1): 2}
    assert reader.closed and not env.tailer.bulk.active
    assert not list(replica_path(env.root, "counts", 0).glob("load-*.sst"))  # moved into the store

    env.consumer.queue += [record(9, "b", {"n": 20}), eof(10), eof(2, partition=1)]
    steps_until(env, lambda: rep0.state is ReplicaState.ACTIVE and rep1.state is ReplicaState.ACTIVE)
    store = env.tailer.serving[("counts", 0)].store
    assert not store.bulk_load  # reopened for reads
    assert store.get_many([b"a", b"b", b"c"]) == [b'{"n":10}', b'{"n": 20}', None]
    assert env.tailer.serving[("counts", 1)].store.get(b"x") == b'"one"'


def test_the_positions_a_bulk_restore_leaves_hold_the_tailer_to_the_newer_rows(env):
    env = env()
    host(env, 0)
    [reader] = env.readers
    # The reader applied a replay's rows by their positions: a's count 9 at [5], its older row at [3] superseded.
    reader.chunk(0, {b"a": b'{"count":9}', b"b": b'{"count":1}'}, next_offset=6, records=6, superseded=1,
                 unpositioned=1, positions={b"a": b"[5]"}, end_offset=6, last=True)
    env.tailer.step()
    rep = env.tailer.serving[("counts", 0)]
    assert rep.store.positions_of([b"a", b"b"]) == [b"[5]", None]
    assert rep.counters.records_applied == 5 and rep.counters.records_superseded == 1
    assert rep.counters.records_unpositioned == 1
    assert not list(replica_path(env.root, "counts", 0).glob("load-*.sst"))  # both files moved into the store

    # The replay's rows still to come after the bulk restore: older ones skipped, the catching-up one applied.
    env.consumer.queue += [record(6, "a", {"count": 4}, position=[3]), record(7, "b", {"count": 2}, position=[4]),
                           eof(8)]
    steps_until(env, lambda: rep.lag.applied == 8)
    assert rep.store.get_many([b"a", b"b"]) == [b'{"count":9}', b'{"count": 2}']
    assert rep.counters.records_superseded == 2
    env.consumer.queue += [record(8, "a", {"count": 10}, position=[6]), eof(9)]
    steps_until(env, lambda: rep.lag.applied == 9)
    assert rep.store.get(b"a") == b'{"count": 10}'


def test_a_replica_read_to_the_end_of_its_changelog_is_caught_up_without_waiting_for_the_consumer(env):
    env = env()
    host(env, 0)
    [reader] = env.readers
    reader.chunk(0, {b"a": b"1", b"b": b"2"}, next_offset=7, end_offset=7, last=True)
    env.tailer.step()
    rep = env.tailer.serving[("counts", 0)]
    assert rep.state is ReplicaState.ACTIVE and rep.lag.applied == 7  # the reader's end-of-partition is evidence
    assert not rep.store.bulk_load and rep.store.get(b"b") == b"2"
    assert env.consumer.assigned == {(SPEC.topic, 0): 7}  # and the consumer follows on

    # Not at the end it saw (records came since): the consumer's fetches bring the rest first.
    host(env, 0, 1)
    [_, later] = env.readers
    later.chunk(1, {b"x": b"1"}, next_offset=3, end_offset=5, last=True)
    env.tailer.step()
    assert env.tailer.serving[("counts", 1)].state is ReplicaState.RESTORING


def test_a_replica_that_resumes_is_fetched_by_the_consumer(env):
    env = env()
    stored = ReplicaStore.open(replica_path(env.root, "counts", 1))
    stored.apply([(b"a", b"1")], 42)
    stored.close()
    host(env, 0, 1)
    [reader] = env.readers
    assert set(reader.partitions) == {0}  # the empty one only
    assert env.consumer.assigned == {(SPEC.topic, 1): 42}


@pytest.mark.parametrize("settings", [{"bulk_restore": False}, {"apply_rate_limit": 1000}])
def test_no_bulk_restore_when_turned_off_or_rate_limited(env, settings):
    env = env(**settings)
    host(env, 0)
    assert env.readers == [] and env.consumer.assigned == {(SPEC.topic, 0): OFFSET_BEGINNING}


def test_a_reader_that_cannot_be_made_leaves_the_replicas_to_the_consumer(env):
    env = env()
    env.made["refuse"] = True
    host(env, 0)
    assert env.consumer.assigned == {(SPEC.topic, 0): OFFSET_BEGINNING}


def test_a_failed_reader_hands_its_replicas_to_the_consumer_at_their_checkpoints(env):
    env = env()
    host(env, 0, 1)
    [reader] = env.readers
    reader.chunk(0, {b"a": b"1"}, next_offset=3)
    env.tailer.step()
    reader.failure = RuntimeError("partition 1: Broker: Unknown topic or partition")
    env.tailer.step()
    assert env.consumer.assigned == {(SPEC.topic, 0): 3, (SPEC.topic, 1): OFFSET_BEGINNING}
    assert reader.closed and not env.tailer.bulk.active
    assert env.tailer.serving[("counts", 0)].store.bulk_load  # still loading, now record by record


def test_a_chunk_that_cannot_be_loaded_sends_its_replica_on_record_by_record(env, monkeypatch):
    env = env()
    host(env, 0, 1)
    [reader] = env.readers
    reader.chunk(0, {b"a": b"1"}, next_offset=3)
    env.tailer.step()
    rep0 = env.tailer.serving[("counts", 0)]
    monkeypatch.setattr(rep0, "load", lambda *a: (_ for _ in ()).throw(RuntimeError("a bug")))
    reader.chunk(0, {b"b": b"2"}, next_offset=6)
    env.tailer.step()
    assert reader.dropped == [0] and env.consumer.assigned == {(SPEC.topic, 0): 3}  # its checkpoint, nothing lost
    reader.chunk(1, {b"c": b"3"}, next_offset=2, last=True)
    env.tailer.step()
    assert env.tailer.serving[("counts", 1)].lag.applied == 2


def test_a_replica_whose_disk_is_full_fails_and_its_partition_is_no_longer_read(env, monkeypatch):
    env = env()
    host(env, 0, 1)
    [reader] = env.readers
    rep0 = env.tailer.serving[("counts", 0)]
    monkeypatch.setattr(rep0.store, "ingest", lambda *a: (_ for _ in ()).throw(DiskFull("no space left", path="x")))
    reader.chunk(0, {b"a": b"1"}, next_offset=3)
    env.tailer.step()
    assert rep0.state is ReplicaState.FAILED and reader.dropped == [0] and not reader.closed


def test_a_replica_moved_away_leaves_its_restore_and_the_last_one_closes_the_reader(env):
    env = env(removed_replica_grace_ms=60_000)
    host(env, 0, 1)
    [reader] = env.readers
    # Written before it left, rows and positions: deleted when they come.
    reader.chunk(0, {b"a": b"1"}, next_offset=3, last=True, positions={b"a": b"[2]"})
    host(env, 1)
    assert reader.dropped == [0] and not reader.closed
    reader.chunk(1, {b"b": b"2"}, next_offset=4)
    env.tailer.step()
    assert ("counts", 0) not in env.tailer.serving and env.tailer.serving[("counts", 1)].lag.applied == 4
    assert not list(replica_path(env.root, "counts", 0).glob("load-*.sst"))
    assert env.consumer.assigned == {}
    host(env)
    assert reader.closed and not env.tailer.bulk.active


def test_table_files_never_ingested_are_dropped_when_the_store_opens(tmp_path):
    path = tmp_path / "counts" / "0"
    path.mkdir(parents=True)
    (path / "load-17.sst").write_bytes(b"half a file")
    store = ReplicaStore.open(path)
    try:
        assert not list(path.glob("load-*.sst")) and store.applied_offset == 0
    finally:
        store.close()


def test_the_fake_reader_keeps_to_the_extensions_types():
    # The extension's stub (native/bulkload/freshroute_bulkload.pyi) is what the store node calls: the fake offers
    # the same methods, and its chunks the same fields.
    import ast
    import inspect

    stub = ast.parse((Path(__file__).resolve().parents[2] / "native/bulkload/freshroute_bulkload.pyi").read_text())
    classes = {c.name: c for c in stub.body if isinstance(c, ast.ClassDef)}
    methods = {f.name for f in classes["ChangelogReader"].body if isinstance(f, ast.FunctionDef)} - {"__init__"}
    assert methods <= {name for name, _ in inspect.getmembers(FakeReader, inspect.isfunction)}
    fields = {a.target.id for a in classes["Chunk"].body if isinstance(a, ast.AnnAssign)}
    reader = FakeReader(lambda: 0, {}, "t", [(0, 0, "/nonexistent")], "string", "json")
    reader.chunk(0, {}, 5)
    assert fields == set(vars(reader.next_chunk(0.0)))


def test_the_extension_keeps_to_its_types():
    import ast

    import freshroute_bulkload

    stub = ast.parse((Path(__file__).resolve().parents[2] / "native/bulkload/freshroute_bulkload.pyi").read_text())
    for node in (n for n in stub.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))):
        assert hasattr(freshroute_bulkload, node.name), node.name
        if isinstance(node, ast.ClassDef):
            members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} | \
                      {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
            missing = {m for m in members - {"__init__"} if not hasattr(getattr(freshroute_bulkload, node.name), m)}
            assert not missing, (node.name, missing)

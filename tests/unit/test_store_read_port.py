"""Bounded reads as the store node answers them on its read port, called in-process on real replica stores; its gRPC Status."""

from __future__ import annotations

import asyncio
from types import MappingProxyType, SimpleNamespace

import pytest

from freshroute.bound import Bound
from freshroute.metadata.roles import Role
from freshroute.metadata.tables import TableSpec
from proto import store_pb2
from store_node.replica import Replica
from store_node.read_port import ReadPort
from store_node.replica_store import ReplicaStore
from store_node.service import StoreNodeService

SPEC = TableSpec("users", "users-changelog", 4, "id")


class Clock:
    now = 5_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def world(tmp_path):
    clock = Clock()
    store = ReplicaStore.open(tmp_path / "users" / "1")
    store.apply([(b"alice", b'{"age":31}'), (b"bob", b'{"age":40}')], 10)
    rep = Replica(SPEC, 1, Role.STANDBY, store, clock, evidence_window_ms=1000, caught_up_threshold=0)
    node = SimpleNamespace(node_id="n7", serving=MappingProxyType({("users", 1): rep}), draining=False)
    yield SimpleNamespace(clock=clock, rep=rep, node=node, reads=ReadPort(node, clock),
                          service=StoreNodeService(node, clock), store=store)
    rep.close()


def get(world, key: bytes, partition=1, table="users", **bound) -> store_pb2.KeyResult:
    """A key read as the node answers it: by the Python reader and, where it answers the read, by the compiled key reads
    (the compiled front's, tried first as it does), byte for byte the same."""
    read = store_pb2.KeyRead(id=99, table=table, partition=partition, key=key, bound=store_pb2.ReadBound(**bound))
    batch = store_pb2.ReadBatch(reads=[read])
    compiled = compiled_answer(world.reads, batch)
    answer = world.reads.reader().results(batch)
    assert compiled is None or compiled == answer.SerializeToString()
    return answer.results[0]


def compiled_answer(reads: ReadPort, batch: store_pb2.ReadBatch) -> bytes | None:
    """The compiled key reads' answer to ``batch`` (None: left to the Python reader), where the path is built."""
    try:
        from freshroute_dataplane import KeyReads
    except ImportError:
        return None
    return KeyReads(reads.node, reads.clock).answer(batch.SerializeToString())


def caught_up(world, end=10):
    world.rep.lag.observe_end(end, world.clock.now)
    world.rep.check_restored(world.clock.now)


def test_ok_read_carries_the_replica_status(world):
    caught_up(world)
    res = get(world, b"alice", max_lag=0, max_staleness_ms=0)
    assert res.id == 99 and res.status == store_pb2.OK and res.value == b'{"age":31}'
    r = res.replica
    assert (r.node, r.role, r.state) == ("n7", store_pb2.STANDBY, store_pb2.SERVING_STANDBY)
    assert (r.applied_offset, r.end_offset, r.lag_offsets, r.staleness_ms) == (10, 10, 0, 0)


def test_each_read_reports_the_status_as_of_that_read(world):
    # The status message is kept between reads while nothing changes: every change must show.
    world.rep.lag.observe_end(25, world.clock.now)
    first = get(world, b"alice").replica
    assert (first.applied_offset, first.lag_offsets, first.state) == (10, 15, store_pb2.RESTORING)
    world.clock.now += 700
    assert get(world, b"alice").replica.staleness_ms == first.staleness_ms + 700
    world.rep.store.apply([(b"carol", b'{"age":22}')], 25)
    world.rep.lag.advance(25)
    world.rep.check_restored(world.clock.now)
    now = get(world, b"carol")
    assert now.value == b'{"age":22}'
    assert (now.replica.applied_offset, now.replica.lag_offsets, now.replica.staleness_ms) == (25, 0, 0)
    assert now.replica.state == store_pb2.SERVING_STANDBY
    world.rep.role = Role.ACTIVE
    assert get(world, b"carol").replica.role == store_pb2.ACTIVE


def test_missing_key_is_not_found_with_status(world):
    caught_up(world)
    res = get(world, b"carol")
    assert res.status == store_pb2.NOT_FOUND and res.replica.applied_offset == 10 and not res.value


def test_not_hosted(world):
    assert get(world, b"alice", partition=2).status == store_pb2.NOT_HOSTED
    assert get(world, b"alice", table="other").status == store_pb2.NOT_HOSTED


def test_lagging_replica_refuses_a_tight_bound(world):
    world.rep.lag.observe_end(25, world.clock.now)  # 15 offsets behind
    res = get(world, b"alice", max_lag=0)
    assert res.status == store_pb2.TOO_STALE and not res.value
    assert res.replica.lag_offsets == 15 and "15 offsets behind" in res.message
    assert get(world, b"alice", max_lag=14).status == store_pb2.TOO_STALE
    assert get(world, b"alice", max_lag=15).status == store_pb2.OK
    assert get(world, b"alice").status == store_pb2.OK  # no bound: answered, honestly labelled
    assert get(world, b"alice").replica.state == store_pb2.RESTORING


def test_unknown_end_offset_fails_any_lag_bound(world):
    assert get(world, b"alice", max_lag=1_000_000).status == store_pb2.TOO_STALE
    assert get(world, b"alice").status == store_pb2.OK


def test_staleness_bound(world):
    caught_up(world)
    world.clock.now += 5000  # no evidence since: 5 s stale
    res = get(world, b"alice", max_staleness_ms=4999)
    assert res.status == store_pb2.TOO_STALE and res.replica.staleness_ms == 5000
    assert get(world, b"alice", max_staleness_ms=5000).status == store_pb2.OK


@pytest.mark.parametrize("field", [f for f in store_pb2.ReadBound.DESCRIPTOR.fields
                                   if f.name not in ("min_offset", "after_input", "after_offset")])
def test_every_limit_a_read_carries_reaches_the_one_judgement(world, field, monkeypatch):
    """Whatever limits the read port's message has, now or later, the node judges each with Bound.refusal: its fast
    path (a position reached) lists no field of the bound."""
    caught_up(world)
    judged = []
    monkeypatch.setattr(Bound, "refusal", lambda bound, *figures: judged.append(bound) or "judged")
    read = store_pb2.KeyRead(id=1, table="users", partition=1, key=b"alice",
                             bound=store_pb2.ReadBound(**{field.name: 0}))
    res = world.reads.reader().results(store_pb2.ReadBatch(reads=[read])).results[0]
    assert (res.status, res.message) == (store_pb2.TOO_STALE, "judged")
    assert getattr(judged[0], field.name) == 0
    monkeypatch.undo()
    assert get(world, b"alice", min_offset=10).status == store_pb2.OK


@pytest.mark.parametrize("field", [f for f in store_pb2.ReadBound.DESCRIPTOR.fields
                                   if f.name not in ("min_offset", "after_input", "after_offset")])
def test_every_limit_a_read_carries_is_judged_by_the_compiled_key_reads_too(world, field):
    """A limit the compiled path did not know would be a limit it ignored: each refuses there as it does here."""
    pytest.importorskip("freshroute_dataplane", reason="the compiled path is built by ./dev (native/dataplane)")
    world.rep.lag.observe_end(25, world.clock.now)  # 15 offsets behind, never caught up: every limit of 0 refuses
    world.clock.now += 1
    res = get(world, b"alice", **{field.name: 0})
    assert res.status == store_pb2.TOO_STALE
    read = store_pb2.KeyRead(id=1, table="users", partition=1, key=b"alice",
                             bound=store_pb2.ReadBound(**{field.name: 0}))
    assert compiled_answer(world.reads, store_pb2.ReadBatch(reads=[read])) is None


def test_position_bound(world):
    caught_up(world)
    assert get(world, b"alice", min_offset=10).status == store_pb2.OK
    res = get(world, b"alice", min_offset=11)
    assert res.status == store_pb2.TOO_STALE and "position 11" in res.message


def test_replica_being_rebuilt_refuses(world):
    world.rep.store = None
    assert get(world, b"alice").status == store_pb2.TOO_STALE
    world.rep.store = world.store


def test_closed_store_under_a_read_is_not_an_error(world):
    caught_up(world)
    world.store.close()  # closed by the tailer while the reader held it
    world.rep.store = None
    res = get(world, b"alice")
    assert res.status == store_pb2.TOO_STALE


def test_batch_get_answers_each_read(world):
    caught_up(world)
    batch = store_pb2.ReadBatch(reads=[
        store_pb2.KeyRead(id=1, table="users", partition=1, key=b"alice"),
        store_pb2.KeyRead(id=2, table="users", partition=1, key=b"nobody"),
        store_pb2.KeyRead(id=3, table="users", partition=3, key=b"bob"),
        store_pb2.KeyRead(id=4, table="users", partition=1, key=b"bob", bound=store_pb2.ReadBound(min_offset=99)),
    ])
    res = world.reads.reader().results(batch)
    assert [(r.id, r.status) for r in res.results] == [
        (1, store_pb2.OK), (2, store_pb2.NOT_FOUND), (3, store_pb2.NOT_HOSTED), (4, store_pb2.TOO_STALE)]


def group(world, keys, partition=1, **bound) -> store_pb2.GroupResult:
    read = store_pb2.GroupRead(id=7, table="users", partition=partition, keys=keys, bound=store_pb2.ReadBound(**bound))
    return world.reads.reader().results(store_pb2.ReadBatch(groups=[read])).groups[0]


def test_a_group_answers_every_key_in_order_with_one_status(world):
    caught_up(world)
    res = group(world, [b"bob", b"nobody", b"alice", b"bob"], max_lag=0)
    assert (res.id, res.status) == (7, store_pb2.OK)
    # Empty marks a key the table does not hold: a stored value is JSON, never empty.
    assert list(res.values) == [b'{"age":40}', b"", b'{"age":31}', b'{"age":40}']
    assert (res.replica.node, res.replica.applied_offset, res.replica.lag_offsets) == ("n7", 10, 0)
    assert list(group(world, []).values) == [] and group(world, []).status == store_pb2.OK


def test_a_group_is_refused_as_a_whole(world):
    caught_up(world, end=15)
    stale = group(world, [b"alice", b"bob"], max_lag=2)
    assert stale.status == store_pb2.TOO_STALE and list(stale.values) == []
    assert stale.replica.lag_offsets == 5 and "behind" in stale.message
    assert group(world, [b"alice"], min_offset=11).status == store_pb2.TOO_STALE
    hosted = group(world, [b"alice"], partition=3)
    assert hosted.status == store_pb2.NOT_HOSTED and not hosted.HasField("replica")
    world.rep.store = None
    assert group(world, [b"alice"]).status == store_pb2.TOO_STALE


def test_a_group_the_store_fails_is_an_error_and_the_replica_is_rebuilt(world):
    caught_up(world)
    world.store.close()  # the replica's own store fails under the read
    res = group(world, [b"alice", b"bob"])
    assert (res.status, res.message, list(res.values)) == (store_pb2.ERROR, "replica store failed a read", [])
    assert "is closed" in world.rep.corrupt_reason


def test_a_range_is_ordered_limited_and_bounded(world):
    n = 1_031
    world.rep.apply([(f"u{i:05d}".encode(), b"{}") for i in range(n)], 11, 0)
    caught_up(world, 11)
    [everything, limited, ranged] = ranges(
        world, store_pb2.RangeRead(id=1, table="users", partition=1, limit=5_000),
        store_pb2.RangeRead(id=2, table="users", partition=1, start=b"u", end=b"v", limit=515),
        store_pb2.RangeRead(id=3, table="users", partition=1, start=b"u00005", end=b"u00008", limit=10))
    keys = [e.key for e in everything.entries]
    assert keys == sorted(keys) and len(keys) == n + 2 and everything.replica.applied_offset == 11
    assert [e.key for e in limited.entries] == [f"u{i:05d}".encode() for i in range(515)]
    assert [e.key for e in ranged.entries] == [b"u00005", b"u00006", b"u00007"]


def test_a_range_is_refused_out_of_bound_and_where_not_hosted(world):
    world.rep.lag.observe_end(30, world.clock.now)
    [stale, empty, other] = ranges(
        world, store_pb2.RangeRead(id=1, table="users", partition=1, limit=10, bound=store_pb2.ReadBound(max_lag=5)),
        store_pb2.RangeRead(id=2, table="users", partition=1, start=b"zzz", limit=10),
        store_pb2.RangeRead(id=3, table="users", partition=0, limit=10))
    assert stale.status == store_pb2.TOO_STALE and not stale.entries
    assert empty.status == store_pb2.OK and not empty.entries
    assert other.status == store_pb2.NOT_HOSTED


def test_status_lists_replicas_with_counters(world):
    caught_up(world)
    st = asyncio.run(world.service.Status(store_pb2.StatusRequest(), None))
    assert st.node == "n7" and list(st.tables) == ["users/1"]
    assert st.replicas[0].applied_offset == 10 and st.counters[0].resumed_from == 10


# the read port: the same answers as frames on TCP


@pytest.fixture(params=["compiled", "python"])
def front(request):
    """Each front of the read port (store_node/read_port_front.py)."""
    return request.param


async def _read_port_exchange(reads, data: bytes, expect: int, front: str) -> tuple[list[bytes], bool]:
    """Send raw bytes to a read port; up to ``expect`` frames answered, and whether the node closed the connection."""
    from freshroute.wire import FrameReader
    from store_node.read_port_front import start_read_port

    door = await start_read_port(reads, "127.0.0.1", 0, front=front)
    assert door.front == front
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", door.port)
        writer.write(data)
        await writer.drain()
        frames, answers, closed = FrameReader(), [], False
        while len(answers) < expect:
            data = await asyncio.wait_for(reader.read(65536), 5)
            if not data:
                closed = True
                break
            answers.extend(frames.feed(data))
        writer.close()
        return answers, closed
    finally:
        door.close()


def test_read_port_answers_each_frame_in_order(world, front):
    from freshroute.wire import frame

    caught_up(world)
    batches = [store_pb2.ReadBatch(reads=[store_pb2.KeyRead(id=1, table="users", partition=1, key=b"alice"),
                                          store_pb2.KeyRead(id=2, table="users", partition=1, key=b"carol")],
                                   groups=[store_pb2.GroupRead(id=4, table="users", partition=1,
                                                               keys=[b"carol", b"bob"])]),
               store_pb2.ReadBatch(reads=[store_pb2.KeyRead(id=3, table="users", partition=2, key=b"bob")])]
    # Both frames in one write: the node answers each, in order.
    data = b"".join(frame(b.SerializeToString()) for b in batches)
    answers, closed = asyncio.run(_read_port_exchange(world.reads, data, expect=2, front=front))
    assert not closed and len(answers) == 2
    results = [r for a in answers for r in store_pb2.ResultBatch.FromString(a).results]
    assert [(r.id, r.status) for r in results] == [(1, store_pb2.OK), (2, store_pb2.NOT_FOUND),
                                                    (3, store_pb2.NOT_HOSTED)]
    assert results[0].value == b'{"age":31}' and results[0].replica.applied_offset == 10
    [answered] = store_pb2.ResultBatch.FromString(answers[0]).groups
    assert (answered.id, answered.status, list(answered.values)) == (4, store_pb2.OK, [b"", b'{"age":40}'])


def test_read_port_drops_a_peer_that_does_not_send_frames(world, front):
    answers, closed = asyncio.run(_read_port_exchange(world.reads, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", expect=1,
                                                           front=front))
    assert answers == [] and closed


def test_read_port_drops_a_peer_whose_frame_is_not_a_read_batch(world, caplog, front):
    from freshroute.wire import frame

    with caplog.at_level("WARNING", logger="store_node.read_port"):
        answers, closed = asyncio.run(_read_port_exchange(world.reads, frame(b"\xff\xff\xff"), expect=1, front=front))
    assert answers == [] and closed
    assert any("read port: dropping" in r.getMessage() for r in caplog.records)


def ranges(world, *reads: store_pb2.RangeRead) -> list[store_pb2.RangeResult]:
    return list(world.reads.reader().results(store_pb2.ReadBatch(ranges=list(reads))).ranges)


def test_a_window_range_returns_live_windows_in_range_with_the_partitions_watermark(world):
    from freshroute.windows import WATERMARK_KEY, watermark_value, window_key

    world.store.apply([(window_key(b"k", s), b'{"n":%d}' % s) for s in (0, 10, 20, 30)]
                      + [(window_key(b"kk", 10), b'{"n":0}'), (WATERMARK_KEY, watermark_value(35))], 11)
    caught_up(world, 11)
    lo, hi = window_key(b"k", 0), window_key(b"k", 40)
    # life 20: windows starting at or before 35 - 20 have expired.
    [live, unbounded, refused] = ranges(
        world, store_pb2.RangeRead(id=1, table="users", partition=1, start=lo, end=hi, limit=10,
                                   window=store_pb2.WindowFilter(from_ms=0, to_ms=30, life_ms=20)),
        store_pb2.RangeRead(id=2, table="users", partition=1, start=lo, end=hi, limit=2),
        store_pb2.RangeRead(id=3, table="users", partition=1, start=lo, end=hi, limit=2,
                            bound=store_pb2.ReadBound(max_lag=0, min_offset=12)))
    assert live.id == 1 and live.status == store_pb2.OK and live.watermark_ms == 35
    assert [(e.key, e.value) for e in live.entries] == [(window_key(b"k", 20), b'{"n":20}')]
    assert [e.key for e in unbounded.entries] == [window_key(b"k", 0), window_key(b"k", 10)]  # no filter, no watermark
    assert unbounded.watermark_ms == 0
    assert refused.status == store_pb2.TOO_STALE and not refused.entries and "position 12" in refused.message


def test_a_window_range_before_any_watermark_says_so(world):
    from freshroute.windows import window_key

    world.store.apply([(window_key(b"k", 0), b'{"n":1}')], 11)
    caught_up(world, 11)
    [r] = ranges(world, store_pb2.RangeRead(id=1, table="users", partition=1, start=window_key(b"k", 0),
                                            end=window_key(b"k", 10), limit=5,
                                            window=store_pb2.WindowFilter(from_ms=0, to_ms=10, life_ms=5)))
    assert r.status == store_pb2.OK and r.watermark_ms == -1 and len(r.entries) == 1


def test_a_replica_loading_in_bulk_is_not_read_until_it_has_caught_up(tmp_path):
    # A bulk load's vector memtable would sort a copy of itself for every get: such a store is not read.
    clock = Clock()
    store = ReplicaStore.open(tmp_path / "users" / "1", bulk_load=True)
    store.apply([(b"alice", b'{"age":31}')], 10)
    rep = Replica(SPEC, 1, Role.ACTIVE, store, clock, evidence_window_ms=1000, caught_up_threshold=0)
    world = SimpleNamespace(reads=ReadPort(SimpleNamespace(
        node_id="n7", serving=MappingProxyType({("users", 1): rep}), draining=False), clock))
    try:
        res = get(world, b"alice")
        assert res.status == store_pb2.TOO_STALE and not res.value
        assert "loading its changelog into an empty store" in res.message
        rep.lag.observe_end(10, clock.now)
        assert rep.check_restored(clock.now)  # a small load is written at once, and the store reopened for reads
        assert not rep.store.bulk_load and rep.store.applied_offset == 10
        res = get(world, b"alice")
        assert res.status == store_pb2.OK and res.value == b'{"age":31}'
        assert res.replica.state == store_pb2.SERVING_ACTIVE
    finally:
        rep.close()


def test_a_failed_replica_refuses_reads_with_its_reason_and_reports_it(world):
    caught_up(world)
    world.rep.mark_failed("no space left on the device of /data/users/1 (while write)")
    res = get(world, b"alice")
    assert res.status == store_pb2.TOO_STALE and not res.value
    assert res.message == "replica failed: no space left on the device of /data/users/1 (while write)"
    assert res.replica.state == store_pb2.FAILED and res.replica.failure.startswith("no space left")


def test_a_read_that_a_commit_overtakes_reports_the_position_of_the_rows_it_returns(world):
    caught_up(world)
    store, rep = world.store, world.rep

    class Overtaken:
        """The store as a commit lands between the status and the read: rows newer than the status said."""

        bulk_load = False

        def __init__(self):
            self.reads = 0

        def apply(self, *args):
            store.apply(*args)

        def get(self, key):
            self.reads += 1
            if self.reads == 1:
                rep.commit([(b"alice", b'{"age":32}')], 11, 1, 0)
            return store.get(key)

    rep.store = Overtaken()
    try:
        res = get(world, b"alice")
    finally:
        rep.store = store
    assert res.value == b'{"age":32}' and res.replica.applied_offset == 11
    assert rep.writes == 2


def test_the_compiled_key_reads_answer_plain_reads_and_leave_every_other_batch_to_the_python_reader(world):
    pytest.importorskip("freshroute_dataplane", reason="the compiled path is built by ./dev (native/dataplane)")

    def answered(*reads: store_pb2.KeyRead, **batch) -> bool:
        whole = store_pb2.ReadBatch(reads=list(reads), **batch)
        compiled = compiled_answer(world.reads, whole)
        assert compiled is None or compiled == world.reads.reader().results(whole).SerializeToString()
        return compiled is not None

    def key(k=b"alice", partition=1, **fields) -> store_pb2.KeyRead:
        return store_pb2.KeyRead(id=7, table="users", partition=partition, key=k, **fields)

    world.rep.lag.observe_end(25, world.clock.now)
    assert answered(key())  # restoring, no bound: answered, labelled so
    caught_up(world, 10)
    world.rep.role = Role.ACTIVE
    assert answered(key(), key(b"carol"), key(bound=store_pb2.ReadBound(max_lag=0, max_staleness_ms=0, min_offset=10)))
    assert answered(key(bound=store_pb2.ReadBound(after_offset=5)))  # no events named: nothing to check
    assert not answered(key(), key(partition=2))  # one read the Python reader refuses: the whole batch is its
    assert not answered(key(bound=store_pb2.ReadBound(min_offset=11)))
    assert answered(key(as_of_ms=5))  # a key with no version then: NOT_FOUND
    assert not answered(key(bound=store_pb2.ReadBound(after_input={0: 3})))
    assert not answered(key(), groups=[store_pb2.GroupRead(id=1, table="users", partition=1, keys=[b"bob"])])
    assert not answered(ranges=[store_pb2.RangeRead(id=1, table="users", partition=1, limit=1)])
    world.rep.writes += 1  # a commit under way
    assert not answered(key())
    world.rep.writes += 1
    world.rep.store = None
    assert not answered(key())
    world.rep.store = world.store
    world.rep.mark_failed("no space left on the device")
    assert not answered(key())
    assert compiled_answer(world.reads, store_pb2.ReadBatch()) is None


def test_as_of_reads_are_answered_by_either_reader_alike(world):
    pytest.importorskip("freshroute_dataplane", reason="the compiled path is built by ./dev (native/dataplane)")
    versions = [(b"k", 100, b'{"v":1}'), (b"k", 200, None), (b"k", 300, b'{"v":3}')]
    rows, writes = world.store.history.changes(versions)
    world.store.apply(rows, 10, history_rows=writes)
    caught_up(world, 10)
    got = {}
    for at in (50, 100, 150, 250, 300, 10_000):
        read = store_pb2.KeyRead(id=at, table="users", partition=1, key=b"k", as_of_ms=at)
        batch = store_pb2.ReadBatch(reads=[read])
        compiled = compiled_answer(world.reads, batch)
        answer = world.reads.reader().results(batch)
        assert compiled == answer.SerializeToString()
        r = answer.results[0]
        got[at] = (r.status, r.value, r.valid_from_ms if r.HasField("valid_from_ms") else None,
                   r.valid_to_ms if r.HasField("valid_to_ms") else None)
    NF, OK = store_pb2.NOT_FOUND, store_pb2.OK
    assert got == {50: (NF, b"", None, None), 100: (OK, b'{"v":1}', 100, 200), 150: (OK, b'{"v":1}', 100, 200),
                   250: (NF, b"", 200, 300), 300: (OK, b'{"v":3}', 300, None), 10_000: (OK, b'{"v":3}', 300, None)}

"""The client's direct key reads on the compiled path (native/dataplane's DirectReads), driven by hand: a fake
transport per read port collects the frames it writes, the test answers them, and every answer is held to the one the
client's Python path builds from the same reply."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest

from freshroute.bound import Bound
from freshroute.client.lookup import Lookup
from freshroute.keys import partition_for
from freshroute.lag import NEVER_CAUGHT_UP_MS, now_ms
from freshroute.metadata.progress import InputLag
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.table_versions import TableVersion, VersionedTable, VersionState
from freshroute.metadata.tables import TableSpec
from freshroute.routing.answers import lookup_result
from freshroute.routing.compiled_view import policy_doc, snapshot_doc
from freshroute.routing.policy import RoutingPolicy
from freshroute.routing.selection import Candidate
from freshroute.routing.snapshot import NodeView, ReplicaView, Snapshot
from freshroute.wire import results
from proto import store_pb2

dataplane = pytest.importorskip("freshroute_dataplane", reason="the compiled path is built by ./dev (native/dataplane)")

SECRET = "s3cret"
ACTIVE_AT, STANDBY_AT = "127.0.0.1:7101", "127.0.0.1:7102"
# No hedge unless a test asks for one: a read's timer is then its attempt's deadline.
POLICY = RoutingPolicy(hedge=False)
# DirectReads.get's flags (native/dataplane/src/direct.rs).
SERVED, FLUSH, TIMER = 1, 2, 4


class FakeTransport:
    """A read port's transport as DirectReads uses it: what it writes, decoded, and whether it was aborted."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.aborted = 0

    def write(self, data: bytes) -> None:
        self.frames.append(bytes(data))

    def abort(self) -> None:
        self.aborted += 1

    def batches(self) -> list[store_pb2.ReadBatch]:
        out = []
        for data in self.frames:
            size = int.from_bytes(data[:4], "big")
            assert size == len(data) - 4, "one whole frame per write"
            out.append(store_pb2.ReadBatch.FromString(data[4:]))
        return out


def frame(msg: Any) -> bytes:
    payload = msg.SerializeToString()
    return len(payload).to_bytes(4, "big") + payload


def status(node: str = "standby", role: int = store_pb2.STANDBY, state: int = store_pb2.SERVING_STANDBY,
           applied: int = 10, end: int | None = 10, staleness_ms: int = 3) -> store_pb2.ReplicaStatus:
    msg = store_pb2.ReplicaStatus(node=node, role=role, state=state, applied_offset=applied, staleness_ms=staleness_ms)
    if end is not None:
        msg.end_offset, msg.lag_offsets = end, end - applied
    return msg


def answer(*reads: store_pb2.KeyRead, code: int = store_pb2.OK, value: bytes = b'{"n":1}',
           replica: store_pb2.ReplicaStatus | None = None) -> store_pb2.ResultBatch:
    rep = replica if replica is not None else status()
    return store_pb2.ResultBatch(results=[store_pb2.KeyResult(id=r.id, status=code,
                                                              value=value if code == store_pb2.OK else b"",
                                                              replica=rep) for r in reads])


def views(table: str, partitions: int, now: int, active_applied: int = 5, end: int = 10) -> list[ReplicaView]:
    """Every partition's active (behind its changelog's end unless told otherwise) and caught-up standby."""
    out = []
    for p in range(partitions):
        out.append(ReplicaView("active", "active:7000", table, p, Role.ACTIVE, ReplicaState.ACTIVE, active_applied,
                               end, 0, now, True))
        out.append(ReplicaView("standby", "standby:7000", table, p, Role.STANDBY, ReplicaState.STANDBY, end, end, 0,
                               now, True))
    return out


def snapshot(tables: list[TableSpec], replicas: list[ReplicaView], now: int, **kw: Any) -> Snapshot:
    by_tp: dict[tuple[str, int], tuple[ReplicaView, ...]] = {}
    for v in replicas:
        by_tp[(v.table, v.partition)] = (*by_tp.get((v.table, v.partition), ()), v)
    nodes = {"active": NodeView("active", "active:7000", True, read_address=ACTIVE_AT),
             "standby": NodeView("standby", "standby:7000", True, read_address=STANDBY_AT)}
    return Snapshot({t.name: t for t in tables}, by_tp, nodes, None, now, True, **kw)


class Reads:
    """One DirectReads over a view of table ``t`` (and whatever else a test gives), with both read ports reached."""

    def __init__(self, tables: list[TableSpec] | None = None, replicas: list[ReplicaView] | None = None,
                 policy: RoutingPolicy = POLICY, connect: tuple[str, ...] = (ACTIVE_AT, STANDBY_AT),
                 **snap: Any) -> None:
        self.now = now_ms()  # the engine judges a view's age by the wall clock
        self.tables = tables if tables is not None else [TableSpec("t", "t-changelog", 4, "k", default_max_lag=7)]
        replicas = replicas if replicas is not None else [v for t in self.tables
                                                          for v in views(t.name, t.partitions, self.now)]
        self.snap = snapshot(self.tables, replicas, self.now, **snap)
        self.engine = dataplane.DirectReads(orjson.dumps(policy_doc(policy, SECRET)).decode(), Lookup)
        self.engine.update(snapshot_doc(self.snap, policy))
        self.ports = {address: FakeTransport() for address in (ACTIVE_AT, STANDBY_AT)}
        for address in connect:
            self.engine.connected(address, self.ports[address])
        self.loop = asyncio.get_running_loop()

    def get(self, key: str, table: str = "t", physical: str | None = None, max_lag: int | None = None,
            max_staleness_ms: int | None = None, position: tuple[str, dict[int, int]] | None = None,
            now: float | None = None) -> tuple[int, asyncio.Future[Any]]:
        fut = self.loop.create_future()
        flags = self.engine.get(table, physical or table, key, max_lag, max_staleness_ms, position, fut,
                                self.loop.time() if now is None else now)
        return flags, fut

    def reads(self, address: str = STANDBY_AT) -> list[store_pb2.KeyRead]:
        """Every read written to ``address`` so far, in order."""
        return [r for b in self.ports[address].batches() for r in b.reads]

    def reply(self, batch: store_pb2.ResultBatch, address: str = STANDBY_AT) -> int:
        return self.engine.received(address, frame(batch), self.loop.time())


def run(test: Callable[[], Any]) -> Any:
    return asyncio.run(test())


# ---- where a read goes, and what it carries --------------------------------------------------------------------

def test_a_read_goes_to_the_freshest_replica_with_its_partition_key_and_the_tables_default_bound():
    async def main() -> None:
        r = Reads()
        flags, fut = r.get("sensor-1")
        # Written at once (the connection had no batch unanswered): no flush asked for, the deadline's timer is.
        assert flags == SERVED | TIMER
        assert r.ports[ACTIVE_AT].frames == [], "the active is 5 offsets behind, the standby caught up"
        [batch] = r.ports[STANDBY_AT].batches()
        [read] = batch.reads
        assert (read.table, read.key, read.partition) == ("t", b"sensor-1", partition_for(b"sensor-1", 4))
        assert read.HasField("bound") and read.bound.max_lag == 7 and not read.bound.HasField("max_staleness_ms")
        assert read.bound.min_offset == 0 and not read.HasField("as_of_ms")
        assert batch.cluster_secret == SECRET
        assert not fut.done()
    run(main)


def test_every_keys_partition_is_kafkas_murmur2_partition_as_freshroute_keys_computes_it():
    async def main() -> None:
        r = Reads(tables=[TableSpec("t", "t-changelog", 7, "k")])
        keys = [f"sensor-{i}" for i in range(60)] + ["", "é", "ключ", "🙂 key", "a" * 300]
        for key in keys:
            flags, fut = r.get(key)
            assert flags & SERVED, key
            fut.cancel()  # a read its caller gave up on still leaves: the engine resolves only futures not done
        r.engine.flush()
        got = [(read.key.decode(), read.partition) for read in r.reads()]
        assert got == [(key, partition_for(key.encode(), 7)) for key in keys]
    run(main)


def test_an_explicit_bound_replaces_the_tables_default_and_a_position_of_the_table_gives_its_partitions_offset():
    async def main() -> None:
        r = Reads()
        p = partition_for(b"k", 4)
        r.get("k", max_lag=2, max_staleness_ms=900, position=("t", {p: 9, (p + 1) % 4: 50}))
        [read] = r.reads()
        assert (read.bound.max_lag, read.bound.max_staleness_ms, read.bound.min_offset) == (2, 900, 9)
    run(main)


def test_an_unbounded_read_carries_no_bound():
    async def main() -> None:
        r = Reads(tables=[TableSpec("t", "t-changelog", 4, "k")])
        r.get("k")
        [read] = r.reads()
        assert not read.HasField("bound")
    run(main)


def test_a_table_serving_a_later_version_is_read_as_that_versions_own_table():
    async def main() -> None:
        now = now_ms()
        versions = {n: TableVersion(n, VersionState.SERVING if n == 2 else VersionState.PREVIOUS, f"f{n}", now)
                    for n in (1, 2)}
        tables = [TableSpec("t", "t-changelog", 1, "k"), TableSpec("t-v2", "t-v2-changelog", 2, "k")]
        r = Reads(tables=tables, replicas=views("t-v2", 2, now), versions={"t": VersionedTable("t", 2, versions)})
        assert r.get("k", "t", "t")[0] == 0, "the name of the version asked is not the one served"
        flags, _ = r.get("k", "t", "t-v2")
        assert flags & SERVED
        [read] = r.reads()
        assert (read.table, read.partition) == ("t-v2", partition_for(b"k", 2))
    run(main)


def test_the_cluster_secret_travels_on_each_connections_first_batch_only():
    async def main() -> None:
        # The standby alone: after its connection is lost it is backed off, and still the only replica to read.
        r = Reads(replicas=[v for v in views("t", 4, now_ms()) if v.node == "standby"])
        _, first = r.get("a")
        r.reply(answer(*r.reads()))
        assert first.done() and first.result() is not None
        r.get("b")  # written at once: its connection has no batch unanswered
        r.get("c")
        r.engine.flush()
        assert [b.cluster_secret for b in r.ports[STANDBY_AT].batches()] == [SECRET, "", ""]
        r.engine.lost(STANDBY_AT, None, r.loop.time())
        r.engine.connected(STANDBY_AT, fresh := FakeTransport())
        r.get("d")
        assert [b.cluster_secret for b in fresh.batches()] == [SECRET], "a new connection presents it again"
    run(main)


# ---- reads left to the Python path --------------------------------------------------------------------------

def test_an_unknown_table_is_not_served():
    async def main() -> None:
        r = Reads()
        flags, fut = r.get("k", "nope")
        assert flags == 0 and not fut.done()
        assert r.engine.in_flight() == 0 and r.ports[STANDBY_AT].frames == []
    run(main)


def test_a_version_not_the_one_served_is_not_served():
    async def main() -> None:
        r = Reads()
        assert r.get("k", "t", "t-v2")[0] == 0
        assert r.engine.in_flight() == 0
    run(main)


def test_a_position_of_another_table_is_not_served():
    async def main() -> None:
        r = Reads()
        assert r.get("k", position=("other", {0: 1}))[0] == 0
        assert r.engine.in_flight() == 0 and r.ports[STANDBY_AT].frames == []
    run(main)


def test_a_windowed_or_json_keyed_table_is_not_served():
    async def main() -> None:
        from freshroute.windows import hopping
        tables = [TableSpec("w", "w-changelog", 1, "k", window=hopping("10s", "5s")),
                  TableSpec("j", "j-changelog", 1, "k", key_format="json")]
        r = Reads(tables=tables)
        assert r.get("k", "w")[0] == 0 and r.get('"k"', "j")[0] == 0
    run(main)


def test_a_read_whose_freshest_replica_has_no_connection_is_not_served():
    async def main() -> None:
        r = Reads(connect=(ACTIVE_AT,))
        assert not r.engine.reaches(STANDBY_AT)
        flags, fut = r.get("k")
        assert flags == 0 and not fut.done()
        assert r.ports[ACTIVE_AT].frames == [] and r.engine.in_flight() == 0
    run(main)


def test_a_read_no_replica_the_view_trusts_can_answer_within_its_bound_is_not_served():
    async def main() -> None:
        r = Reads(replicas=[v for v in views("t", 4, now_ms(), active_applied=5, end=10) if v.node == "active"])
        assert r.get("k", max_lag=1)[0] == 0, "the only replica is 5 behind and its view is fresh"
        assert r.get("k")[0] & SERVED, "within the table's default of 7"
    run(main)


# ---- answers -----------------------------------------------------------------------------------------------

def python_answer(r: Reads, read: store_pb2.KeyRead, batch: store_pb2.ResultBatch, node: str) -> Lookup:
    """What the client's Python path makes of the same reply (RoutingCore.get → Lookup.of)."""
    [(_, result)] = list(results(batch))
    view = next(v for v in r.snap.replicas[(read.table, read.partition)] if v.node == node)
    cand = Candidate(view, None if view.end is None else view.end - view.applied, view.staleness_ms, view.applied)
    spec = r.snap.tables[read.table]
    return Lookup.of(lookup_result(read.table, read.key.decode(), read.partition, cand, result),
                     r.snap.input_lag_at(read.table, now_ms()), spec.value_format)


REPLIES = {
    "caught up": status(),
    "behind": status(applied=4, end=10, staleness_ms=1200),
    "end unknown": status(end=None, staleness_ms=7),
    "never caught up": status(applied=0, end=10, staleness_ms=NEVER_CAUGHT_UP_MS + 5),
    "no node named": status(node=""),
    "role unset, serving active": status(node="active", role=store_pb2.ROLE_UNSPECIFIED,
                                         state=store_pb2.SERVING_ACTIVE),
    "role unset, restoring": status(role=store_pb2.ROLE_UNSPECIFIED, state=store_pb2.RESTORING),
    "negative lag and staleness": status(staleness_ms=-4),
}


@pytest.mark.parametrize("reply", REPLIES, ids=list(REPLIES))
@pytest.mark.parametrize("code", [store_pb2.OK, store_pb2.NOT_FOUND], ids=["found", "not found"])
def test_an_answer_is_the_lookup_the_python_path_builds_from_the_same_reply(reply, code):
    async def main() -> None:
        r = Reads()
        _, fut = r.get("sensor-9")
        [read] = r.reads()
        batch = answer(read, code=code, value=b'{"count":9}', replica=REPLIES[reply])
        assert r.reply(batch) == 0
        got = fut.result()
        assert type(got) is Lookup
        want = python_answer(r, read, batch, "standby")
        assert got._asdict() == want._asdict()
        assert got.found is (code == store_pb2.OK)
        assert got.raw_value == (b'{"count":9}' if code == store_pb2.OK else None)
        assert r.engine.in_flight() == 0
    run(main)


def test_an_answers_labels_are_the_replicas_own_report():
    async def main() -> None:
        r = Reads()
        _, fut = r.get("sensor-9")
        r.reply(answer(*r.reads(), replica=status(applied=8, end=10, staleness_ms=250)))
        assert fut.result() == Lookup("t", "sensor-9", True, b'{"n":1}', partition_for(b"sensor-9", 4), "standby",
                                      "standby", 2, 250, 8, 0, 0, "json")
        assert fut.result().value == {"n": 1}
        _, fut = r.get("sensor-9")
        r.reply(answer(r.reads()[-1], code=store_pb2.NOT_FOUND,
                       replica=status(end=None, staleness_ms=NEVER_CAUGHT_UP_MS)))
        got = fut.result()
        assert (got.found, got.raw_value, got.value, got.lag_offsets, got.lag_ms) == (False, None, None, None, None)
    run(main)


def test_an_answer_carries_the_tables_input_lag_and_value_format():
    async def main() -> None:
        now = now_ms()
        spec = TableSpec("t", "t-changelog", 1, "k", value_format="string")
        r = Reads(tables=[spec], input_lag={"t": InputLag(5, now - 3000, now - 50, {}, now)})
        _, fut = r.get("k")
        before = r.snap.input_lag_at("t", now_ms())
        r.reply(answer(*r.reads(), value="grüß".encode()))
        after = r.snap.input_lag_at("t", now_ms())
        got = fut.result()
        assert (got.input_lag_records, got.value_format, got.value) == (5, "string", "grüß")
        assert before[1] <= got.input_lag_ms <= after[1]
    run(main)


@pytest.mark.parametrize("code", [store_pb2.TOO_STALE, store_pb2.NOT_HOSTED, store_pb2.ERROR,
                                  store_pb2.NOT_YET_VISIBLE])
def test_a_refusal_or_a_failed_read_resolves_to_none_for_the_python_path(code):
    async def main() -> None:
        r = Reads()
        _, fut = r.get("k")
        r.reply(answer(*r.reads(), code=code))
        assert fut.done() and fut.result() is None
        assert r.engine.in_flight() == 0 and r.ports[STANDBY_AT].aborted == 0
        assert r.engine.reaches(STANDBY_AT), "a refusal is an answer: the connection stays"
    run(main)


def test_a_result_without_the_replicas_status_resolves_to_none():
    async def main() -> None:
        r = Reads()
        _, fut = r.get("k")
        [read] = r.reads()
        r.reply(store_pb2.ResultBatch(results=[store_pb2.KeyResult(id=read.id, status=store_pb2.OK, value=b"1")]))
        assert fut.result() is None
    run(main)


def test_an_answer_split_across_reads_of_the_socket_is_put_together():
    async def main() -> None:
        r = Reads()
        _, fut = r.get("k")
        data = frame(answer(*r.reads()))
        for i in range(len(data)):
            r.engine.received(STANDBY_AT, data[i:i + 1], r.loop.time())
            assert fut.done() is (i == len(data) - 1)
        assert fut.result().found
    run(main)


def test_an_answer_with_an_unknown_id_is_ignored():
    async def main() -> None:
        r = Reads()
        _, fut = r.get("k")
        [read] = r.reads()
        r.reply(answer(store_pb2.KeyRead(id=read.id + 1000)))
        assert not fut.done() and r.engine.in_flight() == 1
        r.reply(answer(read))
        assert fut.result().found
    run(main)


# ---- a broken connection ----------------------------------------------------------------------------------

@pytest.mark.parametrize("garbage", [b"\x00\x00\x00\x03\xff\xff\xff", (65 << 20).to_bytes(4, "big"),
                                     frame(store_pb2.ResultBatch(refused="no cluster secret"))],
                         ids=["not a result batch", "oversized frame", "refused"])
def test_a_garbage_frame_or_a_refusal_of_the_connection_gives_its_reads_up_and_aborts_it(garbage):
    async def main() -> None:
        r = Reads()
        _, first = r.get("a")
        _, second = r.get("b")
        r.engine.flush()
        r.engine.received(STANDBY_AT, garbage, r.loop.time())
        assert first.result() is None and second.result() is None
        assert r.ports[STANDBY_AT].aborted == 1
        assert r.engine.in_flight() == 0
        assert not r.engine.reaches(STANDBY_AT)
        # The next read goes to the active: the standby's connection is gone and the node backed off.
        assert r.get("c")[0] & SERVED and [read.key for read in r.reads(ACTIVE_AT)] == [b"c"]
    run(main)


def test_a_lost_connection_gives_its_reads_in_flight_up_without_aborting_it():
    async def main() -> None:
        r = Reads()
        _, first = r.get("a")
        _, second = r.get("b")  # waiting in the outbox, not yet written
        r.engine.lost(STANDBY_AT, None, r.loop.time())
        assert first.result() is None
        assert r.ports[STANDBY_AT].aborted == 0, "the transport is gone already"
        assert not r.engine.reaches(STANDBY_AT)
        assert r.engine.in_flight() == 0 and second.done() and second.result() is None
    run(main)


def test_a_connection_lost_with_a_reason_is_aborted():
    async def main() -> None:
        r = Reads()
        _, fut = r.get("a")
        r.engine.lost(STANDBY_AT, "closing", r.loop.time())
        assert fut.result() is None and r.ports[STANDBY_AT].aborted == 1
    run(main)


# ---- the attempt timeout -------------------------------------------------------------------------------------

def test_a_read_unanswered_by_its_attempt_timeout_resolves_to_none_at_due_and_not_before():
    async def main() -> None:
        r = Reads(policy=RoutingPolicy(hedge=False, attempt_timeout_ms=200))
        t0 = r.loop.time()
        flags, fut = r.get("k", now=t0)
        assert flags & TIMER and r.engine.due == pytest.approx(t0 + 0.2, abs=1e-6)
        # Earlier than a millisecond before it is due: not on time, and the timer is asked for again.
        assert r.engine.expire(t0 + 0.2 - 0.0015) == TIMER
        assert not fut.done() and r.engine.due == pytest.approx(t0 + 0.2, abs=1e-6)
        assert r.engine.expire(t0 + 0.2) == 0
        assert fut.result() is None
        assert r.engine.in_flight() == 0 and r.engine.due is None
        # The node's late answer changes nothing.
        r.reply(answer(*r.reads()))
        assert fut.result() is None
    run(main)


def test_a_timer_firing_less_than_a_millisecond_early_is_on_time():
    async def main() -> None:
        r = Reads(policy=RoutingPolicy(hedge=False, attempt_timeout_ms=200))
        t0 = r.loop.time()
        _, fut = r.get("k", now=t0)
        r.engine.expire(t0 + 0.2 - 0.0005)
        assert fut.result() is None
    run(main)


def test_the_timer_is_due_at_the_earliest_reads_deadline():
    async def main() -> None:
        r = Reads(policy=RoutingPolicy(hedge=False, attempt_timeout_ms=200))
        t0 = r.loop.time()
        f1, first = r.get("a", now=t0)
        f2, second = r.get("b", now=t0 + 0.05)
        assert f1 & TIMER and not f2 & TIMER, "the timer armed for the first read is earlier"
        assert r.engine.expire(t0 + 0.2) == TIMER
        assert first.result() is None and not second.done()
        assert r.engine.due == pytest.approx(t0 + 0.25, abs=1e-6)
        r.engine.expire(t0 + 0.25)
        assert second.result() is None
    run(main)


def test_an_answered_read_does_not_give_up_when_its_timer_fires():
    async def main() -> None:
        r = Reads(policy=RoutingPolicy(hedge=False, attempt_timeout_ms=200))
        t0 = r.loop.time()
        _, fut = r.get("k", now=t0)
        r.reply(answer(*r.reads()))
        answered = fut.result()
        assert r.engine.expire(t0 + 0.2) == 0
        assert fut.result() is answered and r.engine.in_flight() == 0
    run(main)


# ---- batching ---------------------------------------------------------------------------------------------

def test_reads_issued_while_a_batch_is_unanswered_leave_together_as_one_batch_on_flush():
    async def main() -> None:
        r = Reads()
        _, first = r.get("a")
        assert len(r.ports[STANDBY_AT].frames) == 1
        f2, second = r.get("b")
        f3, third = r.get("c")
        assert f2 & FLUSH and f3 & FLUSH, "each asks for a flush"
        assert len(r.ports[STANDBY_AT].frames) == 1, "nothing written before the flush"
        r.engine.flush()
        batches = r.ports[STANDBY_AT].batches()
        assert [[read.key for read in b.reads] for b in batches] == [[b"a"], [b"b", b"c"]]
        assert batches[1].cluster_secret == ""
        r.engine.flush()
        assert len(r.ports[STANDBY_AT].frames) == 2, "an empty outbox writes nothing"
        r.reply(answer(*batches[1].reads, value=b"2"))
        r.reply(answer(*batches[0].reads, value=b"1"))
        assert [f.result().raw_value for f in (first, second, third)] == [b"1", b"2", b"2"]
    run(main)


def test_reads_waiting_in_the_outbox_leave_when_the_last_batch_is_answered():
    async def main() -> None:
        r = Reads()
        _, first = r.get("a")
        _, second = r.get("b")
        r.reply(answer(*r.reads()))
        assert first.result().key == "a"
        assert [[read.key for read in b.reads] for b in r.ports[STANDBY_AT].batches()] == [[b"a"], [b"b"]]
        r.reply(answer(r.reads()[-1]))
        assert second.result().key == "b"
    run(main)


# ---- the hedge ----------------------------------------------------------------------------------------------

def test_a_slow_read_is_hedged_to_the_next_replica_and_the_first_answer_wins():
    async def main() -> None:
        r = Reads(policy=RoutingPolicy(hedge=True, hedge_min_ms=20, hedge_budget=1.0, attempt_timeout_ms=500))
        # Answers of a few ms teach the engine its latency: the next reads hedge after hedge_min_ms.
        for i in range(64):
            t = r.loop.time()
            _, fut = r.get(f"warm-{i}", now=t)
            r.engine.received(STANDBY_AT, frame(answer(r.reads()[-1])), t + 0.002)
            assert fut.result() is not None
        t0 = r.loop.time() + 1
        r.engine.expire(t0)  # the warm reads' timers, all past
        assert r.engine.due is None
        flags, fut = r.get("slow", now=t0)
        assert flags & TIMER and r.engine.due == pytest.approx(t0 + 0.02, abs=1e-6)
        r.engine.expire(t0 + 0.02)
        [hedge] = r.reads(ACTIVE_AT)
        assert hedge.key == b"slow" and r.engine.hedges() == 1
        assert r.engine.due == pytest.approx(t0 + 0.5, abs=1e-6)
        r.engine.received(ACTIVE_AT, frame(answer(hedge, replica=status(node="active", role=store_pb2.ACTIVE,
                                                                          state=store_pb2.SERVING_ACTIVE))),
                          t0 + 0.03)
        assert (fut.result().node, fut.result().role) == ("active", "active")
        # The first replica's late answer is dropped.
        r.engine.received(STANDBY_AT, frame(answer(r.reads()[-1])), t0 + 0.04)
        assert fut.result().node == "active" and r.engine.in_flight() == 0
    run(main)


# ---- the asyncio glue (freshroute.client.compiled) ----------------------------------------------------------

def glue(policy: RoutingPolicy = POLICY) -> tuple[Any, Reads]:
    """A CompiledReads on the running loop over a Reads' engine and its fake read ports."""
    from freshroute.client.compiled import compiled_reads
    from freshroute.cluster_access import NodeAccess

    r = Reads(policy=policy, connect=())
    reads = compiled_reads(policy, NodeAccess(SECRET), None)
    assert reads is not None
    r.engine = reads._engine
    for address, port in r.ports.items():
        reads.connected(address, port)  # before the view: update opens no connection to a port reached
    reads.update(r.snap)
    assert not reads._connecting
    return reads, r


def test_the_glue_answers_a_read_from_the_node_and_leaves_a_bound_it_does_not_judge_to_the_python_path():
    async def main() -> None:
        reads, r = glue()
        assert reads.get("t", "t", "k", Bound(wait_ms=100)) is None
        assert reads.get("t", "t", 7, Bound()) is None  # type: ignore[arg-type]  # not a key: the Python path's
        assert r.ports[STANDBY_AT].frames == []
        task = reads.get("t", "t", "k", Bound(max_lag=3))
        assert task is not None
        [read] = r.reads()
        assert read.bound.max_lag == 3
        reads.received(STANDBY_AT, frame(answer(read)))
        got = await task
        assert (got.key, got.found, got.node) == ("k", True, "standby")
        reads.close()
    run(main)


def test_the_glue_flushes_reads_issued_together_as_one_batch():
    async def main() -> None:
        reads, r = glue()
        tasks = [reads.get("t", "t", key, Bound()) for key in ("a", "b", "c")]
        await asyncio.sleep(0)  # the flush the second asked for runs
        assert [[read.key for read in b.reads] for b in r.ports[STANDBY_AT].batches()] == [[b"a"], [b"b", b"c"]]
        for batch in r.ports[STANDBY_AT].batches():
            reads.received(STANDBY_AT, frame(answer(*batch.reads)))
        assert [lookup.key for lookup in await asyncio.gather(*tasks)] == ["a", "b", "c"]
    run(main)


def test_the_glues_timer_gives_an_unanswered_read_to_the_python_path_after_the_attempt_timeout():
    async def main() -> None:
        reads, r = glue(RoutingPolicy(hedge=False, attempt_timeout_ms=50))
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await asyncio.wait_for(reads.get("t", "t", "k", Bound()), 2) is None
        assert 0.045 <= loop.time() - started < 1
        assert r.engine.in_flight() == 0
    run(main)


def test_a_lost_read_port_gives_its_reads_to_the_python_path_and_close_aborts_the_others():
    async def main() -> None:
        reads, r = glue()
        task = reads.get("t", "t", "k", Bound())
        assert task is not None
        reads.lost(STANDBY_AT)
        assert await task is None
        reads.close()
        assert r.ports[ACTIVE_AT].aborted == 1
        assert r.ports[STANDBY_AT].aborted == 0, "lost already: not the glue's to abort"
    run(main)


# ---- load ----------------------------------------------------------------------------------------------------

def caught_up(now: int) -> list[ReplicaView]:
    """Partition 0 of ``t`` on two replicas both at the changelog's end: equally fresh, so their load orders them."""
    return [ReplicaView(node, f"{node}:7000", "t", 0, role, state, 10, 10, 0, now, True)
            for node, role, state in (("active", Role.ACTIVE, ReplicaState.ACTIVE),
                                      ("standby", Role.STANDBY, ReplicaState.STANDBY))]


def test_a_read_given_up_at_its_deadline_leaves_no_load_on_its_node():
    async def main() -> None:
        r = Reads(tables=[TableSpec("t", "t-changelog", 1, "k")], replicas=caught_up(now_ms()),
                  policy=RoutingPolicy(hedge=False, attempt_timeout_ms=200))
        t0 = r.loop.time()
        _, fut = r.get("slow", now=t0)
        slow = next(a for a, port in r.ports.items() if port.frames)
        r.engine.expire(t0 + 0.2)
        assert fut.result() is None
        served = {ACTIVE_AT: 0, STANDBY_AT: 0}
        for i in range(40):
            t = t0 + 1 + i
            before = {a: len(r.reads(a)) for a in r.ports}
            _, fut = r.get(f"k{i}", now=t)
            r.engine.flush()  # the read given up on was never answered: reads to its node wait for a flush
            [address] = [a for a in r.ports if len(r.reads(a)) > before[a]]
            served[address] += 1
            # Both report staleness 0, as their views do: the overlay keeps them equally fresh.
            r.engine.received(address, frame(answer(r.reads(address)[-1], replica=status(staleness_ms=0))), t + 0.001)
            assert fut.result() is not None
        # The Python path (Attempt.abandon) and the router's (lookup.rs's InFlight) end a given-up attempt's count
        # at once: then each replica gets about half; with the count left on, the node given up on gets none.
        assert served[slow] >= 5, served
    run(main)


def test_an_engine_made_on_one_thread_may_be_dropped_on_another():
    """A client may be collected on another thread than its loop's (a blocking client's caller drops it): the engine
    goes without an error no caller could catch. In a process of its own, so that nothing keeps it alive."""
    script = """if True:
        import gc, threading
        from freshroute_dataplane import DirectReads
        from freshroute.client.lookup import Lookup
        from freshroute.routing.compiled_view import policy_doc
        from freshroute.routing.policy import RoutingPolicy
        import orjson
        made = []
        t = threading.Thread(target=lambda: made.append(DirectReads(orjson.dumps(policy_doc(RoutingPolicy(), "")).decode(),
                                                                     Lookup)))
        t.start(); t.join()
        made.clear()
        gc.collect()
        print("dropped")
    """
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.stdout.split() == ["dropped"], done.stdout + done.stderr
    assert "DirectReads" not in done.stderr, done.stderr


def test_the_blocking_client_reads_by_its_own_driver_and_opens_no_compiled_connections():
    from freshroute.client import Client

    c = Client(redis_url="redis://127.0.0.1:1/0", connect_timeout_s=0.1)
    try:
        assert c._async._compiled is None
    finally:
        c.close()


def test_closing_the_glue_gives_its_reads_in_flight_to_the_python_path_at_once():
    async def main() -> None:
        reads, r = glue()
        task = reads.get("t", "t", "k", Bound())
        assert task is not None and r.reads(), "the read left"
        reads.close()
        assert await asyncio.wait_for(task, 1) is None
        assert r.ports[STANDBY_AT].aborted == 1 and r.ports[ACTIVE_AT].aborted == 1
        # What the aborted transports report afterwards, and a read asked after the close, find nothing to do.
        reads.lost(STANDBY_AT)
        reads.received(ACTIVE_AT, b"\x00")
        assert reads.get("t", "t", "k", Bound()) is None
    run(main)


# ---- batches -----------------------------------------------------------------------------------------------------

def many(r: Reads, keys: list[Any], now: float | None = None) -> tuple[int, asyncio.Future[Any]]:
    fut = r.loop.create_future()
    flags = r.engine.get_many("t", "t", keys, None, None, None, fut, r.loop.time() if now is None else now)
    return flags, fut


def groups(r: Reads, address: str = STANDBY_AT) -> list[store_pb2.GroupRead]:
    return [g for b in r.ports[address].batches() for g in b.groups]


def group_answer(*reads: store_pb2.GroupRead, code: int = store_pb2.OK,
                 values: dict[bytes, bytes] | None = None) -> store_pb2.ResultBatch:
    """Each group answered with its keys' values (``values``; a key not in it absent), or refused with ``code``."""
    values = values or {}
    return store_pb2.ResultBatch(groups=[store_pb2.GroupResult(
        id=g.id, status=code, values=[values.get(k, b"") for k in g.keys] if code == store_pb2.OK else [],
        replica=status()) for g in reads])


def test_a_batch_reads_one_group_per_partition_and_answers_every_key_in_order_as_the_python_path_does():
    async def main() -> None:
        r = Reads()
        keys = [f"k{i}" for i in range(12)] + ["k3"]  # a key asked twice is answered twice
        flags, fut = many(r, keys)
        assert flags & SERVED
        r.engine.flush()
        sent = groups(r)
        partitions = {partition_for(k.encode(), 4) for k in keys}
        assert sorted(g.partition for g in sent) == sorted(partitions), "one group per partition"
        for g in sent:
            assert g.table == "t" and g.bound.max_lag == 7  # the table's default bound
            assert all(partition_for(k, 4) == g.partition for k in g.keys)
        present = {k.encode(): f'{{"k":"{k}"}}'.encode() for k in keys if k != "k5"}
        for batch in r.ports[STANDBY_AT].batches():
            r.reply(group_answer(*batch.groups, values=present))
        got = fut.result()
        assert [a.key for a in got] == keys
        assert [a.found for a in got] == [k != "k5" for k in keys]
        # Field by field what Lookup.group builds from the same answer; each one a Lookup made whole, which a
        # collection leaves as it was.
        gc.collect()
        for a in got:
            want = Lookup("t", a.key, a.key != "k5", present.get(a.key.encode()), partition_for(a.key.encode(), 4),
                          "standby", "standby", 0, 3, 10, 0, 0, "json")
            assert type(a) is Lookup and a == want and a.value == want.value
        assert r.engine.in_flight() == 0
    run(main)


def test_the_answers_type_must_be_a_named_tuple():
    with pytest.raises(ValueError, match="named tuple"):
        dataplane.DirectReads(orjson.dumps(policy_doc(RoutingPolicy(), SECRET)).decode(), dict)


def test_a_batch_with_a_refused_group_goes_whole_to_the_python_path_and_leaves_no_read_waiting():
    async def main() -> None:
        r = Reads()
        keys = [f"k{i}" for i in range(12)]
        _, fut = many(r, keys)
        r.engine.flush()
        first, *rest = groups(r)
        r.reply(group_answer(first, code=store_pb2.TOO_STALE))
        assert fut.result() is None
        # The other groups' answers, should they come, find nothing waiting.
        r.reply(group_answer(*rest, values={k.encode(): b"{}" for k in keys}))
        assert r.engine.in_flight() == 0
    run(main)


def test_a_batch_this_path_cannot_read_whole_is_left_untouched_to_the_python_path():
    async def main() -> None:
        r = Reads(connect=(ACTIVE_AT,))  # the freshest replica of every partition, the standby, is not reached
        assert many(r, ["k1", "k2"])[0] == 0
        r = Reads()
        assert many(r, ["k1", 2])[0] == 0  # a key that is not text: the Python path says so
        assert many(r, ["k1", "\ud800"])[0] == 0  # nor is a lone surrogate UTF-8
        assert r.ports[STANDBY_AT].frames == [] and r.ports[ACTIVE_AT].frames == []
    run(main)


def test_a_batch_past_its_attempt_timeout_goes_to_the_python_path():
    async def main() -> None:
        r = Reads(policy=RoutingPolicy(hedge=False, attempt_timeout_ms=200))
        t0 = r.loop.time()
        _, fut = many(r, ["k1", "k2"], now=t0)
        assert r.engine.due == pytest.approx(t0 + 0.2, abs=1e-5)
        r.engine.expire(t0 + 0.2)
        assert fut.result() is None
    run(main)

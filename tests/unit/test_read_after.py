"""Read your writes: write tokens, a lookup ``after`` one through the routing core and REST, and the store node's check."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace
from types import MappingProxyType, SimpleNamespace

import orjson
import pytest

from freshroute import input_position
from freshroute.client import write_token
from freshroute.errors import InvalidArgument, NotYetVisible, WriteRejected
from freshroute.bound import Bound
from freshroute.lag import now_ms
from freshroute.position import Position
from freshroute.write_tokens.token import WriteToken
from freshroute.keys import partition_for, serialize_key
from freshroute.metadata.progress import InputEnds, InputMark, reflected_at
from freshroute.metadata.roles import Role
from freshroute.metadata.tables import TableSpec
from proto import store_pb2
from router.settings import RouterSettings
from store_node.read_port import ReadPort
from store_node.replica import Replica
from store_node.replica_store import ReplicaStore
from tests.unit.fake_changelog import Msg
from tests.unit.routing_support import Cluster

INPUT = "readings"
anyio = pytest.mark.anyio
# The suite runs these beside Spark on two cores, which has held this process for over a second: a wait that should
# end early is given far longer than it needs, and "soon" is still well before it would have run out.
WAIT_MS = 15_000
SOON_S = 5.0
RSPEC = TableSpec("sensor_stats", "sensor_stats-changelog", 4, "sensor_id", {"count": "long"}, 1, input_topic=INPUT)


# ---- tokens ------------------------------------------------------------------------------------------------


def Delivered(topic, partition, offset, ts=1_700_000_000_000, error=None):
    """What a confluent-kafka delivery report hands its callback."""
    return Msg(offset, partition=partition, topic=topic, error=error, timestamp_ms=ts)


def test_a_token_carries_the_latest_write_per_partition_and_what_was_read():
    token = write_token(Delivered(INPUT, 0, 41), (INPUT, 0, 7), (INPUT, 2, 9), Position("t", {1: 5}).encode())
    decoded = WriteToken.decode(token)
    assert decoded.inputs == {INPUT: {0: 41, 2: 9}}
    assert decoded.reads == {"t": {1: 5}}
    assert decoded.written_ms == 1_700_000_000_000
    again = write_token(token, (INPUT, 2, 12), Position("t", {1: 3}).encode())
    assert WriteToken.decode(again).inputs == {INPUT: {0: 41, 2: 12}}
    assert WriteToken.decode(again).reads == {"t": {1: 5}}  # the later read position stays


@pytest.mark.parametrize("bad", ["", "w1.", "p1.abc", "w1.eyJ9.00000000", "junk", "w1." + "A" * 9000])
def test_a_malformed_token_is_refused_naming_the_field(bad):
    with pytest.raises(InvalidArgument) as e:
        WriteToken.decode(bad)
    assert e.value.details["field"] == "after"


def test_an_altered_token_is_refused_by_its_checksum():
    token = write_token((INPUT, 0, 41))
    body, crc = token.rsplit(".", 1)
    forged = WriteToken({INPUT: {0: 99}}, {}, 0).encode().rsplit(".", 1)[0] + "." + crc
    with pytest.raises(InvalidArgument, match="checksum"):
        WriteToken.decode(forged)
    assert WriteToken.decode(token).inputs == {INPUT: {0: 41}}


def test_an_undelivered_message_and_nonsense_make_no_token():
    with pytest.raises(InvalidArgument, match="not delivered"):
        write_token(Delivered(INPUT, 0, -1001, error="timed out"))
    with pytest.raises(InvalidArgument):
        write_token((INPUT, 0))
    with pytest.raises(InvalidArgument):
        write_token(object())
    with pytest.raises(InvalidArgument):
        write_token()


def test_the_first_mark_past_every_named_offset_says_from_where_every_row_reflects_them():
    marks = (InputMark({0: 10, 1: 10}, {0: 100, 1: 200}, 1), InputMark({0: 20, 1: 12}, {0: 150, 1: 260}, 2))
    assert reflected_at(marks, {0: 9}) == {0: 100, 1: 200}
    assert reflected_at(marks, {0: 10}) == {0: 150, 1: 260}  # the mark says "read to 10": offset 10 is not in
    assert reflected_at(marks, {0: 15, 1: 11}) == {0: 150, 1: 260}
    assert reflected_at(marks, {0: 20}) is None


# ---- the routing core ------------------------------------------------------------------------------------


def part(key: str) -> int:
    return partition_for(serialize_key(key), RSPEC.partitions)


def cluster(**snapshot) -> Cluster:
    c = Cluster(RouterSettings(request_timeout_ms=2000, attempt_timeout_ms=500, hedge=False), tables=(RSPEC,))
    for node, active in ((c.n1, True), (c.n2, False)):
        for p in range(RSPEC.partitions):
            rep = node.host(RSPEC.name, p, role=Role.ACTIVE if (p % 2 == 0) == active else Role.STANDBY,
                            applied=100, end=100)
            rep.data[serialize_key("s1")] = b'{"count":1}'
            rep.positions[serialize_key("s1")] = input_position.encode([40, None])
    c.refresh()
    ends = {INPUT: InputEnds({0: 50, 1: 50}, now_ms())}
    c.metadata.current = replace(c.metadata.current, input_ends=MappingProxyType(ends), **snapshot)
    return c


def replicas(c: Cluster, key: str):
    return [node.replicas[(RSPEC.name, part(key))] for node in (c.n1, c.n2)]


@anyio
async def test_a_row_that_reflects_the_event_answers_at_once():
    c = cluster()
    r = await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token((INPUT, 0, 40)))))
    assert r.found and r.value == b'{"count":1}'


async def pipeline_catches_up(after_s: float, *reps) -> None:
    """``after_s`` from now, s1's row on ``reps`` reflects the event at offset 45 of input partition 0."""
    await asyncio.sleep(after_s)
    for rep in reps:
        rep.data[serialize_key("s1")] = b'{"count":2}'
        rep.positions[serialize_key("s1")] = input_position.encode([45, None])


@anyio
async def test_a_row_not_yet_reflecting_the_event_is_asked_again_until_it_does():
    c = cluster()
    started = time.monotonic()
    catching_up = asyncio.create_task(pipeline_catches_up(0.05, *replicas(c, "s1")))
    r = await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token((INPUT, 0, 45)), wait_ms=WAIT_MS)))
    await catching_up
    assert r.value == b'{"count":2}'
    assert 0.05 <= time.monotonic() - started < SOON_S


@anyio
async def test_a_replica_catching_up_is_asked_again_while_another_gone_silent_has_not_answered():
    """A partition drops a replica's packets: its attempt never ends, and must not keep the replica that will have the
    event from being asked again (found by loadtest.partitions, the router cut off from a store node)."""
    c = cluster()
    catching_up = replicas(c, "s1")[1]  # node 2's; node 1's goes silent
    catching_up.applied = 99  # a hair behind: the silent one is asked first
    c.n1.delay_s = 30.0
    c.refresh()

    started = time.monotonic()
    caught_up = asyncio.create_task(pipeline_catches_up(1.0, catching_up))
    r = await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token((INPUT, 0, 45)), wait_ms=WAIT_MS)))
    await caught_up
    assert r.value == b'{"count":2}'
    assert time.monotonic() - started < SOON_S  # asked again every few ms from the attempt timeout (0.5 s) on
    assert c.n1.reads == 1 and c.n2.reads > 2


@anyio
async def test_no_replica_with_the_event_by_wait_ms_is_not_yet_visible_never_an_old_value():
    c = cluster()
    started = time.monotonic()
    with pytest.raises(NotYetVisible) as e:
        await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token((INPUT, 0, 45)), wait_ms=150)))
    assert 0.14 <= time.monotonic() - started < SOON_S
    assert e.value.details["after"] == {"topic": INPUT, "offsets": {"0": 45}}
    assert "not yet visible" in e.value.message


class MillisecondTimers(asyncio.SelectorEventLoop):
    """An event loop whose timers count whole milliseconds, as uvloop's (libuv's) do: they fire up to one early."""

    def call_later(self, delay, callback, *args, context=None):
        return super().call_later(math.floor(delay * 1000) / 1000, callback, *args, context=context)


def test_the_wait_lasts_its_wait_ms_where_timers_fire_up_to_a_millisecond_early():
    """Found by loadtest.partitions: through the router (on uvloop) every read after a write token not yet in its
    table ended NOT_YET_VISIBLE at about 60 % of its wait_ms. Each early wake-up was another pass of the driver's
    bounded loop, spinning until its time came, and the passes ran out before the deadline."""

    async def wait_out() -> float:
        c = cluster()
        started = time.monotonic()
        with pytest.raises(NotYetVisible):
            await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token((INPUT, 0, 45)), wait_ms=600)))
        return time.monotonic() - started

    with asyncio.Runner(loop_factory=MillisecondTimers) as runner:
        assert 0.59 <= runner.run(wait_out()) < SOON_S


@anyio
async def test_a_rejected_event_ends_the_wait_at_once_with_its_reason():
    rejected = MappingProxyType({INPUT: {0: {45: "invalid_json"}}})
    c = cluster(rejected=rejected)
    started = time.monotonic()
    with pytest.raises(WriteRejected) as e:
        await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token((INPUT, 0, 45)), wait_ms=WAIT_MS)))
    assert time.monotonic() - started < SOON_S
    assert "invalid_json" in e.value.message and e.value.http_status == 409


@anyio
async def test_a_mark_past_the_event_lets_a_replica_answer_for_a_key_the_event_did_not_touch():
    marks = MappingProxyType({RSPEC.name: (InputMark({0: 46, 1: 0}, {p: 90 for p in range(4)}, 1),)})
    c = cluster(input_marks=marks)
    # s1's row reflects partition 0 only to 40: the event at 45 was another key's, and the mark says it is in.
    r = await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token((INPUT, 0, 45)))))
    assert r.value == b'{"count":1}'
    for rep in replicas(c, "s1"):
        rep.applied = 80  # below the mark's changelog offset: not yet
    c.refresh()
    c.metadata.current = replace(c.metadata.current, input_marks=marks,
                                 input_ends=MappingProxyType({INPUT: InputEnds({0: 50, 1: 50}, now_ms())}))
    with pytest.raises(NotYetVisible):
        await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token((INPUT, 0, 45)), wait_ms=100)))


@anyio
async def test_a_mark_published_while_the_read_waits_lets_a_replica_answer():
    """A micro-batch table's rows carry no input position: a fresh write is in only once the next batch's mark is
    published, mostly after the read began (found by loadtest.partitions on a micro-batch stack: every such read
    waited out its wait_ms)."""
    c = cluster()
    for rep in replicas(c, "s1"):
        rep.positions.clear()
    marked = InputMark({0: 46, 1: 0}, {p: 90 for p in range(4)}, 1)

    async def batch_ends() -> None:
        await asyncio.sleep(0.1)
        c.metadata.current = replace(c.metadata.current, input_marks=MappingProxyType({RSPEC.name: (marked,)}))

    started = time.monotonic()
    marking = asyncio.create_task(batch_ends())
    r = await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token((INPUT, 0, 45)), wait_ms=WAIT_MS)))
    await marking
    assert r.value == b'{"count":1}'
    assert 0.1 <= time.monotonic() - started < SOON_S


@anyio
async def test_tokens_naming_nothing_the_table_reads_or_no_such_write_are_refused():
    c = cluster()
    with pytest.raises(InvalidArgument) as e:
        await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token(("orders", 0, 1)))))
    assert e.value.details["field"] == "after" and e.value.details["reads"] == [INPUT, RSPEC.topic]
    with pytest.raises(InvalidArgument, match="partition 7"):
        await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token((INPUT, 7, 1)))))
    old_write = WriteToken({INPUT: {0: 60}}, {}, now_ms() - 10_000).encode()
    with pytest.raises(InvalidArgument, match="past where that partition ends"):
        await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=old_write)))
    # A write just made may be past ends read a moment before it: that is waited for, not refused.
    with pytest.raises(NotYetVisible):
        await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=WriteToken({INPUT: {0: 60}}, {}, now_ms()).encode(),
                                                         wait_ms=50)))


@anyio
async def test_a_token_carrying_a_read_of_the_table_is_a_position_to_reach():
    c = cluster()
    token = write_token(Position(RSPEC.name, {part("s1"): 120}).encode())
    with pytest.raises(Exception) as e:
        await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=token, wait_ms=100)))
    assert e.value.code in ("NO_REPLICA_WITHIN_BOUND", "TIMEOUT")
    r = await c.router.get(RSPEC.name, "s1", Bound.parse(dict(after=write_token(Position(RSPEC.name, {0: 100}).encode()))))
    assert r.found


@anyio
async def test_rest_lookups_take_after_and_say_why_they_cannot_answer():
    rejected = MappingProxyType({INPUT: {0: {45: "invalid_json"}}})
    c = cluster(rejected=rejected)
    async with c.client() as http:
        ok = await http.get(f"/v1/tables/{RSPEC.name}/keys/s1", params={"after": write_token((INPUT, 0, 40))})
        assert ok.status_code == 200 and ok.json()["value"] == {"count": 1}
        bad = await http.get(f"/v1/tables/{RSPEC.name}/keys/s1", params={"after": "w1.nope"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "after"
        gone = await http.get(f"/v1/tables/{RSPEC.name}/keys/s1", params={"after": write_token((INPUT, 0, 45))})
        assert gone.status_code == 409 and gone.json()["error"]["code"] == "WRITE_REJECTED"
        late = await http.get(f"/v1/tables/{RSPEC.name}/keys/s1",
                              params={"after": write_token((INPUT, 0, 44)), "wait_ms": "80"})
        assert late.status_code == 503 and late.json()["error"]["code"] == "NOT_YET_VISIBLE"
        batch = await http.post(f"/v1/tables/{RSPEC.name}/keys:batchGet",
                                json={"keys": ["s1"], "after": write_token((INPUT, 0, 40))})
        assert batch.status_code == 200 and batch.json()["results"][0]["found"] is True
        wait = await http.get(f"/v1/tables/{RSPEC.name}/keys/s1", params={"wait_ms": "0"})
        assert wait.status_code == 400 and wait.json()["error"]["field"] == "wait_ms"


# ---- the store node ----------------------------------------------------------------------------------------


@pytest.fixture
def port(tmp_path):
    store = ReplicaStore.open(tmp_path / "users" / "1")
    store.apply([(b"alice", b'{"n":1}'), (b"bob", b'{"n":2}')], 10,
                positions=[(b"alice", input_position.encode([7, 3])), (b"bob", None)])
    clock = lambda: 5_000_000  # noqa: E731
    rep = Replica(RSPEC, 1, Role.ACTIVE, store, clock, evidence_window_ms=1000, caught_up_threshold=0)
    node = SimpleNamespace(node_id="n7", serving=MappingProxyType({(RSPEC.name, 1): rep}), draining=False)
    yield ReadPort(node, clock)
    rep.close()


def _ask(port, read=None, group=None, rng=None):
    batch = store_pb2.ReadBatch(reads=[read] if read else [], groups=[group] if group else [],
                                ranges=[rng] if rng else [])
    answer = port.reader().results(batch)
    return (answer.results or answer.groups or answer.ranges)[0]


def _bound(after, after_offset=0):
    return store_pb2.ReadBound(after_input=after, after_offset=after_offset)


def test_a_store_node_answers_a_key_whose_row_reflects_the_events_and_no_other(port):
    read = lambda key, after, offset=0: store_pb2.KeyRead(id=1, table=RSPEC.name, partition=1, key=key,  # noqa: E731
                                                          bound=_bound(after, offset))
    assert _ask(port, read(b"alice", {0: 7, 1: 2})).status == store_pb2.OK
    unseen = _ask(port, read(b"alice", {0: 8}))
    assert unseen.status == store_pb2.NOT_YET_VISIBLE and unseen.value == b""
    assert "partition 0 offset 8" in unseen.message and "alice" in unseen.message
    assert "reflects its input partition 0 to 7" in unseen.message
    assert _ask(port, read(b"bob", {0: 1})).status == store_pb2.NOT_YET_VISIBLE  # no position: not known
    assert _ask(port, read(b"bob", {0: 1}, offset=10)).status == store_pb2.OK  # applied reaches the mark
    assert _ask(port, read(b"bob", {0: 1}, offset=11)).status == store_pb2.NOT_YET_VISIBLE
    group = store_pb2.GroupRead(id=2, table=RSPEC.name, partition=1, keys=[b"alice", b"bob"], bound=_bound({0: 5}))
    assert _ask(port, group=group).status == store_pb2.NOT_YET_VISIBLE
    rng = store_pb2.RangeRead(id=3, table=RSPEC.name, partition=1, start=b"a", limit=10, bound=_bound({0: 5}))
    assert _ask(port, rng=rng).status == store_pb2.NOT_YET_VISIBLE  # rows of many keys: only a mark says
    rng.bound.after_offset = 9
    answered = _ask(port, rng=rng)
    assert answered.status == store_pb2.OK and [e.key for e in answered.entries] == [b"alice", b"bob"]
    assert orjson.loads(answered.entries[0].value) == {"n": 1}


@pytest.fixture
def anyio_backend():
    return "asyncio"


# ---- the client: monotonic reads by default --------------------------------------------------------------------


def test_a_client_sends_the_highest_position_it_has_read_with_every_later_read():
    from freshroute.client import AsyncClient
    from freshroute.client.lookup import Lookup

    client = AsyncClient(router="http://127.0.0.1:1")
    read = client.read_positions  # what a read of the client sends, and notes once answered
    assert read.bound("t", None, {}).min_position is None
    read.seen(Lookup("t", "k", True, b"{}", 2, "n1", "active", 0, 0, 41))
    read.seen_all([Lookup("t", "j", True, b"{}", 3, "n2", "standby", 0, 0, 7), InvalidArgument("x")])
    assert read.bound("t", None, {}).min_position == Position("t", {2: 41, 3: 7})
    read.seen(Lookup("t", "k", True, b"{}", 2, "n2", "standby", 3, 0, 30))  # an older answer moves nothing back
    mine = Position("t", {2: 50}).encode()
    assert read.bound("t", None, {"min_position": mine}).min_position == Position("t", {2: 50, 3: 7})
    assert read.bound("other", None, {}).min_position is None
    free = AsyncClient(router="http://127.0.0.1:1", monotonic=False)
    free.read_positions.seen(Lookup("t", "k", True, b"{}", 2, "n1", "active", 0, 0, 41))
    assert free.read_positions.bound("t", None, {}).min_position is None

"""StoreNodeClient against in-process nodes' read ports on loopback: batching, failure, reconnection."""

import asyncio

import pytest

from freshroute.errors import ReplicaUnavailable
from freshroute.bound import NO_BOUND, Bound
from freshroute.metadata.roles import ReplicaState, Role
from proto import store_pb2

from freshroute.routing.store import StoreNodeClient

from freshroute.wire import FrameReader, ReadStatus, frame

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("one_event_loop")]


@pytest.fixture(scope="module")
def anyio_backend():
    # The router runs on uvloop, whose transports are not asyncio's classes.
    return "asyncio", {"use_uvloop": True}


class DictStore:
    STATUS = store_pb2.ReplicaStatus(node="s1", role=store_pb2.STANDBY, state=store_pb2.SERVING_STANDBY,
                                     applied_offset=10, end_offset=12, lag_offsets=2, staleness_ms=40)

    def __init__(self, rows, hold=None, short=False, groups=True):
        self.rows = rows
        self.batches: list[int] = []  # reads and groups per batch received
        self.hold = hold  # an Event: results wait for it
        self.short = short  # a broken node: groups answer one value fewer than they were asked
        self.groups = groups  # False: a node older than group reads, answering only KeyReads
        self.group_messages: list[list[tuple[int, list[bytes]]]] = []  # (partition, keys) of each group message

    def answer(self, r):
        status = self.STATUS
        if r.bound.HasField("max_lag") and r.bound.max_lag < 2:
            return store_pb2.KeyResult(id=r.id, status=store_pb2.TOO_STALE, replica=status)
        if r.key not in self.rows:
            return store_pb2.KeyResult(id=r.id, status=store_pb2.NOT_FOUND, replica=status)
        return store_pb2.KeyResult(id=r.id, status=store_pb2.OK, value=self.rows[r.key], replica=status)

    def answer_group(self, g):
        if g.bound.HasField("max_lag") and g.bound.max_lag < 2:
            return store_pb2.GroupResult(id=g.id, status=store_pb2.TOO_STALE, replica=self.STATUS, message="behind")
        values = [self.rows.get(k, b"") for k in g.keys]
        return store_pb2.GroupResult(id=g.id, status=store_pb2.OK, replica=self.STATUS,
                                     values=values[:-1] if self.short else values)

    def answer_range(self, r):
        keys = sorted(k for k in self.rows if k >= r.start and (not r.end or k < r.end))[:r.limit]
        return store_pb2.RangeResult(id=r.id, status=store_pb2.OK, replica=self.STATUS,
                                     entries=[store_pb2.ScanEntry(key=k, value=self.rows[k]) for k in keys])

    def received(self, batch):
        self.batches.append(len(batch.reads) + len(batch.groups) + len(batch.ranges))
        self.group_messages.append([(g.partition, list(g.keys)) for g in batch.groups])

    def results(self, batch):
        return store_pb2.ResultBatch(results=[self.answer(r) for r in batch.reads],
                                     groups=[self.answer_group(g) for g in batch.groups] if self.groups else [],
                                     ranges=[self.answer_range(r) for r in batch.ranges])


class FrameNode:
    """A node's read port answering from a DictStore (its hold applies too); ``address`` names the node."""

    def __init__(self, store, frame_server, frame_port):
        self.store, self.frame_server = store, frame_server
        self.address, self.read_address = f"node-{frame_port}", f"127.0.0.1:{frame_port}"

    async def stop(self, grace=None):
        self.frame_server.close()
        for task in list(self.store.connections):
            task.cancel()


async def start_frames(store, port=0):
    async def serve(reader, writer):
        task = asyncio.current_task()
        store.connections.add(task)
        frames = FrameReader()
        try:
            while data := await reader.read(65536):
                for payload in frames.feed(data):
                    batch = store_pb2.ReadBatch.FromString(payload)
                    store.received(batch)
                    if store.hold is not None:
                        await store.hold.wait()
                    writer.write(frame(store.results(batch).SerializeToString()))
        finally:
            store.connections.discard(task)
            writer.close()

    store.connections = set()
    frame_server = await asyncio.start_server(serve, "127.0.0.1", port)
    return FrameNode(store, frame_server, frame_server.sockets[0].getsockname()[1])


class Started:
    """A node started for a test, and how the client is told about it."""

    def __init__(self):
        self.server = None
        self.port = 0

    async def start(self, client, store, port=None):
        self.server = await start_frames(store, self.port if port is None else port)
        self.port = int(self.server.read_address.rsplit(":", 1)[1])
        client.track({self.server.address: self.server.read_address})
        return self.server.address

    async def stop(self):
        if self.server is not None:
            await self.server.stop(None)
            self.server = None


ROWS = {f"k{i}".encode(): f'{{"v":{i}}}'.encode() for i in range(20)}


async def test_reads_issued_together_travel_in_one_batch_and_match_by_id():
    store = DictStore(ROWS)
    client = StoreNodeClient()
    node = Started()
    try:
        addr = await node.start(client, store)
        keys = [f"k{i}".encode() for i in range(20)] + [b"missing"]
        results = await asyncio.gather(*(client.read(addr, "t", 0, k, NO_BOUND) for k in keys))
        assert [r.value for r in results[:20]] == [ROWS[k] for k in keys[:20]]
        assert results[20].status is ReadStatus.NOT_FOUND
        assert store.batches == [21]
        rep = results[0].replica
        assert (rep.node, rep.role, rep.state, rep.lag_offsets, rep.staleness_ms) == (
            "s1", Role.STANDBY, ReplicaState.STANDBY, 2, 40)
        stale = await client.read(addr, "t", 0, b"k1", Bound(max_lag=1))
        assert stale.status is ReadStatus.TOO_STALE
        assert store.batches == [21, 1]
        rows = await client.read_range(addr, "t", 0, b"k1", b"k2", 100, None, NO_BOUND)
        assert [k for k, _ in rows.entries] == sorted(k for k in ROWS if k.startswith(b"k1"))
    finally:
        await client.close()
        await node.stop()


async def test_a_group_travels_as_one_read_and_answers_every_key_in_order():
    store = DictStore(ROWS)
    client = StoreNodeClient()
    node = Started()
    try:
        addr = await node.start(client, store)
        keys = [b"k3", b"missing", b"k1"]
        get, many = await asyncio.gather(client.read(addr, "t", 0, b"k2", NO_BOUND),
                                         client.read_many(addr, "t", 0, keys, NO_BOUND))
        assert sum(store.batches) == 2  # a get, and three keys as one group
        assert get.value == ROWS[b"k2"]
        assert (many.status, many.values) == (ReadStatus.OK, [ROWS[b"k3"], b"", ROWS[b"k1"]])
        assert (many.replica.node, many.replica.lag_offsets) == ("s1", 2)
        stale = await client.read_many(addr, "t", 0, keys, Bound(max_lag=1))
        assert (stale.status, stale.values, stale.message) == (ReadStatus.TOO_STALE, [], "behind")
    finally:
        await client.close()
        await node.stop()


async def test_groups_alike_waiting_together_travel_as_one_group_and_each_gets_its_own_keys():
    hold = asyncio.Event()
    store = DictStore(ROWS, hold)
    client = StoreNodeClient(max_unanswered_reads=1)
    node = Started()
    try:
        addr = await node.start(client, store)
        first = asyncio.ensure_future(client.read(addr, "t", 0, b"k0", NO_BOUND))
        await wait_for_batches(store, 1)
        # Waiting behind the first batch: alike (partition 0, no bound) twice, and one of each kind unlike them.
        a = client.read_many(addr, "t", 0, [b"k1", b"missing"], NO_BOUND)
        b = client.read_many(addr, "t", 1, [b"k2"], NO_BOUND)
        c = client.read_many(addr, "t", 0, [b"k3", b"k1"], NO_BOUND)
        d = client.read_many(addr, "t", 0, [b"k4"], Bound(max_lag=5))
        stale = client.read_many(addr, "t", 0, [b"k5"], Bound(max_lag=1))
        stale_too = client.read_many(addr, "t", 0, [b"k6", b"k7"], Bound(max_lag=1))
        hold.set()
        await first
        a, b, c, d, stale, stale_too = await asyncio.gather(a, b, c, d, stale, stale_too)
        assert a.values == [ROWS[b"k1"], b""] and c.values == [ROWS[b"k3"], ROWS[b"k1"]]
        assert b.values == [ROWS[b"k2"]] and d.values == [ROWS[b"k4"]]
        assert a.replica.node == c.replica.node == "s1"
        for r in (stale, stale_too):  # a refusal of the group message is each group's refusal
            assert (r.status, r.values, r.message) == (ReadStatus.TOO_STALE, [], "behind")
        assert store.group_messages[1] == [(0, [b"k1", b"missing", b"k3", b"k1"]), (1, [b"k2"]), (0, [b"k4"]),
                                           (0, [b"k5", b"k6", b"k7"])]
    finally:
        hold.set()
        await client.close()
        await node.stop()


async def test_a_short_answer_to_groups_travelling_together_fails_each_of_them():
    hold = asyncio.Event()
    client = StoreNodeClient(max_unanswered_reads=1)
    node = Started()
    store = DictStore(ROWS, hold, short=True)
    try:
        addr = await node.start(client, store)
        first = asyncio.ensure_future(client.read(addr, "t", 0, b"k0", NO_BOUND))
        await wait_for_batches(store, 1)
        together = [asyncio.ensure_future(client.read_many(addr, "t", 0, [b"k1", b"k2"], NO_BOUND)),
                    asyncio.ensure_future(client.read_many(addr, "t", 0, [b"k3"], NO_BOUND))]
        hold.set()
        await first
        for fut in together:
            with pytest.raises(ReplicaUnavailable, match="answered 2 of 3 keys"):
                await fut
        assert store.batches == [1, 1]
    finally:
        hold.set()
        await client.close()
        await node.stop()


async def test_a_node_answering_a_group_short_is_unavailable_for_it():
    client = StoreNodeClient()
    node = Started()
    try:
        addr = await node.start(client, DictStore(ROWS, short=True))
        with pytest.raises(ReplicaUnavailable, match="answered 1 of 2 keys"):
            await client.read_many(addr, "t", 0, [b"k1", b"k2"], NO_BOUND)
    finally:
        await client.close()
        await node.stop()


async def test_a_node_that_does_not_answer_groups_fails_them_at_once_and_keeps_serving_gets():
    client = StoreNodeClient(max_unanswered_reads=1)
    node = Started()
    try:
        addr = await node.start(client, DictStore(ROWS, groups=False))
        for _ in range(3):  # each answer settles its batch: the stream never stalls on what was left out
            with pytest.raises(ReplicaUnavailable, match="no answer to a group or range read"):
                await asyncio.wait_for(client.read_many(addr, "t", 0, [b"k1"], NO_BOUND), 5)
        assert (await asyncio.wait_for(client.read(addr, "t", 0, b"k2", NO_BOUND), 5)).value == ROWS[b"k2"]
    finally:
        await client.close()
        await node.stop()


async def wait_for_batches(store, n):
    for _ in range(200):
        if len(store.batches) >= n:
            return
        await asyncio.sleep(0.01)


async def test_past_the_unanswered_reads_limit_reads_wait_and_leave_together():
    hold = asyncio.Event()
    store = DictStore(ROWS, hold)
    client = StoreNodeClient(max_unanswered_reads=2)
    node = Started()
    try:
        addr = await node.start(client, store)
        first = [asyncio.ensure_future(client.read(addr, "t", 0, b"k0", NO_BOUND))]
        await wait_for_batches(store, 1)
        # Below the limit a read leaves at once, alone (the node reads it once it has
        # answered the first batch: a stream's batches are answered one after the other).
        first.append(asyncio.ensure_future(client.read(addr, "t", 0, b"k1", NO_BOUND)))
        await asyncio.sleep(0.3)  # generous: the machine may be busy
        # Two reads unanswered: these wait, and leave as one batch when an answer arrives.
        waiting = [asyncio.ensure_future(client.read(addr, "t", 0, f"k{i}".encode(), NO_BOUND))
                   for i in range(2, 7)]
        await asyncio.sleep(0.3)
        waiting[0].cancel()  # given up on (a timeout, a lost hedge) while it waited: not sent
        hold.set()
        assert [r.value for r in await asyncio.gather(*first)] == [ROWS[b"k0"], ROWS[b"k1"]]
        results = await asyncio.gather(*waiting[1:])
        assert [r.value for r in results] == [ROWS[f"k{i}".encode()] for i in range(3, 7)]
        assert store.batches == [1, 1, 4]
    finally:
        hold.set()
        await client.close()
        await node.stop()


async def test_broken_stream_fails_in_flight_reads_as_retryable_then_reconnects():
    hold = asyncio.Event()
    store = DictStore(ROWS, hold)
    client = StoreNodeClient()
    node = Started()
    try:
        addr = await node.start(client, store)
        pending = [asyncio.ensure_future(client.read(addr, "t", 0, b"k1", NO_BOUND)) for _ in range(3)]
        await wait_for_batches(store, 1)
        assert store.batches
        await node.stop()  # the node goes away with reads in flight
        for fut in pending:
            with pytest.raises(ReplicaUnavailable):
                await asyncio.wait_for(fut, 5)
        # Nothing listens: a read fails fast and retryable instead of hanging.
        with pytest.raises(ReplicaUnavailable):
            await asyncio.wait_for(client.read(addr, "t", 0, b"k1", NO_BOUND), 5)
        # The node is back on the same read port: the next read opens a new stream.
        store2 = DictStore(ROWS)
        addr = await node.start(client, store2)
        result = None
        for _ in range(50):
            try:
                result = await asyncio.wait_for(client.read(addr, "t", 0, b"k2", NO_BOUND), 5)
                break
            except ReplicaUnavailable:
                await asyncio.sleep(0.1)
        assert result is not None and result.value == ROWS[b"k2"]
    finally:
        hold.set()
        await client.close()
        await node.stop()


async def test_a_node_back_with_another_read_port_is_read_there():
    client = StoreNodeClient()
    first, second = Started(), Started()
    try:
        store1, store2 = DictStore({b"k": b"1"}), DictStore({b"k": b"2"})
        addr = await first.start(client, store1)
        assert (await client.read(addr, "t", 0, b"k", NO_BOUND)).value == b"1"
        await second.start(client, store2)
        # The same node, with a new read port (restarted): the old connection goes.
        client.track({addr: second.server.read_address})
        assert (await client.read(addr, "t", 0, b"k", NO_BOUND)).value == b"2"
        assert store1.batches == [1] and store2.batches == [1]
    finally:
        await client.close()
        await first.stop()
        await second.stop()


async def test_a_node_that_advertises_no_read_port_fails_every_read_at_once_as_unavailable():
    client = StoreNodeClient()
    client.track({"127.0.0.1:1": None})
    try:
        for read in (client.read("127.0.0.1:1", "t", 0, b"k", NO_BOUND),
                     client.read_range("127.0.0.1:1", "t", 0, b"", b"", 10, None, NO_BOUND)):
            with pytest.raises(ReplicaUnavailable, match="advertises no read port"):
                await asyncio.wait_for(read, 1)
    finally:
        await client.close()


async def test_a_read_port_that_never_accepts_fails_reads_after_the_connect_timeout(monkeypatch):
    import socket

    from freshroute.routing import store

    monkeypatch.setattr(store._ReadStream, "_CONNECT_TIMEOUT_S", 0.3)
    # A listener that never accepts, its backlog filled: further connects get no answer.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(8):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    client = StoreNodeClient()
    client.track({"127.0.0.1:1": f"127.0.0.1:{port}"})
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ReplicaUnavailable, match="connect timeout"):
            await asyncio.wait_for(client.read("127.0.0.1:1", "t", 0, b"k", NO_BOUND), 5)
        assert loop.time() - started < 3
    finally:
        await client.close()
        for s in fillers:
            s.close()
        listener.close()

"""GrpcStoreClient against an in-process StoreNode on loopback: batching, failure, reconnection."""

import asyncio

import grpc
import pytest

from freshroute.errors import ReplicaUnavailable
from freshroute.metadata import ReplicaState, Role
from proto import store_pb2, store_pb2_grpc

from router.store_client import GrpcStoreClient, ReadStatus, StoreBound

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class DictStore(store_pb2_grpc.StoreNodeServicer):
    def __init__(self, rows, hold=None):
        self.rows = rows
        self.batches: list[int] = []
        self.hold = hold  # an Event: results wait for it

    def answer(self, r):
        status = store_pb2.ReplicaStatus(node="s1", role=store_pb2.STANDBY, state=store_pb2.SERVING_STANDBY,
                                         applied_offset=10, end_offset=12, lag_offsets=2, staleness_ms=40)
        if r.bound.HasField("max_lag") and r.bound.max_lag < 2:
            return store_pb2.KeyResult(id=r.id, status=store_pb2.TOO_STALE, replica=status)
        if r.key not in self.rows:
            return store_pb2.KeyResult(id=r.id, status=store_pb2.NOT_FOUND, replica=status)
        return store_pb2.KeyResult(id=r.id, status=store_pb2.OK, value=self.rows[r.key], replica=status)

    async def Read(self, request_iterator, context):
        async for batch in request_iterator:
            self.batches.append(len(batch.reads))
            if self.hold is not None:
                await self.hold.wait()
            yield store_pb2.ResultBatch(results=[self.answer(r) for r in batch.reads])

    async def Scan(self, request, context):
        keys = sorted(k for k in self.rows if k.startswith(request.prefix))
        for i in range(0, len(keys), 2):  # several chunks
            yield store_pb2.ScanChunk(status=store_pb2.OK, entries=[
                store_pb2.ScanEntry(key=k, value=self.rows[k]) for k in keys[i:i + 2]])


async def start(servicer, port=0):
    server = grpc.aio.server()
    store_pb2_grpc.add_StoreNodeServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


ROWS = {f"k{i}".encode(): f'{{"v":{i}}}'.encode() for i in range(20)}


async def test_reads_issued_together_travel_in_one_batch_and_match_by_id():
    store = DictStore(ROWS)
    server, port = await start(store)
    client = GrpcStoreClient()
    try:
        addr = f"127.0.0.1:{port}"
        keys = [f"k{i}".encode() for i in range(20)] + [b"missing"]
        results = await asyncio.gather(*(client.read(addr, "t", 0, k, StoreBound()) for k in keys))
        assert [r.value for r in results[:20]] == [ROWS[k] for k in keys[:20]]
        assert results[20].status is ReadStatus.NOT_FOUND
        assert store.batches == [21]
        rep = results[0].replica
        assert (rep.node, rep.role, rep.state, rep.lag_offsets, rep.staleness_ms) == (
            "s1", Role.STANDBY, ReplicaState.STANDBY, 2, 40)
        stale = await client.read(addr, "t", 0, b"k1", StoreBound(max_lag=1))
        assert stale.status is ReadStatus.TOO_STALE
        scan = await client.scan(addr, "t", 0, b"k1", b"", b"", 0, StoreBound(), 5)
        assert [k for k, _ in scan.entries] == sorted(k for k in ROWS if k.startswith(b"k1"))
    finally:
        await client.close()
        await server.stop(None)


async def wait_for_batches(store, n):
    for _ in range(200):
        if len(store.batches) >= n:
            return
        await asyncio.sleep(0.01)


async def test_past_the_unanswered_reads_limit_reads_wait_and_leave_together():
    hold = asyncio.Event()
    store = DictStore(ROWS, hold)
    server, port = await start(store)
    client = GrpcStoreClient(max_unanswered_reads=2)
    addr = f"127.0.0.1:{port}"
    try:
        first = [asyncio.ensure_future(client.read(addr, "t", 0, b"k0", StoreBound()))]
        await wait_for_batches(store, 1)
        # Below the limit a read leaves at once, alone (the node reads it once it has
        # answered the first batch: a stream's batches are answered one after the other).
        first.append(asyncio.ensure_future(client.read(addr, "t", 0, b"k1", StoreBound())))
        await asyncio.sleep(0.3)  # generous: the machine may be busy
        # Two reads unanswered: these wait, and leave as one batch when an answer arrives.
        waiting = [asyncio.ensure_future(client.read(addr, "t", 0, f"k{i}".encode(), StoreBound()))
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
        await server.stop(None)


async def test_broken_stream_fails_in_flight_reads_as_retryable_then_reconnects():
    hold = asyncio.Event()
    store = DictStore(ROWS, hold)
    server, port = await start(store)
    client = GrpcStoreClient()
    addr = f"127.0.0.1:{port}"
    try:
        pending = [asyncio.ensure_future(client.read(addr, "t", 0, b"k1", StoreBound())) for _ in range(3)]
        for _ in range(100):
            if store.batches:
                break
            await asyncio.sleep(0.01)
        await server.stop(None)  # the node goes away with reads in flight
        for fut in pending:
            with pytest.raises(ReplicaUnavailable):
                await asyncio.wait_for(fut, 5)
        # Nothing listens: a read fails fast and retryable instead of hanging.
        with pytest.raises(ReplicaUnavailable):
            await asyncio.wait_for(client.read(addr, "t", 0, b"k1", StoreBound()), 5)
        # The node is back on the same address: the next read opens a new stream.
        store2 = DictStore(ROWS)
        server, _ = await start(store2, port)
        result = None
        for _ in range(50):
            try:
                result = await asyncio.wait_for(client.read(addr, "t", 0, b"k2", StoreBound()), 5)
                break
            except ReplicaUnavailable:
                await asyncio.sleep(0.1)  # the channel's reconnect backoff
        assert result is not None and result.value == ROWS[b"k2"]
    finally:
        hold.set()
        await client.close()
        await server.stop(None)


async def test_scan_of_unreachable_node_is_replica_unavailable():
    client = GrpcStoreClient()
    try:
        with pytest.raises(ReplicaUnavailable):
            await client.scan("127.0.0.1:1", "t", 0, b"", b"", b"", 10, StoreBound(), 2)
    finally:
        await client.close()

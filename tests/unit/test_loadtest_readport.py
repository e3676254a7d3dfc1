"""The read-port tool against a node's read port in a thread of its own: one batch answered, load flat out and paced."""

import asyncio
import threading

import pytest

from freshroute.wire import FrameReader, frame
from loadtest.readport import latencies, read_batch, throughput
from proto import store_pb2

READ = store_pb2.ReadBatch(reads=[store_pb2.KeyRead(id=7, table="t", partition=0, key=b"k")])


@pytest.fixture
def read_port():
    """A read port answering every KeyRead with its key as the value; (address, batches answered)."""
    loop = asyncio.new_event_loop()
    answered = [0]
    started = threading.Event()
    address: list[str] = []

    async def serve(reader, writer):
        frames = FrameReader()
        while data := await reader.read(65536):
            for payload in frames.feed(data):
                batch = store_pb2.ReadBatch.FromString(payload)
                answered[0] += 1
                writer.write(frame(store_pb2.ResultBatch(results=[
                    store_pb2.KeyResult(id=r.id, status=store_pb2.OK, value=r.key) for r in batch.reads])
                    .SerializeToString()))
        writer.close()

    stop = asyncio.Event()

    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        address.append(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        started.set()
        await stop.wait()
        server.close()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    assert started.wait(5)
    yield address[0], answered
    loop.call_soon_threadsafe(stop.set)
    thread.join(5)
    assert not thread.is_alive()


def test_one_batch_is_answered(read_port):
    address, answered = read_port
    [result] = read_batch(address, READ).results
    assert (result.id, result.status, result.value) == (7, store_pb2.OK, b"k") and answered[0] == 1


def test_load_flat_out_counts_the_batches_the_node_answered(read_port):
    address, answered = read_port
    rate = throughput(address, READ, connections=2, in_flight=4, duration_s=0.5)
    assert rate > 100
    # Every answer counted was one the node gave (it may have answered a few more sent just before the end).
    assert rate * 0.5 * 0.8 <= answered[0]


def test_paced_load_times_each_round_trip(read_port):
    address, answered = read_port
    lat = latencies(address, READ, rate=40, duration_s=0.5)
    assert len(lat) == 20 == answered[0] and all(0 < x < 1000 for x in lat)

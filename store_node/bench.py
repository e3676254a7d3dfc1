"""Measure a store node on a throwaway broker and Redis: restore rate against a raw consume, and reads.

``python -m store_node.bench --records 400000`` produces a changelog, times a plain
confluent-kafka consumer reading it end to end (best of two), then times real store node
processes restoring the same changelog into RocksDB (records/s from "every replica assigned"
to "every replica caught up", best of two), each also in records per CPU-second, and finally
read throughput over the ``Read`` stream at several batch sizes and over unary ``Get``. Everything runs on loopback in a temporary directory and is stopped
by its own pid.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 8


def _produce(bootstrap: str, topic: str, records: int, keys: int) -> float:
    from confluent_kafka import Producer

    from freshroute.keys import partition_for

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 2_000_000})
    start = time.monotonic()
    for i in range(records):
        key = f"key-{i % keys}".encode()
        value = b'{"count": %d, "sum": %d.5, "last": "2026-01-01T00:00:00Z"}' % (i, i)
        producer.produce(topic, key=key, value=value, partition=partition_for(key, PARTITIONS))
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return time.monotonic() - start


def _raw_consume(bootstrap: str, topic: str, records: int, timeout_s: float = 300) -> float:
    """Seconds for one consumer (same fetch bounds as a store node) to read every record."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-raw", "enable.auto.commit": False,
                         "enable.partition.eof": True, "max.partition.fetch.bytes": 256 * 1024,
                         "fetch.max.bytes": 4 << 20, "fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 0})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    start = time.monotonic()
    seen, ended = 0, set()
    while len(ended) < PARTITIONS and time.monotonic() - start < timeout_s:
        first = consumer.poll(0.1)
        if first is None:
            continue
        for m in [first, *consumer.consume(4999, 0)]:
            if m.error() is None:
                seen += 1
                m.key(), m.value()
            elif m.error().code() == KafkaError._PARTITION_EOF:
                ended.add(m.partition())
    elapsed = time.monotonic() - start
    consumer.close()
    if seen != records:
        raise RuntimeError(f"raw consume saw {seen} of {records} records")
    return elapsed


def _cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system, every thread) used so far by this process or by ``pid``.

    On a shared machine wall-clock rates swing with whatever else runs; CPU time per record is
    what the code itself costs, so the bench reports both.
    """
    if pid is None:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_node(bootstrap: str, redis_url: str, data_dir: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    """A store node process of its own; returns it and the address it listens on."""
    env = {**os.environ, "FRESHROUTE_NODE_ID": "bench", "FRESHROUTE_BOOTSTRAP_SERVERS": bootstrap,
           "FRESHROUTE_REDIS_URL": redis_url, "FRESHROUTE_NAMESPACE": "bench", "FRESHROUTE_DATA_DIR": str(data_dir),
           "FRESHROUTE_NODE_EXPIRY_MS": "300", "PYTHONPATH": str(REPO)}
    with open(log_path, "wb") as log:
        node = subprocess.Popen([sys.executable, "-m", "store_node"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=log, stdin=subprocess.DEVNULL)
    return node, node.stdout.readline().decode().split()[-1]


def _timed_restore(node: subprocess.Popen, stub) -> tuple[float, float, float]:
    """Seconds and node CPU seconds from every replica assigned to every replica caught up, and from listening."""
    from proto import store_pb2

    listening = time.monotonic()
    assigned = None
    cpu_assigned = _cpu_s(node.pid)
    while time.monotonic() - listening < 600:
        st = stub.Status(store_pb2.StatusRequest(), timeout=5)
        if assigned is None and st.replicas:
            assigned = time.monotonic()
            cpu_assigned = _cpu_s(node.pid)
        if len(st.replicas) == PARTITIONS and all(r.state != store_pb2.RESTORING and r.lag_offsets == 0
                                                  for r in st.replicas):
            break
        # Every Status call costs the node CPU it would otherwise spend restoring: ask at most
        # 20 times a second (the end is known to within 50 ms).
        time.sleep(0.05)
    done = time.monotonic()
    return done - (assigned or listening), _cpu_s(node.pid) - cpu_assigned, done - listening


def _stop(node: subprocess.Popen) -> None:
    if node.poll() is None:
        node.terminate()
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m store_node.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args(argv)

    import grpc
    from confluent_kafka.admin import AdminClient, NewTopic

    from freshroute.keys import partition_for
    from freshroute.local.services import start_broker, start_redis
    from freshroute.metadata import MetadataStore, TableSpec
    from proto import store_pb2, store_pb2_grpc

    work = Path(tempfile.mkdtemp(prefix="store-node-bench-"))
    broker = start_broker(work / "services")
    redis_svc = start_redis(work / "services")
    node: subprocess.Popen | None = None
    try:
        spec = TableSpec("bench", "bench.changelog", PARTITIONS, "key", standby_replicas=0)
        admin = AdminClient({"bootstrap.servers": broker.address})
        admin.create_topics([NewTopic(spec.topic, PARTITIONS, 1)])[spec.topic].result(30)
        took = _produce(broker.address, spec.topic, args.records, args.keys)
        print(f"produced {args.records} records over {args.keys} keys in {took:.1f}s")
        raw_runs = []
        for _ in range(2):
            cpu0 = _cpu_s()
            took = _raw_consume(broker.address, spec.topic, args.records)
            raw_runs.append((took, _cpu_s() - cpu0))
        raw, raw_cpu = min(raw_runs)
        print(f"raw confluent-kafka consume: {args.records / raw:,.0f} records/s ({raw:.2f}s, best of 2); "
              f"{args.records / raw_cpu:,.0f} records per CPU-second")

        MetadataStore.from_url(redis_svc.address, "bench").register_tables([spec])
        # Like the raw consume, the best of two restores, each by a new node into an empty directory.
        restores = []
        for run in ("a", "b"):
            if node is not None:
                _stop(node)
            node, address = _start_node(broker.address, redis_svc.address, work / f"node-{run}", work / f"node-{run}.log")
            stub = store_pb2_grpc.StoreNodeStub(grpc.insecure_channel(address))
            restores.append(_timed_restore(node, stub))
        restore, restore_cpu, from_listening = min(restores)
        print(f"store node restore: {args.records / restore:,.0f} records/s ({restore:.2f}s from every replica "
              f"assigned to every replica caught up, best of 2; {from_listening:.2f}s from listening); "
              f"{args.records / restore_cpu:,.0f} records per CPU-second")
        print(f"restore / raw consume: {raw / restore:.2f} by wall clock, {raw_cpu / restore_cpu:.2f} by CPU time")

        keys = [f"key-{i}".encode() for i in range(args.keys)]
        for batch, rounds in ((1, 3000), (10, 2000), (100, 300)):
            requests = [store_pb2.ReadBatch(reads=[
                store_pb2.KeyRead(id=j, table="bench", key=keys[(r * batch + j) % args.keys],
                                  partition=partition_for(keys[(r * batch + j) % args.keys], PARTITIONS))
                for j in range(batch)]) for r in range(rounds)]
            start = time.monotonic()
            ok = sum(x.status == store_pb2.OK for b in stub.Read(iter(requests), timeout=300) for x in b.results)
            took = time.monotonic() - start
            print(f"Read stream, {batch} per batch: {batch * rounds / took:,.0f} reads/s ({ok} OK)")
        start = time.monotonic()
        for i in range(1000):
            stub.Get(store_pb2.KeyRead(table="bench", key=keys[i], partition=partition_for(keys[i], PARTITIONS)),
                     timeout=5)
        print(f"unary Get: {1000 / (time.monotonic() - start):,.0f} reads/s")
    finally:
        if node is not None:
            _stop(node)
        broker.stop()
        redis_svc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

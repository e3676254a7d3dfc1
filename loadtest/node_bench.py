"""Measure a store node on a throwaway broker and Redis: restore rate against a raw consume, and reads.

``python -m loadtest.node_bench --records 400000`` produces a changelog, times a plain
confluent-kafka consumer reading it end to end (best of two), then times real store node
processes restoring the same changelog into RocksDB (records/s from "every replica assigned"
to "every replica caught up", best of two), each also in records per CPU-second, and finally
read throughput on its read port at several batch sizes (:mod:`loadtest.readport`).
Everything runs on loopback in a temporary directory and is stopped by its own pid. The
changelog, the node process and the wait for its restore are those of ``freshroute bench``
(``loadtest/restore.py``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from loadtest.restore import PARTITIONS, cpu_s, produce_changelog, start_node, stop_node, wait_restored


def _raw_consume(bootstrap: str, topic: str, records: int) -> float:
    """Seconds for one plain consumer, with the fetch bounds of a store node, to read every record."""
    from freshroute.changelog_reader import consume_to_end

    seen, seconds, _ends = consume_to_end(bootstrap, topic, timeout_s=300, kafka_config={
        "max.partition.fetch.bytes": 256 * 1024, "fetch.max.bytes": 4 << 20})
    if seen != records:
        raise RuntimeError(f"raw consume saw {seen} of {records} records")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.node_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args(argv)

    from confluent_kafka.admin import AdminClient, NewTopic

    from freshroute.keys import partition_for
    from freshroute.metadata.store import MetadataStore
    from freshroute.metadata.tables import TableSpec
    from loadtest.readport import read_batch, throughput
    from proto import store_pb2
    from tools.local.services import start_broker, start_redis

    work = Path(tempfile.mkdtemp(prefix="store-node-bench-"))
    broker = start_broker(work / "services")
    redis_svc = start_redis(work / "services")
    node: subprocess.Popen | None = None
    try:
        spec = TableSpec("bench", "bench.changelog", PARTITIONS, "key", standby_replicas=0)
        admin = AdminClient({"bootstrap.servers": broker.address})
        admin.create_topics([NewTopic(spec.topic, PARTITIONS, 1)])[spec.topic].result(30)
        took = produce_changelog(broker.address, spec.topic, args.records, args.keys)
        print(f"produced {args.records} records over {args.keys} keys in {took:.1f}s")
        raw_runs = []
        for _ in range(2):
            cpu0 = cpu_s()
            took = _raw_consume(broker.address, spec.topic, args.records)
            raw_runs.append((took, cpu_s() - cpu0))
        raw, raw_cpu = min(raw_runs)
        print(f"raw confluent-kafka consume: {args.records / raw:,.0f} records/s ({raw:.2f}s, best of 2); "
              f"{args.records / raw_cpu:,.0f} records per CPU-second")

        MetadataStore.from_url(redis_svc.address, "bench").register_tables([spec])
        # Like the raw consume, the best of two restores, each by a new node into an empty directory.
        restores = []
        for run in ("a", "b"):
            if node is not None:
                stop_node(node)
            node, address, read_address = start_node(broker.address, redis_svc.address, "bench", "bench",
                                                     work / f"node-{run}", work / f"node-{run}.log")
            waited = wait_restored(node, address, PARTITIONS, 600)
            restores.append((waited["seconds"], waited["cpu_s"], waited["from_listening_s"]))
        restore, restore_cpu, from_listening = min(restores)
        print(f"store node restore: {args.records / restore:,.0f} records/s ({restore:.2f}s from every replica "
              f"assigned to every replica caught up, best of 2; {from_listening:.2f}s from listening); "
              f"{args.records / restore_cpu:,.0f} records per CPU-second")
        print(f"restore / raw consume: {raw / restore:.2f} by wall clock, {raw_cpu / restore_cpu:.2f} by CPU time")

        keys = [f"key-{i}".encode() for i in range(args.keys)]
        for batch in (1, 10, 100):
            reads = store_pb2.ReadBatch(reads=[
                store_pb2.KeyRead(id=j, table="bench", key=keys[j % args.keys],
                                  partition=partition_for(keys[j % args.keys], PARTITIONS)) for j in range(batch)])
            assert all(x.status == store_pb2.OK for x in read_batch(read_address, reads).results)
            rate = throughput(read_address, reads, connections=2, in_flight=4, duration_s=3.0)
            print(f"read port, {batch} per batch: {rate * batch:,.0f} reads/s ({rate:,.0f} batches/s)")
    finally:
        if node is not None:
            stop_node(node)
        broker.stop()
        redis_svc.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

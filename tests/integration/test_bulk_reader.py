"""The native bulk restore reader (native/bulkload) on a real broker: what it writes is what the changelog says.

A changelog with updates, deletes and poison is read to its end in small chunks; the table files it writes,
ingested by replica stores, hold each key's latest valid change and nothing else, and the chunks account for
every offset. Failures come back as ReadFailed. No Spark, no shared stack (``light``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from freshroute_bulkload import ChangelogReader, ReadFailed

from freshroute import input_position
from store_node.replica_store import ReplicaStore
from store_node.settings import StoreNodeSettings

pytestmark = [pytest.mark.integration, pytest.mark.light]

PARTITIONS = 3


def make_topic(broker: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)


def reader_config(broker: str, node_id: str = "bulk-test") -> dict[str, str]:
    return StoreNodeSettings(node_id=node_id, bootstrap_servers=broker).bulk_reader_config()


def read_all(reader: ChangelogReader, timeout_s: float = 60.0) -> list:
    """Every chunk until each partition's last (a chunk per partition at least)."""
    chunks, last = [], set()
    deadline = time.monotonic() + timeout_s
    while len(last) < PARTITIONS:
        assert time.monotonic() < deadline, f"partitions {sorted(last)} of {PARTITIONS} read to their end"
        chunk = reader.next_chunk(1.0)
        if chunk is not None:
            chunks.append(chunk)
            if chunk.last:
                last.add(chunk.partition)
    return chunks


def read_from_start(broker: str, topic: str, dirs: dict[int, Path], chunk_bytes: int) -> list:
    """Every chunk of the partitions of ``dirs`` (partition → its table files' directory), read from their start."""
    reader = ChangelogReader(reader_config(broker), topic, [(p, 0, str(d)) for p, d in dirs.items()], "string", "json",
                             chunk_bytes=chunk_bytes)
    try:
        return read_all(reader)
    finally:
        reader.close()


def test_the_files_hold_each_keys_latest_valid_change_and_the_chunks_every_offset(broker, namespace, tmp_path):
    topic = f"{namespace}-bulk"
    make_topic(broker, topic)
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 5})
    # What each partition holds, from the delivery reports: (offset, key, value, why it is poison or None).
    written: dict[int, list[tuple[int, bytes | None, bytes | None, str | None]]] = {p: [] for p in range(PARTITIONS)}

    def send(p: int, key: bytes | None, value: bytes | None, problem: str | None = None) -> None:
        def delivered(err, msg) -> None:
            assert err is None, err
            written[p].append((msg.offset(), key, value, problem))

        producer.produce(topic, key=key, value=value, partition=p, on_delivery=delivered)

    for round_ in range(4):
        for i in range(3_000):
            p = i % PARTITIONS
            send(p, f"k{i}".encode(), json.dumps({"i": i, "round": round_, "pad": "x" * 100}).encode())
            if round_ == 2 and i % 10 == 0:
                send(p, f"k{i}".encode(), None)  # deleted, written again next round
            if round_ == 3 and i % 7 == 0:
                send(p, f"k{i}".encode(), None)  # deleted for good
    send(0, b"k3", b"{not json", "value is not JSON")  # k3 keeps its last valid value
    send(1, None, b"1", "null key")
    send(2, b"\xff\xfe", b"1", "key is not UTF-8")
    assert producer.flush(30) == 0
    expected: dict[int, dict[bytes, bytes]] = {p: {} for p in range(PARTITIONS)}
    poison: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
    ends = {}
    for p, records in written.items():
        for offset, key, value, problem in sorted(records, key=lambda r: r[0]):
            if problem is not None:
                poison[p].append((offset, problem))
            elif value is None:
                expected[p].pop(key, None)
            else:
                expected[p][key] = value
        ends[p] = len(records)

    dirs = {p: tmp_path / str(p) for p in range(PARTITIONS)}
    stores = {p: ReplicaStore.open(d, bulk_load=True) for p, d in dirs.items()}
    try:
        # Small chunks: every partition is written in several files, each key's changes spread over them.
        chunks = read_from_start(broker, topic, dirs, chunk_bytes=256 * 1024)
        for p in range(PARTITIONS):
            mine = [c for c in chunks if c.partition == p]
            assert len(mine) >= 3 and mine[-1].last and not any(c.last for c in mine[:-1])
            assert [c.next_offset for c in mine] == sorted(c.next_offset for c in mine)
            assert mine[-1].next_offset == ends[p] and mine[-1].end_offset == ends[p]
            assert sum(c.records for c in mine) == ends[p]
            assert sum(c.skipped for c in mine) == len(poison[p])
            assert [x for c in mine for x in c.problems] == poison[p]
            assert sum(c.superseded for c in mine) == 0 and sum(c.unpositioned for c in mine) == sum(
                c.records - c.skipped for c in mine)  # no row here has an input position
            for c in mine:
                assert c.positions is None
                stores[p].ingest(c.file and Path(c.file), None, c.next_offset)
            assert stores[p].applied_offset == ends[p]
            assert dict(stores[p]._db.items()) == expected[p]
        assert not [f for d in dirs.values() for f in d.glob("load-*.sst")]
    finally:
        for store in stores.values():
            store.close()


def test_a_replays_older_rows_are_not_applied_across_chunks_and_the_positions_go_with_the_rows(broker, namespace,
                                                                                                 tmp_path):
    # A Real-time query's changelog after a crash: each key's row at input offset 9, then the replay's older ones
    # (4, 6), then for every third key the replay caught up (10); some keys deleted with a position, one without.
    topic = f"{namespace}-replayed"
    make_topic(broker, topic)
    # Idempotent: a retried batch keeps its place, so each partition holds the rows in the order they were sent.
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 5, "enable.idempotence": True})
    keys = [f"k{i}".encode() for i in range(1_500)]

    def send(key: bytes, value: bytes | None, position: list | None) -> None:
        headers = None if position is None else [(input_position.HEADER, input_position.encode(position))]
        producer.produce(topic, key=key, value=value, partition=int(key[1:]) % PARTITIONS, headers=headers)

    pad = "x" * 200
    for at in (9, 4, 6):
        for key in keys:
            send(key, json.dumps({"at": at, "pad": pad}).encode(), [None, at])
    for key in keys[::3]:
        send(key, json.dumps({"at": 10, "pad": pad}).encode(), [None, 10])
    for key in keys[1::50]:
        send(key, None, [None, 11])  # deleted, its position kept: an older row after it is not applied
        send(key, json.dumps({"at": 5, "pad": pad}).encode(), [None, 5])
    send(keys[2], None, None)  # deleted by hand: its position forgotten, the next row applied whatever it says
    send(keys[2], json.dumps({"at": 1, "pad": pad}).encode(), [None, 1])
    assert producer.flush(30) == 0
    want = {key: 10 if i % 3 == 0 else 9 for i, key in enumerate(keys)}
    for key in keys[1::50]:
        del want[key]
    want[keys[2]] = 1
    held = {key: b"[null,10]" if i % 3 == 0 else b"[null,9]" for i, key in enumerate(keys)}
    held.update({key: b"[null,11]" for key in keys[1::50]})
    held[keys[2]] = b"[null,1]"

    dirs = {p: tmp_path / str(p) for p in range(PARTITIONS)}
    stores = {p: ReplicaStore.open(d, bulk_load=True) for p, d in dirs.items()}
    try:
        # Small chunks: a key's newer row and the replay's older ones fall in different files.
        chunks = read_from_start(broker, topic, dirs, chunk_bytes=64 * 1024)
        assert min(sum(1 for c in chunks if c.partition == p) for p in range(PARTITIONS)) >= 5
        for c in chunks:
            stores[c.partition].ingest(c.file and Path(c.file), c.positions and Path(c.positions), c.next_offset)
        served = {key: json.loads(value)["at"] for store in stores.values() for key, value in store._db.items()}
        assert served == want
        positions = {key: store.positions_of([key])[0] for store in stores.values() for key in keys
                     if store.positions_of([key])[0] is not None}
        assert positions == held
        # 4 and 6 of every key, and the 5 after a positioned delete; keys[2]'s 1 came after its position was forgotten.
        assert sum(c.superseded for c in chunks) == 2 * len(keys) + len(keys[1::50])
        assert sum(c.unpositioned for c in chunks) == 1  # the delete by hand
    finally:
        for store in stores.values():
            store.close()


def test_a_changelog_not_there_yet_is_waited_for(broker, namespace, tmp_path):
    topic = f"{namespace}-later"
    reader = ChangelogReader(reader_config(broker), topic, [(p, 0, str(tmp_path)) for p in range(1)], "string", "json")
    try:
        assert reader.next_chunk(3.0) is None  # as the tailer's replicas do: they wait for it
        make_topic(broker, topic)
        producer = Producer({"bootstrap.servers": broker})
        for i in range(10):
            producer.produce(topic, key=b"k%d" % i, value=b"1", partition=0)
        producer.flush(30)
        deadline = time.monotonic() + 60
        while (chunk := reader.next_chunk(1.0)) is None or not chunk.last:
            assert time.monotonic() < deadline, "the reader to read the topic created after it started"
        assert chunk.partition == 0 and chunk.next_offset == 10 and chunk.rows == 10
    finally:
        reader.close()


def test_failures_come_back_as_read_failed(broker, namespace, tmp_path):
    topic = f"{namespace}-short"
    make_topic(broker, topic)
    producer = Producer({"bootstrap.servers": broker})
    for i in range(10):
        producer.produce(topic, key=b"k%d" % i, value=b"1", partition=0)
    producer.flush(30)
    # A position past the end (the changelog was truncated or replaced): out of range, never a silent jump.
    reader = ChangelogReader(reader_config(broker), topic, [(0, 50, str(tmp_path))], "string", "json")
    try:
        with pytest.raises(ReadFailed, match="[Oo]ffset"):
            for _ in range(30):
                reader.next_chunk(1.0)
    finally:
        reader.close()
    # A directory that cannot be written.
    reader = ChangelogReader(reader_config(broker), topic, [(0, 0, str(tmp_path / "absent"))], "string", "json")
    try:
        with pytest.raises(ReadFailed, match="cannot write"):
            for _ in range(30):
                reader.next_chunk(1.0)
    finally:
        reader.close()
    with pytest.raises(ValueError, match="unknown format"):
        ChangelogReader(reader_config(broker), topic, [(0, 0, str(tmp_path))], "string", "avro")


def test_a_dropped_partition_is_passed_over(broker, namespace, tmp_path):
    topic = f"{namespace}-drop"
    make_topic(broker, topic)
    producer = Producer({"bootstrap.servers": broker})
    for i in range(3_000):
        producer.produce(topic, key=b"k%d" % i, value=b"[%d]" % i, partition=i % PARTITIONS)
    producer.flush(30)
    reader = ChangelogReader(reader_config(broker), topic,
                             [(p, 0, str(tmp_path / str(p))) for p in range(PARTITIONS)], "string", "json")
    for p in range(PARTITIONS):
        (tmp_path / str(p)).mkdir()
    try:
        reader.drop_partition(1)
        chunks, deadline = [], time.monotonic() + 60
        while sum(c.last for c in chunks) < PARTITIONS - 1:
            assert time.monotonic() < deadline
            if (chunk := reader.next_chunk(1.0)) is not None:
                chunks.append(chunk)
        assert {c.partition for c in chunks} == {0, 2}
        assert all(c.records == 1_000 for c in chunks)
        assert reader.next_chunk(0.5) is None  # and it ended: partition 1 is not waited for
    finally:
        reader.close()

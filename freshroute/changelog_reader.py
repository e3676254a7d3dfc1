"""Where topics end, and reading a changelog topic from offset 0 to its true end with a plain confluent-kafka
consumer.

The end of a partition is where the consumer reports EOF at or above the high watermark
cached from its fetch responses: the end as the reading itself found it, with no second request.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Iterable, Mapping


def end_offsets(admin: Any, partitions: Mapping[str, Iterable[int]], timeout_s: float = 10.0) -> dict[str, dict[int, int]]:
    """Each listed partition's high watermark (where its next record will go), topic by topic, in one request of
    ``admin`` (a confluent-kafka ``AdminClient``)."""
    return _list_offsets(admin, partitions, timeout_s, earliest=False)


def start_offsets(admin: Any, partitions: Mapping[str, Iterable[int]], timeout_s: float = 10.0) -> dict[str, dict[int, int]]:
    """Each listed partition's log start offset (its oldest record the broker still holds), topic by topic, in one
    request of ``admin``."""
    return _list_offsets(admin, partitions, timeout_s, earliest=True)


def _list_offsets(admin: Any, partitions: Mapping[str, Iterable[int]], timeout_s: float,
                  earliest: bool) -> dict[str, dict[int, int]]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    spec = OffsetSpec.earliest() if earliest else OffsetSpec.latest()
    wanted = {TopicPartition(t, p): spec for t, ps in partitions.items() for p in ps}
    out: dict[str, dict[int, int]] = {t: {} for t in partitions}
    if wanted:
        for tp, future in admin.list_offsets(wanted, request_timeout=timeout_s).items():
            out[tp.topic][tp.partition] = future.result(timeout_s).offset
    return out


def consume_to_end(bootstrap: str, topic: str, on_message: Callable[[Any], None] | None = None,
                   timeout_s: float = 120.0, kafka_config: dict[str, Any] | None = None,
                   progress: Callable[[int, int, int], None] | None = None) -> tuple[int, float, dict[int, int]]:
    """Consume every partition of ``topic`` from 0 to its end.

    Returns (records, seconds from the assignment to the last partition's end — like a store
    node's restore, which counts from opening the replica —, end offset per partition).
    ``on_message`` sees each record message (none when only counting).
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from freshroute.settings import kafka_client_config

    consumer = Consumer(kafka_client_config(
        bootstrap, **{"group.id": f"freshroute-read-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                      "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.queue.backoff.ms": 0,
                      "max.partition.fetch.bytes": 1 << 20,
                      # The broker may hold an empty fetch this long; the end of a partition is
                      # only known after one, so a long wait would be counted as reading time.
                      "fetch.wait.max.ms": 10, **(kafka_config or {})}))
    try:
        meta = consumer.list_topics(topic, timeout=10)
        tmeta = meta.topics.get(topic)
        if tmeta is None or tmeta.error is not None or not tmeta.partitions:
            raise RuntimeError(f"changelog topic {topic!r} not found ({tmeta.error if tmeta else 'no such topic'})")
        partitions = sorted(tmeta.partitions)
        started = time.monotonic()
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        ends: dict[int, int] = {}
        count = 0
        last_end = started
        deadline = time.monotonic() + timeout_s
        while len(ends) < len(partitions):
            if time.monotonic() > deadline:
                missing = sorted(set(partitions) - set(ends))
                raise TimeoutError(f"{topic}: partitions {missing} did not reach their end within {timeout_s:.0f}s")
            # A short timeout: consume() waits all of it when fewer records than asked are left,
            # and that wait would count as reading time.
            for m in consumer.consume(1000, 0.01):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading {topic}[{m.partition()}]: {err}")
                    partition, offset = m.partition(), m.offset()
                    assert partition is not None and offset is not None  # a partition's EOF names both
                    _lo, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
                    if offset >= high and partition not in ends:
                        ends[partition] = offset
                        last_end = time.monotonic()
                    continue
                count += 1
                if on_message is not None:
                    on_message(m)
            if progress:
                progress(count, len(ends), len(partitions))
        return count, last_end - started, ends
    finally:
        consumer.close()

"""Where a Kafka consumer group is in its input: the records between its committed offsets and the topic's end.

A peer of freshroute (a Kafka Streams application, a Faust worker) says how far it has processed its input only by
the offsets its consumer group commits; this reads them as any operator's tool does (the group's committed offsets,
the partitions' high watermarks), without joining the group.
"""

from __future__ import annotations

from collections.abc import Mapping

NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has committed nothing for the partition


def records_behind(committed: Mapping[int, int], ends: Mapping[int, int]) -> int | None:
    """Records of the input the group has not committed; None while a partition has no committed offset."""
    if not ends or any(committed.get(p, NO_OFFSET) < 0 for p in ends):
        return None
    return sum(max(0, end - committed[p]) for p, end in ends.items())


class GroupLag:
    """A consumer group's lag on one topic, by the name of what it computes (``sample_all``, as
    :class:`loadtest.freshness.InputLag` gives freshroute's tables')."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str, timeout_s: float = 5.0) -> None:
        from confluent_kafka import Consumer

        self.topic, self.name, self.timeout_s = topic, name, timeout_s
        # Never subscribes: asking for the group's committed offsets does not join it.
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})

    def sample_all(self) -> dict[str, int | None]:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            meta = self._consumer.list_topics(self.topic, timeout=self.timeout_s).topics[self.topic]
            parts = [TopicPartition(self.topic, p) for p in meta.partitions]
            committed = {tp.partition: tp.offset for tp in self._consumer.committed(parts, timeout=self.timeout_s)}
            ends = {tp.partition: self._consumer.get_watermark_offsets(tp, timeout=self.timeout_s)[1] for tp in parts}
        except (KafkaException, KeyError):
            return {self.name: None}
        return {self.name: records_behind(committed, ends)}

    def close(self) -> None:
        self._consumer.close()

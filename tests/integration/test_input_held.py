"""How far back an input goes on the real broker, as the refusal of a table version computed from its beginning
names it: records deleted from the front of a partition (as retention does) are counted, and the time from which the
broker holds every record is that of the first record left."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.input_held import HeldInput, held_input

pytestmark = [pytest.mark.integration, pytest.mark.beside]

T0 = 1_764_583_200_000  # 2025-12-01 10:00:00 UTC


def test_records_deleted_from_an_input_are_counted_and_the_refusal_says_from_when_it_is_whole(broker):
    topic = f"held-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": broker})
    for p, count in ((0, 10), (1, 5)):  # partition 2 stays empty
        for i in range(count):
            producer.produce(topic, key=b"k", value=b"v", partition=p, timestamp=T0 + p * 60_000 + i * 1000)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": broker, "group.id": "held-test", "enable.auto.commit": False})
    try:
        assert held_input(consumer, topic) == HeldInput(topic, 3, 0, 0, None)  # whole: nothing read
        for tp in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
            tp.result(30)
        held = held_input(consumer, topic)
        assert held == HeldInput(topic, 3, 4, 1, T0 + 4000)
        assert "topic %s holds every record only from 2025-12-01 10:00:04 UTC on, 4 record(s) of 1 of its 3" % topic \
            in held.refusal()
    finally:
        consumer.close()
        admin.delete_topics([topic])

"""The pipeline's changelog producer against the real broker, without Spark."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient

from tools.local.services import free_port, start_broker
from pipeline.sink import ChangelogProducer
from pipeline.topics import describe_topic, ensure_topic

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no Spark, no shared stack: runs beside the others


def test_the_producer_never_recreates_a_changelog_a_restarted_broker_lost(tmp_path, namespace):
    """A memory-only broker restarts empty: the job's producer, still running, must not create the
    changelog with the broker's defaults, or the job would resume into it and publish only new changes."""
    topic = f"{namespace}.counts.changelog"
    port = free_port()
    broker = start_broker(tmp_path / "broker-1", port=port)
    try:
        ensure_topic(AdminClient({"bootstrap.servers": broker.address}), topic, 8, {"cleanup.policy": "compact"})
        producer = ChangelogProducer({"bootstrap.servers": broker.address})
        producer.get().produce(topic, key=b"k", value=b"1", partition=5)
        assert producer.get().flush(30) == 0
        broker.stop()
        broker = start_broker(tmp_path / "broker-2", port=port)
        # A record of the next batch, and the metadata request it would make.
        producer.get().produce(topic, key=b"k", value=b"2", partition=5)
        seen = producer.get().list_topics(topic, timeout=15).topics[topic]
        assert seen.error is not None and seen.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        assert describe_topic(AdminClient({"bootstrap.servers": broker.address}), topic) is None
        producer.discard()
    finally:
        broker.stop()

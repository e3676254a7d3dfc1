"""Topic administration the pipeline needs: create a topic when it is missing, with the replication it needs."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from freshroute.errors import ConfigError, RetryableError
from freshroute.settings import kafka_logging
from freshroute.topics import TopicInfo, describe_topic, failure, kafka_error, settled

log = logging.getLogger(__name__)


def ensure_topic(admin: AdminClient, topic: str, partitions: int, config: dict[str, str] | None = None,
                 timeout_s: float = 10.0, replication_factor: int = 1) -> TopicInfo:
    """Create ``topic`` if it is missing (racing creators are fine) and describe it."""
    info = describe_topic(admin, topic, timeout_s)
    if info is not None:
        return info
    try:
        admin.create_topics([NewTopic(topic, partitions, replication_factor, config=config or {})],
                            request_timeout=timeout_s)[topic].result(timeout_s)
        log.info("created topic %s (%d partitions, replication factor %d%s)", topic, partitions, replication_factor,
                 ", " + ", ".join(f"{k}={v}" for k, v in (config or {}).items()) if config else "")
    except KafkaException as e:
        err = kafka_error(e)
        if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    # The controller has created it; the broker answering may learn of it a moment later.
    deadline = time.monotonic() + timeout_s
    while (info := describe_topic(admin, topic, timeout_s)) is None:
        if time.monotonic() > deadline:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART,
                                            f"topic {topic} missing {timeout_s:.0f}s after its creation"))
        time.sleep(0.05)
    return info


# What a broker answers for a partition whose leader is being elected or not yet known to it (a topic created a moment
# ago): asked again, it answers.
_SETTLING = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
             KafkaError._TIMED_OUT)


def end_offset(consumer: Any, topic: str, partition: int, timeout_s: float = 10.0) -> int:
    """Where the partition ends now, asked again while its leader settles (up to ``timeout_s``)."""
    from confluent_kafka import TopicPartition

    tp = TopicPartition(topic, partition)
    return settled(lambda left: consumer.get_watermark_offsets(tp, timeout=left, cached=False)[1], _SETTLING,
                   timeout_s, 0.1)


def check_replication(admin: AdminClient, replication_factor: int, bootstrap: str = "", timeout_s: float = 10.0
                      ) -> int:
    """The cluster's broker count, if it can hold ``replication_factor`` copies; else a ConfigError naming the setting,
    or an UNAVAILABLE error naming ``bootstrap`` when no broker answers."""
    try:
        brokers = len(admin.list_topics(timeout=timeout_s).brokers)
    except KafkaException as e:
        raise RetryableError(f"the broker at {bootstrap or 'bootstrap_servers'} (bootstrap_servers) does not answer: "
                             f"{failure(e)}", setting="bootstrap_servers") from None
    if replication_factor > brokers:
        raise ConfigError(f"changelog_replication_factor {replication_factor} is above the cluster's {brokers} "
                          f"broker(s): a topic needs a broker per copy", setting="changelog_replication_factor",
                          brokers=brokers)
    return brokers


def admin_client(kafka: dict[str, Any]) -> AdminClient:
    return AdminClient({**kafka, **kafka_logging("pipeline.kafka")})

"""What the broker says about a topic: its id and partitions, and the configuration it runs with."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, TypeVar

from confluent_kafka import KafkaError, KafkaException


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: str
    partitions: tuple[int, ...]
    replication_factor: int = 1


def kafka_error(e: BaseException) -> KafkaError | None:
    """The KafkaError a confluent-kafka exception carries (None: it carries none)."""
    return e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None


T = TypeVar("T")


def settled(ask: Callable[[float], T], settling: Collection[int], timeout_s: float, pause_s: float) -> T:
    """What ``ask(seconds left)`` answers, asked again while the broker answers one of the ``settling`` errors — what
    it says of a topic created a moment ago until it has heard of it, or of a partition whose leader is being
    elected — for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ask(max(0.1, deadline - time.monotonic()))
        except KafkaException as e:
            err = kafka_error(e)
            if err is None or err.code() not in settling or time.monotonic() > deadline:
                raise
        time.sleep(pause_s)


def failure(e: BaseException) -> str:
    """What a failed call to the broker says went wrong: the broker's error, or that no answer came in time."""
    err = kafka_error(e)
    return err.str() if err is not None else str(e) or "no answer in time"


def describe_topic(admin: Any, topic: str, timeout_s: float = 10.0) -> TopicInfo | None:
    """The topic's id and partitions, or None when it does not exist."""
    from confluent_kafka import TopicCollection

    try:
        desc = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic].result(timeout_s)
    except KafkaException as e:
        err = kafka_error(e)
        if err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise
    return TopicInfo(topic, str(desc.topic_id),
                     tuple(sorted(p.id for p in desc.partitions)),
                     max((len(p.replicas) for p in desc.partitions), default=1) or 1)


def topic_config(admin: Any, topic: str, timeout_s: float = 10.0) -> dict[str, str]:
    """The topic's configuration as the broker applies it (its own settings and the broker's defaults)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = settled(lambda _left: admin.describe_configs([resource], request_timeout=timeout_s)[resource]
                      .result(timeout_s), (KafkaError.UNKNOWN_TOPIC_OR_PART,), timeout_s, 0.05)
    return {name: entry.value for name, entry in entries.items() if entry.value is not None}


def set_topic_config(admin: Any, topic: str, settings: dict[str, str], timeout_s: float = 10.0) -> None:
    """Set ``settings`` on the topic, leaving its other settings as they are."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entries = [ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in settings.items()]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    admin.incremental_alter_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)


# A versioned table's changelog keeps each record at least this much longer than the table's history retention, as
# Kafka Streams does for its versioned stores: a restored replica then has the versions it must keep, except one
# written more than a day before the version that replaced it (docs/tables.md, "Versioned tables").
HISTORY_COMPACTION_SLACK_MS = 86_400_000


def history_topic_config(history_retention_ms: int) -> dict[str, str]:
    """The settings of a versioned table's changelog that keep its history from compaction."""
    return {"min.compaction.lag.ms": str(history_retention_ms + HISTORY_COMPACTION_SLACK_MS)}


def keep_history(admin: Any, topic: str, config: dict[str, str], history_retention_ms: int) -> str | None:
    """Make a compacted topic (whose settings are ``config``) keep a versioned table's history: its
    min.compaction.lag.ms raised when it is shorter; what changed, or None."""
    wanted = int(history_topic_config(history_retention_ms)["min.compaction.lag.ms"])
    return keep_uncompacted(admin, topic, config, wanted, "the table's history")


def keep_uncompacted(admin: Any, topic: str, config: dict[str, str], lag_ms: int, what: str) -> str | None:
    """Raise a compacted topic's min.compaction.lag.ms to ``lag_ms`` when it is shorter (``config``: its settings;
    ``what``: what the records are kept for); what changed, or None."""
    held = config.get("min.compaction.lag.ms", "0")
    if "compact" not in config.get("cleanup.policy", "delete").split(",") or int(held) >= lag_ms:
        return None
    set_topic_config(admin, topic, {"min.compaction.lag.ms": str(lag_ms)})
    return f"topic {topic!r}: min.compaction.lag.ms set to {lag_ms} (was {held}) so that compaction keeps {what}"

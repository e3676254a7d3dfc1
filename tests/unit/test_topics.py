"""What the broker says about a topic, asked of brokers that learn of a new topic a moment apart."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException

from freshroute.topics import topic_config


class Entry:
    def __init__(self, value: str | None) -> None:
        self.value = value


class Admin:
    """describe_configs answers UNKNOWN_TOPIC_OR_PART ``unknown_for`` times, then the topic's settings."""

    def __init__(self, unknown_for: int) -> None:
        self.unknown_for = unknown_for
        self.asked = 0

    def describe_configs(self, resources, request_timeout):
        self.asked += 1
        answer: Future = Future()
        if self.asked <= self.unknown_for:
            answer.set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
        else:
            answer.set_result({"cleanup.policy": Entry("compact"), "segment.ms": Entry(None)})
        return {resources[0]: answer}


def test_a_topic_the_broker_asked_has_not_heard_of_yet_is_asked_again():
    admin = Admin(unknown_for=3)
    assert topic_config(admin, "t-changelog") == {"cleanup.policy": "compact"}
    assert admin.asked == 4


def test_a_topic_that_stays_unknown_is_an_error_after_the_timeout():
    admin = Admin(unknown_for=10**6)
    with pytest.raises(KafkaException) as e:
        topic_config(admin, "missing", timeout_s=0.2)
    assert e.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert 2 <= admin.asked <= 10

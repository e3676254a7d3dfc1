"""librdkafka's lines reach the process's logger, a failure it repeats on every reconnect once a minute."""

from __future__ import annotations

import logging
import socket
import time
import uuid

from confluent_kafka import Consumer

from freshroute.settings import QuietRepeats, kafka_client_config, kafka_logging


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_client_that_cannot_connect_logs_it_once_through_the_logger_not_on_stderr(caplog, capfd):
    name = f"test.kafka.{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.WARNING, logger=name)
    consumer = Consumer(kafka_client_config(f"127.0.0.1:{closed_port()}", **{"group.id": "test-kafka-logging",
                                                                               "reconnect.backoff.ms": 10,
                                                                               "reconnect.backoff.max.ms": 50},
                                            **kafka_logging(name)))
    try:
        deadline = time.monotonic() + 10
        refused: list[logging.LogRecord] = []
        # librdkafka retries every 10-50 ms: a second of polling sees many attempts after the first failure.
        first = None
        while time.monotonic() < deadline and (first is None or time.monotonic() - first < 1.0):
            consumer.poll(0.1)
            refused = [r for r in caplog.records if r.name == name and "Connection refused" in r.getMessage()]
            if refused and first is None:
                first = time.monotonic()
    finally:
        consumer.close()
    assert len(refused) == 1 and refused[0].levelno == logging.ERROR, [r.getMessage() for r in refused]
    assert "%3|" not in capfd.readouterr().err  # librdkafka's own format on stderr


def test_repeats_pass_once_per_interval_whatever_their_numbers():
    quiet = QuietRepeats(interval_s=60)

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("k", logging.ERROR, __file__, 1, message, None, None)

    assert quiet.filter(record("Connect to 127.0.0.1:9 failed (after 0ms)"))
    assert not quiet.filter(record("Connect to 127.0.0.1:9 failed (after 3ms)"))
    assert not quiet.filter(record("Connect to 127.0.0.1:9 failed (after 0ms, 1 identical error(s) suppressed)"))
    assert quiet.filter(record("Broker transport failure"))


def test_the_logger_carries_one_repeat_filter_however_often_it_is_asked_for():
    name = f"test.kafka.{uuid.uuid4().hex[:8]}"
    config = kafka_logging(name)
    kafka_logging(name)
    assert config["log_level"] == 4 and config["logger"] is logging.getLogger(name)
    assert sum(isinstance(f, QuietRepeats) for f in logging.getLogger(name).filters) == 1

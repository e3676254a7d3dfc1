"""What the pipeline's sink is handed, faked at its seams: the Kafka producer, and a micro-batch's rows."""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import KafkaError


class FakeProducer:
    """Acknowledges on flush/poll; can fail some deliveries and refuse the first N produces (queue full)."""

    def __init__(self, fail_keys: set[bytes] = frozenset(), fatal: bool = False, full_times: int = 0):
        self.fail_keys, self.fatal, self.full_times = fail_keys, fatal, full_times
        self.pending: list = []
        self.sent: list[tuple[str, bytes, bytes, int]] = []

    def produce(self, topic, key, value, partition, on_delivery, headers=None):
        if self.full_times:
            self.full_times -= 1
            raise BufferError("queue full")
        self.pending.append((topic, key, value, partition, on_delivery))

    def _serve(self):
        pending, self.pending = self.pending, []
        for topic, key, value, partition, cb in pending:
            if key in self.fail_keys:
                cb(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out", fatal=self.fatal), None)
            else:
                self.sent.append((topic, key, value, partition))
                cb(None, None)

    def poll(self, timeout=0):
        self._serve()
        return 0

    def flush(self, timeout=None):
        self._serve()
        return 0


class FakeBatch:
    """What ``foreachBatch`` hands the sink: a DataFrame that collects to these rows."""

    def __init__(self, rows):
        self.rows = rows

    def toArrow(self):
        return SimpleNamespace(to_pylist=lambda: self.rows)

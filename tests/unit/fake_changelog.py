"""A changelog tailer's seams, faked — its clock, the consumer and the admin client, the messages a consumer gives —
and the steps a test takes with a tailer over them."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from types import SimpleNamespace

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException

from freshroute import input_position
from freshroute.metadata.roles import Role
from freshroute.metadata.tables import TableSpec

SPEC = TableSpec("counts", "counts-changelog", 2, "k")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class Msg:
    def __init__(self, offset, key=None, value=None, partition=0, topic=SPEC.topic, error=None, headers=None,
                 timestamp_ms=0):
        self._offset, self._key, self._value = offset, key, value
        self._partition, self._topic, self._error = partition, topic, error
        self._headers, self._timestamp_ms = headers, timestamp_ms

    def timestamp(self):
        return (1, self._timestamp_ms)  # TIMESTAMP_CREATE_TIME

    def error(self):
        return self._error

    def topic(self):
        return self._topic

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def key(self):
        return self._key

    def value(self):
        return self._value

    def headers(self):
        return self._headers


class Err:
    def __init__(self, code, text="x"):
        self._code, self._text = code, text

    def code(self):
        return self._code

    def str(self):
        return self._text


def record(offset, key, value, partition=0, position=None):
    """A changelog record; ``position``: the input position it carries (freshroute.input_position), if any."""
    return Msg(offset, key.encode() if isinstance(key, str) else key,
               None if value is None else (value if isinstance(value, bytes) else json.dumps(value).encode()),
               partition, headers=None if position is None else [(input_position.HEADER, input_position.encode(position))])


def eof(offset, partition=0):
    return Msg(offset, partition=partition, error=Err(KafkaError._PARTITION_EOF))


class FakeConsumer:
    def __init__(self, config):
        self.config = config
        self.queue: list = []
        self.assigned: dict[tuple[str, int], int] = {}
        self.assign_calls: list[tuple[str, int, int]] = []
        self.closed = False
        self.pending_stats: list[str] = []
        self.watermarks: dict[tuple[str, int], int] = {}

    def incremental_assign(self, tps):
        for tp in tps:
            self.assigned[(tp.topic, tp.partition)] = tp.offset
            self.assign_calls.append((tp.topic, tp.partition, tp.offset))

    def incremental_unassign(self, tps):
        for tp in tps:
            if (tp.topic, tp.partition) not in self.assigned:  # as librdkafka refuses it
                raise KafkaException(KafkaError(KafkaError._INVALID_ARG,
                                                f"{tp.topic} [{tp.partition}] can't be unassigned since it is not in "
                                                "the current assignment"))
        for tp in tps:
            self.assigned.pop((tp.topic, tp.partition), None)

    def _serve_stats(self):
        while self.pending_stats:
            self.config["stats_cb"](self.pending_stats.pop(0))

    def poll(self, timeout):
        self._serve_stats()
        return self.queue.pop(0) if self.queue else None

    def consume(self, n, timeout):
        out, self.queue = self.queue[:n], self.queue[n:]
        return out

    def close(self):
        self.closed = True

    def get_watermark_offsets(self, tp, cached=False):
        return (0, self.watermarks.get((tp.topic, tp.partition), -1001))


class FakeAdmin:
    def __init__(self, config):
        self.config = config
        self.topic_ids: dict[str, str] = {}
        self.polls = 0  # how often its librdkafka log queue was served
        self.described = 0
        self.controller_down = False  # its DescribeTopics time out, waiting for the controller it knows of

    def poll(self, timeout=None):
        self.polls += 1
        return 0

    def describe_topics(self, collection, request_timeout=None):
        self.described += 1
        out = {}
        for topic in collection.topic_names:
            f: Future = Future()
            if self.controller_down:
                f.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT, "waiting for controller")))
            elif topic in self.topic_ids:
                f.set_result(SimpleNamespace(topic_id=self.topic_ids[topic]))
            else:
                f.set_exception(RuntimeError("unknown topic"))
            out[topic] = f
        return out


def stats(hi: dict[int, int], rx: int, state="UP", topic=SPEC.topic, rtt_max_ms=0,
          others: dict[int, int] | None = None, leader=1, fetched_from: int | None = None, leader_epoch=0,
          fetch_state="active") -> str:
    """librdkafka's statistics: broker 1 (``rx`` responses so far, the window's longest round trip) and ``others``,
    more brokers, up (node id → responses so far); ``hi``'s partitions led by ``leader`` (in ``leader_epoch``) and
    fetched from ``fetched_from`` (default: the leader) in ``fetch_state``."""
    more = {f"b/{n}": {"nodeid": n, "state": "UP", "rx": others_rx, "rtt": {"max": 0}}
            for n, others_rx in (others or {}).items()}
    broker = leader if fetched_from is None else fetched_from
    return json.dumps({
        "brokers": {"b/1": {"nodeid": 1, "state": state, "rx": rx, "rtt": {"max": rtt_max_ms * 1000}}, **more,
                    "bootstrap": {"nodeid": -1, "state": "UP", "rx": 1}},
        "topics": {topic: {"partitions": {str(p): {"leader": leader, "broker": broker, "leader_epoch": leader_epoch,
                                                   "fetch_state": fetch_state, "hi_offset": h}
                                          for p, h in hi.items()}
                                         | {"-1": {"leader": -1, "broker": -1, "hi_offset": -1001}}}},
    })


def host(env, *partitions, role=Role.ACTIVE):
    env.tailer.set_desired({("counts", p): (SPEC, role) for p in partitions})
    env.tailer.step()


def refetch(env, msgs, partition=0):
    """What the broker serves after the partition is assigned again: its messages from that offset."""
    offset = env.consumer.assigned[(SPEC.topic, partition)]
    start = 0 if offset == OFFSET_BEGINNING else offset
    env.consumer.queue += [m for m in msgs if m.partition() == partition and m.offset() >= start]


def steps_until(env, condition, limit=200):
    for _ in range(limit):
        env.tailer.step()
        if condition():
            return
        time.sleep(0.002)
    raise AssertionError("condition not reached")

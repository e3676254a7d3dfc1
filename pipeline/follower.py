"""What the Real-time queries wrote, read back: where each table is in its input, its windows, its rejected records.

A query in Real-time Mode writes through Spark's Kafka sink and reports its progress only when it checkpoints (every
``realtime_checkpoint_interval``), so the pipeline learns the rest from its own output, as a store node would: one
consumer reads the changelogs of the Real-time tables and the dead-letter topics of their sources from where they
end at start. A changelog row's input position (:mod:`freshroute.input_position`) says how far the table has got in
each input partition, and so does a dead letter's origin for the tables of its source; with where the input ends,
read from the broker, that is the table's input lag, published within a fraction of a second
(:class:`pipeline.input_lag.InputLagPublisher`). A windowed table's windows are noted for their expiry
(:mod:`pipeline.window_expiry`), and each dead letter is counted by its reason.

A record that reaches no changelog (a row a table filters out, a source's record skipped) moves no position: the
table looks behind by it until a later record of its partition does, or the query's next checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import orjson

from freshroute import input_position
from freshroute.lag import now_ms
from freshroute.windows import WindowSpec, split_window_key
from pipeline.input_lag import InputLagPublisher
from pipeline.window_expiry import WindowExpiry

log = logging.getLogger("pipeline")

_PUBLISH_EVERY_S = 0.25


@dataclass
class FollowedTable:
    """A Real-time table: its changelog, its input, and how far its rows say it has got."""

    name: str
    changelog: str
    input_topic: str
    source: str
    window: WindowSpec | None = None
    expiry: WindowExpiry | None = None
    reached: dict[int, int] = field(default_factory=dict)  # input partition → next offset its output reflects


@dataclass
class FollowedSource:
    """A source of Real-time tables whose rejected records are dead-lettered: their topic and their counts."""

    name: str
    dead_letter_topic: str
    count: Callable[[str], None]  # one more record rejected for that reason
    noted: Callable[[str, int, int, str], None] = lambda *_: None  # that record (topic, partition, offset, reason)


def committed_offsets(checkpoint: Path) -> dict[int, int] | None:
    """Input partition → offset a query's last committed batch read to, from its checkpoint (None: none committed)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()]
    if not commits:
        return None
    try:
        lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
        doc = orjson.loads(lines[-1])
    except (OSError, IndexError, orjson.JSONDecodeError):
        return None
    return {int(p): int(o) for parts in doc.values() if isinstance(parts, dict) for p, o in parts.items()}


def follow(settings: Any, runs: list[tuple[Any, Path]], rejects: list[Any], publisher: InputLagPublisher,
           stop: threading.Event) -> "OutputFollower | None":
    """Start reading back what the Real-time tables ``runs`` (each a :class:`pipeline.outputs.TableRun` and its query's
    checkpoint) and their sources' dead letters (``rejects``: every source's writer) write; None when none runs."""
    from confluent_kafka import Consumer

    from freshroute.settings import kafka_logging

    tables = []
    for run, checkpoint in runs:
        t = run.table
        followed = FollowedTable(t.name, run.spec.topic, run.spec.input_topic or "", t.source, t.window,
                                 run.writer.expiry)
        followed.reached.update(committed_offsets(checkpoint) or {})
        tables.append(followed)
    if not tables:
        return None
    sources = {t.source for t in tables}
    dead = [FollowedSource(w.source, w.topic, w.counts.update, w.noted) for w in rejects
            if w.source in sources and w.on_invalid == "dead_letter"]
    consumer = Consumer({**settings.kafka(), "group.id": f"freshroute-pipeline-{settings.namespace}-follower",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100, **kafka_logging("pipeline.kafka")})
    follower = OutputFollower(consumer, tables, dead, publisher, stop)
    follower.assign_ends()
    follower.start()
    return follower


class OutputFollower(threading.Thread):
    """Reads the Real-time tables' changelogs and dead letters; publishes each table's input lag."""

    def __init__(self, consumer: Any, tables: list[FollowedTable], sources: list[FollowedSource],
                 publisher: InputLagPublisher, stop: threading.Event) -> None:
        super().__init__(name="output-follower", daemon=True)
        self.consumer = consumer
        self.tables = {t.changelog: t for t in tables}
        self.sources = {s.dead_letter_topic: s for s in sources}
        self.by_source: dict[str, list[FollowedTable]] = {}
        for t in tables:
            self.by_source.setdefault(t.source, []).append(t)
        self.publisher = publisher
        self.input_partitions: dict[str, list[int]] = {}  # input topic → its partitions (assign_ends)
        # Where the inputs ended at each of the last rounds (a minute of them): a table has caught up as of the
        # latest round whose ends its rows have reached, though with input arriving all the time it is seldom at
        # the very end.
        self.ends_seen: deque[tuple[int, dict[str, dict[int, int]]]] = deque(maxlen=int(60 / _PUBLISH_EVERY_S))
        self.stop_event = stop
        self._lock = threading.Lock()

    def reached(self, table: str, offsets: dict[int, int]) -> None:
        """The table's query has read its input to ``offsets`` (a checkpoint, or where it starts)."""
        for t in self.tables.values():
            if t.name == table:
                with self._lock:
                    for p, o in offsets.items():
                        t.reached[p] = max(t.reached.get(p, 0), o)

    def assign_ends(self) -> None:
        """Read every followed topic from where it ends now (before the queries that write them start)."""
        from confluent_kafka import TopicPartition

        from pipeline.topics import end_offset

        metadata = self.consumer.list_topics(timeout=10)
        # The input topics' partitions, read once: a Real-time query holds a task per partition it started with.
        self.input_partitions = {t.input_topic: list(metadata.topics[t.input_topic].partitions)
                                 for t in self.tables.values() if t.input_topic in metadata.topics}
        starts = []
        for topic in [*self.tables, *self.sources]:
            for p in (metadata.topics[topic].partitions if topic in metadata.topics else ()):
                starts.append(TopicPartition(topic, p, end_offset(self.consumer, topic, p)))
        self.consumer.assign(starts)

    def run(self) -> None:
        try:
            published = 0.0
            while not self.stop_event.is_set():
                for m in self.consumer.consume(num_messages=10_000, timeout=0.1):
                    if m.error() is None:
                        self._take(m)
                if time.monotonic() - published >= _PUBLISH_EVERY_S:
                    published = time.monotonic()
                    self._publish()
        except Exception as e:  # noqa: BLE001 — the queries go on; their input lag is then known only at checkpoints
            if not self.stop_event.is_set():
                log.error("reading back the Real-time queries' output failed (%s): input lag now moves only at "
                          "checkpoints", str(e).splitlines()[0] if str(e) else type(e).__name__)
        finally:
            self.consumer.close()

    def _take(self, m: Any) -> None:
        topic = m.topic()
        table = self.tables.get(topic)
        if table is not None:
            position = input_position.decode(input_position.of_record(m.headers()))
            if position is not None:
                with self._lock:
                    for p, offset in enumerate(position):
                        if offset is not None and offset >= table.reached.get(p, 0):
                            table.reached[p] = offset + 1
            window = table.window
            if window is not None and table.expiry is not None and m.value() is not None:
                split = split_window_key(m.key())
                if split is not None:
                    table.expiry.note([(split[1] + window.size_ms + window.retention_ms, m.partition(), m.key())])
            return
        source = self.sources.get(topic)
        if source is None:
            return
        headers = dict(m.headers() or ())
        reason = headers.get("freshroute.reason", b"").decode()
        source.count(reason)
        if "freshroute.partition" in headers and "freshroute.offset" in headers:
            # The record was read and rejected: its source's tables have got past it.
            p, offset = int(headers["freshroute.partition"]), int(headers["freshroute.offset"])
            if "freshroute.topic" in headers:
                source.noted(headers["freshroute.topic"].decode(), p, offset, reason)
            with self._lock:
                for t in self.by_source.get(source.name, ()):
                    if offset >= t.reached.get(p, 0):
                        t.reached[p] = offset + 1

    def _publish(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        at = now_ms()
        ends: dict[str, dict[int, int]] = {}  # input topic → partition → end, read once for the tables sharing it
        for topic, partitions in self.input_partitions.items():
            try:
                ends[topic] = {p: self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5,
                                                                      cached=False)[1] for p in partitions}
            except KafkaException as e:
                # A broker too busy to answer in time: this topic's tables keep the lag they showed, until next time.
                log.warning("where input topic %s ends is unknown for now (%s)", topic, e.args[0] if e.args else e)
        self.ends_seen.append((at, ends))
        for t in self.tables.values():
            if t.input_topic in ends:
                with self._lock:
                    reached = dict(t.reached)
                self.publisher.observe_positions(t.name, reached, ends[t.input_topic], at,
                                                 caught_up_ms=self._caught_up(t.input_topic, reached))

    def _caught_up(self, topic: str, reached: dict[int, int]) -> int | None:
        """The latest round whose ends of ``topic`` a table at ``reached`` has got to (None: none of those kept)."""
        for at, ends in reversed(self.ends_seen):
            if topic in ends and all(reached.get(p, 0) >= end for p, end in ends[topic].items()):
                return at
        return None

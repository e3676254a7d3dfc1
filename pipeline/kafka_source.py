"""A Kafka streaming source for Spark on confluent-kafka, through the Python Data Source API.

Spark's JVM Kafka connector is not available everywhere this runs, so the pipeline reads
Kafka itself: explicit per-partition offset ranges, offsets kept in Spark's checkpoint
(see :mod:`pipeline.offsets`), no consumer group and no committed offsets.

Two things a naive source gets wrong on some brokers:

- the end of a partition. ListOffsets "latest" may be below the true end (the embedded
  broker answers the base offset of the last record batch + 1). The high watermark of a
  Fetch response is right, so :class:`EndOffsetProbe` fetches once near the listed end
  and reads the watermark that fetch brought back. On Apache Kafka the listed end is
  already right and the probe only confirms it.
- fairness. A Fetch may fill partitions in order up to its byte limit, so per-partition
  fetch sizes are bounded, and a partition whose range is read is paused, so the partitions a
  Spark task reads together all get fetched.
- the wait. The embedded broker holds a fetch until it has filled the byte limit or the
  wait (``fetch.wait.max.ms``) is over, even with records to send, so reads use a short
  wait. But it answers *empty* when it has not gathered the records within the wait, and
  its time to gather them grows with the number of record batches a partition holds: after
  some tens of minutes of a trickle of small batches, a 10 ms wait never brings a record
  again. A consumer that makes no progress therefore moves on to a longer wait
  (:data:`FETCH_WAITS_MS`), and the process keeps using that one.

The reader is pickled to Spark's Python workers: Kafka clients are created lazily and
dropped from the pickled state.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import orjson
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from pipeline import offsets as off
from pipeline.offsets import InputDataLost, SourceOffset, TopicSnapshot

log = logging.getLogger(__name__)

FORMAT = "freshroute_kafka"

SCHEMA = "key string, value string, topic string, partition int, offset long, timestamp timestamp"
ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.string()),
    pa.field("value", pa.string()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
])

# A consumer group id is mandatory for a librdkafka consumer, but these consumers only
# ever assign(): they never join the group and never commit.
_GROUP_ID = "freshroute-pipeline-source"
_ARROW_BATCH_ROWS = 8192
_RECORDS_PER_READ_TASK = 10_000

# The broker long-polls a fetch for this long (ms): the first wait, then the longer ones a
# consumer moves to when it makes no progress for ``FETCH_WAIT_PATIENCE_S`` (module doc).
FETCH_WAITS_MS = (10, 100, 1000)
FETCH_WAIT_PATIENCE_S = 2.0


class FetchWait:
    """Which of :data:`FETCH_WAITS_MS` a process's consumers use; it only ever moves to a longer one."""

    def __init__(self) -> None:
        self._level = 0
        self._lock = threading.Lock()

    @property
    def ms(self) -> int:
        return FETCH_WAITS_MS[self._level]

    @property
    def longest(self) -> bool:
        return self._level == len(FETCH_WAITS_MS) - 1

    def lengthen(self, stalled_at_ms: int, what: str, after_s: float) -> bool:
        """Move past ``stalled_at_ms``, after ``after_s`` with no record; False if already past it or at the longest."""
        with self._lock:
            if self.longest or FETCH_WAITS_MS[self._level] != stalled_at_ms:
                return False
            self._level += 1
            log.warning("%s: the broker sent no records for %.1fs with a %d ms fetch wait; now waiting up to %d ms "
                        "(a broker holding many small record batches gathers them slowly)",
                        what, after_s, stalled_at_ms, FETCH_WAITS_MS[self._level])
            return True


class FetchStalled(Exception):
    """A read made no progress within the patience; ``remaining`` is what is left to read."""

    def __init__(self, remaining: tuple[tuple[int, int, int], ...]) -> None:
        super().__init__(f"no progress reading {remaining}")
        self.remaining = remaining


@dataclass(frozen=True)
class SourceOptions:
    """The source's configuration, parsed once from Spark's string options."""

    topic: str
    kafka: Mapping[str, Any] = field(default_factory=dict)
    max_records_per_batch: int | None = None
    create_partitions: int = 4
    read_tasks: int = 2
    probe_timeout_s: float = 5.0
    read_stall_timeout_s: float = 60.0
    # Partition fetch bound (deviation: a Fetch may fill partitions in order up to its limit).
    max_partition_fetch_bytes: int = 1 << 20
    hint: str = ""  # appended to data-loss errors: where the checkpoint lives

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "SourceOptions":
        topic = options.get("topic")
        if not topic:
            raise ValueError(f"the {FORMAT} source needs a 'topic' option")
        max_rows = int(options.get("max_records_per_batch", "0") or 0)
        return cls(
            topic=topic,
            kafka=orjson.loads(options.get("kafka", "{}")),
            max_records_per_batch=max_rows if max_rows > 0 else None,
            create_partitions=int(options.get("create_partitions", "4")),
            read_tasks=max(1, int(options.get("read_tasks", "2"))),
            probe_timeout_s=float(options.get("probe_timeout_s", "5")),
            read_stall_timeout_s=float(options.get("read_stall_timeout_s", "60")),
            max_partition_fetch_bytes=int(options.get("max_partition_fetch_bytes", str(1 << 20))),
            hint=options.get("hint", ""),
        )

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        return {
            **self.kafka,
            "group.id": _GROUP_ID,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "fetch.queue.backoff.ms": 0,
            # A read knows its records are on the broker, so a long-polling fetch only waits
            # past the end of a range, and delays the next assign() of the same consumer:
            # the shortest wait, until the broker proves too slow for it (module doc).
            "fetch.wait.max.ms": FETCH_WAITS_MS[0],
            "max.partition.fetch.bytes": self.max_partition_fetch_bytes,
            "fetch.max.bytes": max(self.max_partition_fetch_bytes * 4, 1 << 20),
            "queued.max.messages.kbytes": 16384,
            **overrides,
        }


def read_tasks(options: SourceOptions, start: SourceOffset, end: SourceOffset) -> int:
    """Read tasks for a batch: up to ``read_tasks``, but one per ``_RECORDS_PER_READ_TASK`` at most.

    A task costs a round trip to a Python worker, tens of milliseconds, while reading a few
    thousand records costs a few: a small batch is read by one task, a backlog by several.
    """
    return max(1, min(options.read_tasks, off.total_rows(start, end) // _RECORDS_PER_READ_TASK))


def slices(options: SourceOptions, start: SourceOffset, end: SourceOffset) -> list["KafkaSlice"]:
    """The read tasks of offsets ``start`` → ``end``, each with its offset ranges."""
    groups = off.group_ranges(off.ranges(start, end), read_tasks(options, start, end))
    return [KafkaSlice(options.topic, g) for g in groups]


class KafkaSlice(InputPartition):
    """One Spark task's work: offset ranges ``(partition, start, end)`` of one topic, read in order."""

    def __init__(self, topic: str, ranges: tuple[tuple[int, int, int], ...]) -> None:
        super().__init__((topic, ranges))
        self.topic = topic
        self.ranges = ranges


class EndOffsetProbe:
    """Finds each partition's true end offset with one long-lived consumer.

    ListOffsets gives L, never above the true end. Fetching from ``max(L-1, low)`` returns a
    record or a partition EOF, and with it the Fetch response's high watermark, which is the
    true end on every broker. A partition the broker does not answer for within the timeout
    keeps L, marked uncertain.

    Once a partition's true end E is known, later probes of the same topic skip ListOffsets
    and fetch from E: an end only grows, so the answer is the records past E or an EOF at E,
    either with the new watermark (a watermark below E means the topic was recreated: it is
    taken as it is). The embedded broker walks every record batch of a partition to answer
    each ListOffsets (twice: earliest and latest) and each fetch that brings records, and an
    EOF at the end walks none: a probe of a partition that grew walks it once, not three times.
    """

    def __init__(self, consumer: Any, topic: str, timeout_s: float,
                 make_consumer: Any = None, wait: FetchWait | None = None) -> None:
        self.consumer = consumer
        self.topic = topic
        self.timeout_s = timeout_s
        # With a factory, a probe the broker leaves unanswered moves the probe to a longer
        # fetch wait (a new consumer): the next probes find the true end again.
        self._make_consumer = make_consumer
        self._wait = wait
        self._topic_id: str | None = None
        self._known: dict[int, tuple[int, int]] = {}  # partition -> (low, true end) at the last probe that saw it

    def ends(self, partitions: tuple[int, ...], topic_id: str = "") -> tuple[dict[int, int], dict[int, int],
                                                                              frozenset[int]]:
        """``(low, end, uncertain)`` per partition of the topic whose id is ``topic_id``."""
        from confluent_kafka import KafkaError, TopicPartition

        if topic_id != self._topic_id:
            # A recreated topic starts again from 0: nothing known of the old one holds.
            self._topic_id, self._known = topic_id, {}
        known = self._known
        from_known = {p for p in partitions if p in known}
        listed = {p: self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=self.timeout_s,
                                                         cached=False) for p in partitions if p not in from_known}
        low = {p: lo for p, (lo, _) in listed.items()}
        end = {p: hi for p, (_, hi) in listed.items()}
        start = {p: max(end[p] - 1, low[p], 0) for p in listed}
        for p in from_known:
            low[p], end[p] = known[p]
            start[p] = end[p]
        self.consumer.assign([TopicPartition(self.topic, p, start[p]) for p in partitions])
        try:
            pending = set(partitions)
            deadline = time.monotonic() + self.timeout_s
            while pending and time.monotonic() < deadline:
                # consume() returns early only once it has num_messages: ask for as many as
                # partitions are pending, so one record or EOF each ends the wait at once.
                wait = min(0.05, max(0.0, deadline - time.monotonic()))
                for m in self.consumer.consume(num_messages=len(pending), timeout=wait):
                    err = m.error()
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        log.debug("end-offset probe of %s[%s]: %s", self.topic, m.partition(), err)
                        continue
                    if m.partition() in pending:
                        pending.discard(m.partition())
                        # Stop fetching what is resolved: only its watermark matters.
                        self.consumer.pause([TopicPartition(self.topic, m.partition())])
            for p in partitions:
                if p in pending:
                    known.pop(p, None)  # list it again next time
                    continue
                lo, hwm = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
                low[p] = max(low[p], lo)
                # From a known end, the answer's watermark is the end, even below it (recreated under
                # the same id, or a broker that reports none); a listed end is only a lower bound.
                end[p] = hwm if p in from_known and hwm >= 0 else max(end[p], hwm)
                known[p] = (low[p], end[p])
        finally:
            # A pause outlives unassign() in librdkafka: lift it, or the next probe would hang.
            tps = [TopicPartition(self.topic, p) for p in partitions]
            self.consumer.resume(tps)
            self.consumer.unassign()
        if pending:
            log.debug("end-offset probe of %s: no fetch answer for partitions %s within %.1fs",
                      self.topic, sorted(pending), self.timeout_s)
            self._lengthen_wait()
        return low, end, frozenset(pending)

    def _lengthen_wait(self) -> None:
        if self._make_consumer is None or self._wait is None:
            return
        if self._wait.lengthen(self._wait.ms, f"end-offset probe of {self.topic}", self.timeout_s):
            old, self.consumer = self.consumer, self._make_consumer(self._wait.ms)
            old.close()


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader of one Kafka topic."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: Any = None
        self._probe: EndOffsetProbe | None = None
        self._target: dict[int, int] | None = None
        self._last_latest: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Kafka clients hold threads and sockets: each process makes its own.
        state = self.__dict__.copy()
        state["_admin"] = None
        state["_probe"] = None
        return state

    # driver side: offsets
    def _clients(self) -> tuple[Any, EndOffsetProbe]:
        if self._admin is None or self._probe is None:
            from confluent_kafka import Consumer
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(dict(self.options.kafka))

            def make_consumer(wait_ms: int) -> Any:
                return Consumer(self.options.consumer_config(**{
                    "auto.offset.reset": "latest", "fetch.wait.max.ms": wait_ms, "max.partition.fetch.bytes": 65536}))

            wait = FetchWait()
            self._probe = EndOffsetProbe(make_consumer(wait.ms), self.options.topic, self.options.probe_timeout_s,
                                         make_consumer, wait)
        return self._admin, self._probe

    def snapshot(self, create: bool) -> TopicSnapshot | None:
        """What the broker holds now; None when the topic does not exist (and ``create`` is False)."""
        from pipeline.topics import describe_topic, ensure_topic

        admin, probe = self._clients()
        if create:
            info = ensure_topic(admin, self.options.topic, self.options.create_partitions)
        else:
            info = describe_topic(admin, self.options.topic)
            if info is None:
                return None
        low, end, uncertain = probe.ends(info.partitions, info.topic_id)
        return TopicSnapshot(info.topic_id, low, end, uncertain)

    def initialOffset(self) -> dict:
        snap = self.snapshot(create=True)
        assert snap is not None
        return SourceOffset(snap.topic_id, dict(snap.low)).to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_records_per_batch
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = SourceOffset.from_dict(start)
        # A topic that vanished is recreated only when nothing was read from it yet;
        # otherwise check_progress reports the loss.
        snap = self.snapshot(create=not any(begin.positions.values()))
        if snap is None:
            snap = TopicSnapshot("", {}, {})
        off.check_progress(begin, snap, self.options.topic, self.options.hint)
        latest = off.available(begin, snap, self._target)
        self._last_latest = latest.to_dict()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return off.limit(begin, latest, max_rows).to_dict()

    def reportLatestOffset(self) -> dict | None:
        return self._last_latest

    def prepareForTriggerAvailableNow(self) -> None:
        snap = self.snapshot(create=True)
        assert snap is not None
        self._target = dict(snap.end)

    def partitions(self, start: dict, end: dict) -> list[KafkaSlice]:
        return slices(self.options, SourceOffset.from_dict(start), SourceOffset.from_dict(end))

    def commit(self, end: dict) -> None:
        # Offsets live in Spark's checkpoint; the broker keeps no state for this reader.
        pass

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.consumer.close()
        self._admin = None
        self._probe = None

    # executor side: records
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaSlice)
        yield from read_slice(self.options, partition)


# Idle consumers of this process by configuration. Spark reuses its Python workers
# (spark.python.worker.reuse), and a new consumer costs a connection and metadata round
# trips (~100 ms on loopback) in every read task of every micro-batch.
_idle_consumers: dict[bytes, Any] = {}
_idle_lock = threading.Lock()
# The fetch wait of this process's read consumers (module doc).
_read_wait = FetchWait()


def close_idle_consumers() -> None:
    """Closes this process's idle read consumers: for a process that reads in-line and then
    outlives its broker (a test), whose idle consumers would otherwise keep reconnecting."""
    with _idle_lock:
        idle = list(_idle_consumers.values())
        _idle_consumers.clear()
    for consumer in idle:
        consumer.close()


def read_slice(options: SourceOptions, piece: KafkaSlice) -> Iterator[pa.RecordBatch]:
    """Every record of the slice's ranges, as Arrow batches of the declared schema.

    The consumer is taken from this process's idle ones and returned only after a complete
    read, with nothing assigned; a read that failed or was abandoned closes its consumer, so
    no consumer is reused in an unknown state. A read that stalls goes on from where it
    stopped with a consumer that waits longer.
    """
    ranges = piece.ranges
    while True:
        wait_ms = _read_wait.ms
        try:
            yield from _read_with_idle_consumer(options, piece.topic, ranges, wait_ms,
                                                None if _read_wait.longest else FETCH_WAIT_PATIENCE_S)
            return
        except FetchStalled as stalled:
            _read_wait.lengthen(wait_ms, f"reading {piece.topic}", FETCH_WAIT_PATIENCE_S)
            ranges = stalled.remaining


def _read_with_idle_consumer(options: SourceOptions, topic: str, ranges: tuple[tuple[int, int, int], ...],
                             wait_ms: int, patience_s: float | None) -> Iterator[pa.RecordBatch]:
    from confluent_kafka import Consumer

    config = options.consumer_config(**{"auto.offset.reset": "error", "fetch.wait.max.ms": wait_ms})
    key = orjson.dumps(config, option=orjson.OPT_SORT_KEYS)
    with _idle_lock:
        consumer = _idle_consumers.pop(key, None)
    if consumer is None:
        consumer = Consumer(config)
    complete = False
    try:
        yield from read_ranges(consumer, options, topic, ranges, patience_s)
        complete = True
    finally:
        if complete:
            with _idle_lock:
                consumer, _idle_consumers[key] = _idle_consumers.get(key), consumer
        if consumer is not None:
            consumer.close()


def read_ranges(consumer: Any, options: SourceOptions, topic: str, ranges: tuple[tuple[int, int, int], ...],
                patience_s: float | None = None) -> Iterator[pa.RecordBatch]:
    """Every record of offsets ``[start, end)`` of each ``(partition, start, end)``, one partition per Arrow batch.

    With ``patience_s``, a read with no progress for that long yields what it has and raises
    :class:`FetchStalled` with the ranges left to read.

    All the ranges are assigned at once: partitions read one after another would each wait
    for the fetch still pending on the previous one. A partition is paused once its range
    is read, so the others get the fetches; per-partition fetch sizes keep any one from
    filling a fetch alone.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    ends = {p: end for p, _, end in ranges}
    position = {p: start for p, start, _ in ranges}
    rows = {p: _Columns() for p in ends}
    pending = {p for p in ends if position[p] < ends[p]}
    assigned = [TopicPartition(topic, p, position[p]) for p in sorted(pending)]
    if not assigned:
        return
    consumer.assign(assigned)
    try:
        progressed_at = time.monotonic()
        while pending:
            idle_s = time.monotonic() - progressed_at
            if patience_s is not None and idle_s > patience_s:
                for p in sorted(pending):
                    if len(rows[p]):
                        yield rows[p].to_batch(topic, p)
                raise FetchStalled(tuple((p, position[p], ends[p]) for p in sorted(pending)))
            if idle_s > options.read_stall_timeout_s:
                missing = ", ".join(f"{topic}[{p}] [{position[p]}, {ends[p]})" for p in sorted(pending))
                raise TimeoutError(f"no record of offsets {missing} arrived within {options.read_stall_timeout_s:.0f}s")
            done: list[int] = []
            wanted = sum(ends[p] - position[p] for p in pending)
            for m in consumer.consume(num_messages=min(wanted, 5000), timeout=0.5):
                p = m.partition()
                if p not in pending:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        # Gaps up to the end (compaction, transaction markers) leave nothing to wait for.
                        if m.offset() >= ends[p]:
                            pending.discard(p)
                            done.append(p)
                        continue
                    if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        raise InputDataLost(f"offsets [{position[p]}, {ends[p]}) of {topic}[{p}] are no longer on "
                                            f"the broker: {err.str()}{' ' + options.hint if options.hint else ''}")
                    raise KafkaException(err)
                o = m.offset()
                if o >= position[p]:
                    if o < ends[p]:
                        rows[p].add(m)
                        position[p] = o + 1
                        progressed_at = time.monotonic()
                    if o + 1 >= ends[p]:
                        pending.discard(p)
                        done.append(p)
                    elif len(rows[p]) >= _ARROW_BATCH_ROWS:
                        yield rows[p].to_batch(topic, p)
                        rows[p] = _Columns()
            if done:
                # Stop fetching what is read: only the pending partitions need the fetches.
                consumer.pause([TopicPartition(topic, p) for p in done])
                for p in done:
                    if len(rows[p]):
                        yield rows[p].to_batch(topic, p)
                        rows[p] = _Columns()
    finally:
        # A pause outlives unassign() in librdkafka: lift it, or a reused consumer would hang.
        consumer.resume(assigned)
        consumer.unassign()


class _Columns:
    """Column buffers of one Arrow batch."""

    __slots__ = ("keys", "values", "offsets", "timestamps")

    def __init__(self) -> None:
        self.keys: list[str | None] = []
        self.values: list[str | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, m: Any) -> None:
        k = m.key()
        v = m.value()
        self.keys.append(k.decode("utf-8", "replace") if k is not None else None)
        self.values.append(v.decode("utf-8", "replace") if v is not None else None)
        self.offsets.append(m.offset())
        ts_type, ts_ms = m.timestamp()
        self.timestamps.append(ts_ms * 1000 if ts_type != 0 and ts_ms >= 0 else None)

    def to_batch(self, topic: str, partition: int) -> pa.RecordBatch:
        n = len(self.offsets)
        return pa.RecordBatch.from_arrays([
            pa.array(self.keys, pa.string()),
            pa.array(self.values, pa.string()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
        ], schema=ARROW_SCHEMA)


class KafkaBatchReader(DataSourceReader):
    """Everything a topic holds right now, from each partition's log start to its true end."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[KafkaSlice]:
        stream = KafkaStreamReader(self.options)
        try:
            snap = stream.snapshot(create=False)
        finally:
            stream.stop()
        if snap is None:
            raise ValueError(f"topic {self.options.topic} does not exist")
        return slices(self.options, SourceOffset(snap.topic_id, dict(snap.low)),
                      SourceOffset(snap.topic_id, dict(snap.end)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaSlice)
        yield from read_slice(self.options, partition)


class KafkaSource(DataSource):
    """``spark.readStream.format("freshroute_kafka").option("topic", …)``: a Kafka topic as a stream.

    ``spark.read`` with the same options reads what the topic holds now, for backfills and checks.
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> KafkaStreamReader:
        return KafkaStreamReader(SourceOptions.from_options(self.options))

    def reader(self, schema: Any) -> KafkaBatchReader:
        return KafkaBatchReader(SourceOptions.from_options(self.options))

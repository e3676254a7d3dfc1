"""The changelog sink: each micro-batch's changed rows, produced to the table's compacted changelog topic.

Record key: the table key as :func:`freshroute.keys.serialize_key` bytes; record value:
compact JSON of the other columns, or none (a tombstone) for a row that deletes its key — every
value column null, or the table's ``delete_when`` true; partition: :func:`freshroute.keys.partition_for`,
passed explicitly, so the partition a store node and the router compute for a key is by
construction the one the record was written to.

One long-lived idempotent producer serves every table (a new idempotent producer costs
about half a second). A batch returns only when every record is acknowledged by the
broker; any delivery error fails the batch, so that Spark replays it from its checkpoint.
Replayed records are value-identical upserts, which is what makes the effect exactly-once.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import orjson
from confluent_kafka import KafkaError, Producer

from freshroute import version_time
from freshroute.errors import RetryableError
from freshroute.keys import partition_for, serialize_key
from freshroute.settings import kafka_logging
from freshroute.windows import WATERMARK_KEY, WindowSpec, split_window_key, watermark_value, window_key
from pipeline.recompute import Recomputation, describe, stale_keys
from pipeline.tables import (DELETE_COLUMN, INTERNAL_COLUMNS, QUERY_TABLE_COLUMN, VERSION_TIME_COLUMN,
                             WINDOW_START_COLUMN)
from pipeline.validation import RAW_KEY, RAW_VALUE, REASON_COLUMN, REJECTED_BRANCH, InvalidInput
from pipeline.window_expiry import WindowExpiry

log = logging.getLogger(__name__)


# The largest record (key and value) written to a changelog: Kafka's default message.max.bytes, less room for the
# record's framing.
MAX_CHANGELOG_RECORD_BYTES = 1_000_000


class ChangelogWriteFailed(RetryableError):
    """Records of a micro-batch were not acknowledged; the batch must be replayed."""

    code = "CHANGELOG_WRITE_FAILED"


def _json_default(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", "replace")
    if isinstance(v, (set, frozenset, tuple)):
        return list(v)
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    raise TypeError(f"cannot encode {type(v).__name__} in a changelog value")


def encode_key(key: Any) -> bytes:
    """The changelog record key of a table key value."""
    return serialize_key(key if isinstance(key, str) else str(key))


def encode_value(row: Mapping[str, Any], key_column: str) -> bytes | None:
    """Compact JSON of every column but the key, numbers keeping their type (a double stays a float); None (a
    tombstone) when the row deletes its key."""
    values = {k: v for k, v in row.items() if k != key_column and k not in INTERNAL_COLUMNS}
    if row.get(DELETE_COLUMN) is True or all(v is None for v in values.values()):
        return None
    return orjson.dumps(values, default=_json_default, option=orjson.OPT_UTC_Z | orjson.OPT_NON_STR_KEYS)


@dataclass(frozen=True)
class ChangelogRecord:
    key: bytes | None
    value: bytes | None  # None: a tombstone, the key is deleted
    partition: int
    headers: list[tuple[str, bytes]] | None = None  # a versioned table's version time; a dead letter's reason and origin


def changelog_records(rows: Iterable[Mapping[str, Any]], key_column: str, partitions: int,
                      windowed: bool = False) -> tuple[list[ChangelogRecord], int]:
    """Records for the changed rows of a batch, and how many rows had no key (and cannot be addressed).

    A windowed table's record is keyed by (key, window start) and partitioned by the key alone; a versioned table's
    carries its version time (:mod:`freshroute.version_time`)."""
    out = []
    keyless = 0
    for row in rows:
        key = row.get(key_column)
        start = row.get(WINDOW_START_COLUMN) if windowed else 0
        if key is None or start is None or start < 0:
            keyless += 1
            continue
        k = encode_key(key)
        partition = partition_for(k, partitions)
        time = row.get(VERSION_TIME_COLUMN)
        out.append(ChangelogRecord(window_key(k, start) if windowed else k, encode_value(row, key_column), partition,
                                   None if time is None else [(version_time.HEADER, version_time.encode(time))]))
    return out, keyless


def producer_config(kafka: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **kafka,
        "enable.idempotence": True,
        "acks": "all",
        # Records carry an explicit partition; a keyed produce without one would land in
        # the same place, as Kafka's default partitioner puts it.
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        # librdkafka's producer asks the broker to create a topic it doesn't find, with the broker's
        # defaults: a deleted changelog would come back uncompacted with the wrong partition count,
        # and the job would resume into it. Only the job creates it.
        "allow.auto.create.topics": False,
        # A batch fails (and is replayed) rather than waiting minutes for a broker that is gone.
        "message.timeout.ms": 60_000,
        **kafka_logging("pipeline.kafka"),
    }


class ChangelogProducer:
    """The job's one producer, created lazily and replaced only after a fatal error."""

    def __init__(self, kafka: Mapping[str, Any], factory: Callable[[dict[str, Any]], Any] = Producer) -> None:
        self._config = producer_config(kafka)
        self._factory = factory
        self._producer: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._producer is None:
                self._producer = self._factory(self._config)
            return self._producer

    def discard(self) -> None:
        """Drop a producer that hit a fatal error; the next batch makes a new one."""
        with self._lock:
            self._producer = None

    def close(self, timeout_s: float = 10.0) -> None:
        with self._lock:
            p, self._producer = self._producer, None
        if p is not None:
            p.flush(timeout_s)

    @property
    def delivery_timeout_s(self) -> float:
        return self._config["message.timeout.ms"] / 1000.0


_WRITTEN_KEPT = 16


class Written(NamedTuple):
    """What a micro-batch wrote, and what its two halves cost."""

    records: int
    collect_ms: float  # computing and collecting the changed rows (the batch itself runs here)
    produce_ms: float  # producing them until acknowledged
    deletes: int = 0  # tombstones among the records


class ChangelogWriter:
    """Writes one table's micro-batches to its changelog topic."""

    def __init__(self, table: str, topic: str, partitions: int, key_column: str, producer: ChangelogProducer,
                 window: WindowSpec | None = None, expiry: WindowExpiry | None = None,
                 stale_keys: str = "report", rejects: "RejectWriter | None" = None) -> None:
        self.table = table
        self.rejects = rejects  # its source's: a row too large for the changelog is rejected as input is
        self.topic = topic
        self.partitions = partitions
        self.key_column = key_column
        self.producer = producer
        self.window = window
        self.expiry = expiry  # a windowed table's windows by expiry
        self.watermark_ms: int | None = None  # the last watermark published to every partition
        self.stale_keys = stale_keys  # what a recomputation does with keys no longer produced (pipeline.recompute)
        self.stale_found: int | None = None  # how many it found, once it has looked
        self.oversized: list[ChangelogRecord] = []  # dead letters of rows too large for the changelog, to send
        # Batch id → what it wrote, of the latest batches: Spark reports a batch's progress
        # asynchronously, on a busy machine after the next batch has run.
        self.written: dict[int, Written] = {}

    def note_written(self, batch_id: int, written: Written) -> None:
        self.written[batch_id] = written
        for old in [b for b in self.written if b <= batch_id - _WRITTEN_KEPT]:
            del self.written[old]

    def changes(self, rows: list[Mapping[str, Any]], batch_id: int) -> list[ChangelogRecord]:
        """The changelog records of a batch's changed rows (a row without a key is logged and left out)."""
        records, keyless = changelog_records(rows, self.key_column, self.partitions, self.window is not None)
        if keyless:
            log.warning("table %s batch %d: %d row(s) with a null key %r%s cannot be addressed and were not written",
                        self.table, batch_id, keyless, self.key_column, " or window" if self.window else "")
        too_large = [r for r in records if r.value is not None and len(r.key) + len(r.value) > MAX_CHANGELOG_RECORD_BYTES]
        if too_large and self.rejects is not None:
            # The changelog would refuse it and the batch would fail on every replay: the key keeps its last row,
            # and the row is rejected as bad input is (a dead letter naming the table and key, the counter, a log).
            self.oversized.extend(self.rejects.too_large_rows(self.table, too_large))
            dropped = {id(r) for r in too_large}
            records = [r for r in records if id(r) not in dropped]
        return records

    def take_oversized(self) -> list[ChangelogRecord]:
        """The dead letters of this batch's rows too large for the changelog (once)."""
        out, self.oversized = self.oversized, []
        return out

    def acknowledged(self, records: list[ChangelogRecord]) -> tuple[int, int]:
        """Note records the broker acknowledged (a windowed table indexes its windows by expiry); returns how many
        there were, and how many of them are tombstones."""
        w = self.window
        if w is not None and self.expiry is not None:
            self.expiry.note((split_window_key(r.key)[1] + w.size_ms + w.retention_ms, r.partition, r.key)  # type: ignore[index]
                             for r in records if r.value is not None)
        return len(records), sum(1 for r in records if r.value is None)

    def write_rows(self, rows: list[Mapping[str, Any]], batch_id: int) -> tuple[int, int]:
        """Produce the rows and wait for every acknowledgement; returns the records written, and how many of them
        are tombstones."""
        records = self.changes(rows, batch_id)
        produce(self.producer, [(self, records)], f"batch {batch_id}")
        return self.acknowledged(records)

    def advance_watermark(self, watermark_ms: int) -> int:
        """Publish a windowed table's new watermark to every partition, after tombstones for the windows it expires;
        returns how many windows expired."""
        if self.window is None or (self.watermark_ms is not None and watermark_ms <= self.watermark_ms):
            return 0
        due = self.expiry.due(watermark_ms) if self.expiry is not None else []
        records = [ChangelogRecord(key, None, partition) for _, partition, key in due]
        mark = watermark_value(watermark_ms)
        records += [ChangelogRecord(WATERMARK_KEY, mark, p) for p in range(self.partitions)]
        produce(self.producer, [(self, records)], "watermark")
        if due and self.expiry is not None:
            self.expiry.forget(entry for entry, _, _ in due)
        self.watermark_ms = watermark_ms
        return len(due)


class RejectWriter:
    """A source's rejected records (:mod:`pipeline.validation`): counted by reason, and by the source's ``on_invalid``
    written to its dead-letter topic with their reason and origin, dropped, or the end of the pipeline."""

    def __init__(self, source: str, on_invalid: str, topic: str, partitions: int, producer: ChangelogProducer) -> None:
        self.source = source
        self.on_invalid = on_invalid
        self.topic = topic
        self.table = f"{source}'s rejected records"  # what produce() names in its errors
        self.partitions = partitions
        self.producer = producer
        self.counts: Counter[str] = Counter()  # reason → records rejected since the pipeline started
        # Told of each rejected input record (topic, partition, offset, reason), for lookups waiting for it.
        self.on_rejected: Callable[[str, int, int, str], None] | None = None

    def noted(self, topic: str, partition: int, offset: int, reason: str) -> None:
        """An input record of this source was rejected (here, or by a Real-time query read back)."""
        if self.on_rejected is not None:
            self.on_rejected(topic, partition, offset, reason)

    def _letter(self, key: bytes | None, value: bytes | None, from_partition: int, reason: str,
                **origin: Any) -> ChangelogRecord:
        """A dead letter: the record's bytes (or none), with its reason, source and origin as headers."""
        headers = [("freshroute.reason", reason.encode()), ("freshroute.source", self.source.encode()),
                   *((f"freshroute.{name}", str(v).encode()) for name, v in origin.items())]
        return ChangelogRecord(key, value, from_partition % self.partitions, headers)

    def dead_letters(self, rows: list[Mapping[str, Any]]) -> list[ChangelogRecord]:
        """The batch's rejected records as dead letters (none unless ``on_invalid`` is ``dead_letter``); InvalidInput
        for the first when it is ``fail``."""
        if rows and self.on_invalid == "fail":
            r = rows[0]
            raise InvalidInput(f"INVALID_INPUT: source {self.source}: record {r['topic']}/{r['partition']}@{r['offset']} "
                               f"is rejected ({r[REASON_COLUMN]}), and the source says on_invalid='fail'",
                               source=self.source, reason=r[REASON_COLUMN], topic=r["topic"],
                               partition=r["partition"], offset=r["offset"])
        if self.on_invalid != "dead_letter":
            return []
        out = []
        for r in rows:
            ts, value = r["timestamp"], r[RAW_VALUE]
            origin = {"topic": r["topic"], "partition": r["partition"], "offset": r["offset"],
                      "timestamp": int(ts.timestamp() * 1000) if ts is not None else ""}
            if r[REASON_COLUMN] == "too_large":
                # Over the source's limit, and maybe over the topic's: its origin says where the input still holds it.
                origin["value_bytes"], value = len(value), None
            out.append(self._letter(r[RAW_KEY], value, int(r["partition"]), r[REASON_COLUMN], **origin))
        return out

    def too_large_rows(self, table: str, records: list[ChangelogRecord]) -> list[ChangelogRecord]:
        """Rows of ``table`` too large for its changelog, rejected as input is (reason ``output_too_large``):
        counted, and by ``on_invalid`` dead letters naming table and key (without the row), dropped, or the end."""
        self.counts["output_too_large"] += len(records)
        first = records[0]
        log.error("table %s: %d row(s) over %d bytes cannot go to its changelog; those keys keep their last row "
                  "(first: %r, %d bytes)", table, len(records), MAX_CHANGELOG_RECORD_BYTES,
                  first.key[:100], len(first.value or b""))
        if self.on_invalid == "fail":
            raise InvalidInput(f"INVALID_INPUT: table {table}: a row of {len(first.value or b'')} bytes for key "
                               f"{first.key[:100]!r} cannot go to its changelog, and its source {self.source} says "
                               f"on_invalid='fail'", table=table, source=self.source, reason="output_too_large")
        if self.on_invalid != "dead_letter":
            return []
        return [self._letter(r.key, None, r.partition, "output_too_large", table=table, value_bytes=len(r.value or b""))
                for r in records]

    def counted(self, rows: list[Mapping[str, Any]]) -> None:
        batch = Counter(r[REASON_COLUMN] for r in rows)
        self.counts.update(batch)
        for r in rows:
            self.noted(r["topic"], r["partition"], r["offset"], r[REASON_COLUMN])
        if rows:
            log.warning("source %s: %d record(s) rejected (%s)%s", self.source, len(rows),
                        ", ".join(f"{n} {reason}" for reason, n in batch.most_common()),
                        f" → {self.topic}" if self.on_invalid == "dead_letter" else "")


def produce(producer: ChangelogProducer, sends: list[tuple[Any, list[ChangelogRecord]]], what: str) -> None:
    """Produce each writer's records to its changelog, then wait for every acknowledgement; any failure raises
    :class:`ChangelogWriteFailed`. A query's tables are sent together, so their waits overlap."""
    total = sum(len(records) for _, records in sends)
    if not total:
        return
    p = producer.get()
    # Counted per call rather than relying on flush(): queries share the producer and
    # another query's flush may serve this call's delivery callbacks.
    state = {"done": 0, "errors": []}
    lock = threading.Lock()

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        with lock:
            state["done"] += 1
            if err is not None:
                state["errors"].append(err)

    tables = ", ".join(w.table for w, records in sends if records)
    deadline = time.monotonic() + producer.delivery_timeout_s + 30
    for writer, records in sends:
        for r in records:
            while True:
                try:
                    p.produce(writer.topic, key=r.key, value=r.value, partition=r.partition, headers=r.headers,
                              on_delivery=delivered)
                    break
                except BufferError:
                    # Local queue full: let deliveries drain it, within the batch's time bound.
                    if time.monotonic() > deadline:
                        raise ChangelogWriteFailed(f"table {tables} {what}: producer queue stayed full",
                                                   table=tables) from None
                    p.poll(0.05)
    while state["done"] < total and time.monotonic() < deadline:
        p.flush(0.2)
    errors: list[KafkaError] = state["errors"]
    missing = total - state["done"]
    if errors or missing:
        if any(e.fatal() for e in errors):
            producer.discard()
        first = errors[0].str() if errors else "no acknowledgement before the deadline"
        topics = ", ".join(w.topic for w, records in sends if records)
        raise ChangelogWriteFailed(
            f"table {tables} {what}: {len(errors)} record(s) failed and {missing} unacknowledged "
            f"of {total} to {topics}: {first}", table=tables)


class QuerySink:
    """``foreachBatch`` of one streaming query: its tables' changed rows, each table's to its own changelog,
    acknowledged before the batch returns.

    A query of several tables unions them as rows of ``(QUERY_TABLE_COLUMN, one struct column per table)``:
    the index of the row's table, and its columns in the struct named after it (null in the others).
    """

    def __init__(self, writers: list[ChangelogWriter], producer: ChangelogProducer, kafka: Mapping[str, Any] | None = None,
                 recomputation: Recomputation | None = None, rejects: RejectWriter | None = None,
                 ghosts: frozenset[str] = frozenset()) -> None:
        self.writers = writers
        self.ghosts = ghosts  # retired versions the query computes for its state only: their rows are dropped
        self.rejects = rejects  # the source's rejected records, the union's last branch, in one query per source
        self.producer = producer
        self.kafka = dict(kafka or {})
        self.recomputation = recomputation  # a fresh start's mark, until it has caught up

    def stale(self, writer: ChangelogWriter, records: list[ChangelogRecord],
              recomputation: Recomputation) -> list[ChangelogRecord]:
        """The table's keys the recomputation no longer produces, reported; their tombstones if the table says so."""
        mark = recomputation.changelog_ends.get(writer.table)
        if mark is None:
            return []
        stale = stale_keys(self.kafka, writer.topic, mark, {r.key for r in records})
        writer.stale_found = len(stale)
        if stale:
            log.warning(describe(writer.table, writer.stale_keys, stale))
        else:
            log.info("table %s: the recomputation caught up with its input; every key it held it produces again",
                     writer.table)
        return [ChangelogRecord(key, None, p) for key, p in stale] if writer.stale_keys == "tombstone" else []

    def write_batch(self, df: Any, batch_id: int) -> None:
        started = time.monotonic()
        # The batch runs here: reading the input, the aggregations and their state store commits.
        rows = df.toArrow().to_pylist()
        collected = time.monotonic()
        rejected: list[Mapping[str, Any]] = []
        if len(self.writers) == 1 and self.rejects is None:
            per_table = [rows]
        else:
            per_table = [[] for _ in self.writers]
            names = [w.table for w in self.writers]
            for row in rows:
                i = row[QUERY_TABLE_COLUMN]
                if i < len(names):
                    per_table[i].append(row[names[i]])
                else:
                    rejected.append(row[REJECTED_BRANCH])
        sends = [(w, w.changes(t_rows, batch_id)) for w, t_rows in zip(self.writers, per_table)
                 if w.table not in self.ghosts]
        recomputation = self.recomputation
        if recomputation is not None and recomputation.caught_up(batch_id):
            sends = [(w, records + self.stale(w, records, recomputation)) for w, records in sends]
        dead: list[tuple[Any, list[ChangelogRecord]]] = []
        if self.rejects is not None and rejected:
            dead = [(self.rejects, self.rejects.dead_letters(rejected))]
        for w in self.writers:
            oversized = w.take_oversized()
            if oversized and w.rejects is not None:
                dead.append((w.rejects, oversized))
        produce(self.producer, [*sends, *dead], f"batch {batch_id}")
        if self.rejects is not None:
            self.rejects.counted(rejected)
        if recomputation is not None and all(w.stale_found is not None for w, _ in sends
                                             if w.table in recomputation.changelog_ends):
            recomputation.done({w.table: w.stale_found for w, _ in sends if w.stale_found is not None})
            self.recomputation = None
        produced = time.monotonic()
        for writer, records in sends:
            count, deletes = writer.acknowledged(records)
            writer.note_written(batch_id, Written(count, (collected - started) * 1000.0,
                                                  (produced - collected) * 1000.0, deletes))

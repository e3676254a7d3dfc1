"""Real-time Mode: a table's changelog records made in the JVM and written by Spark's own Kafka sink.

A query in Spark's Real-time Mode runs long-lived tasks that emit each changed row within milliseconds, in update
mode, and writes only through a sink that takes rows one at a time: Spark's Kafka sink. So what the micro-batch
sink (:mod:`pipeline.sink`) does in Python for each row is done here as Spark SQL, with no Python on the record
path: the record key is the table key's UTF-8 bytes (a windowed table's with its window start, as
:func:`freshroute.windows.window_key` writes it), the value the JSON of the other columns or none (a tombstone),
and the partition Kafka's murmur2 of the table key, by freshroute's partitioner class
(``jvm/changelog-partitioner``), exactly as :func:`freshroute.keys.partition_for` computes it.

Each row also carries its input position (:mod:`freshroute.input_position`, a column :mod:`pipeline.lineage` adds):
per input partition the offset of the latest input record of the row's key, so that a store node can skip the older
rows a replay after a crash writes again; a versioned table's row, its version time (:mod:`freshroute.version_time`).
A row too large for its changelog, and every record its source rejects, go to the source's dead-letter topic with
their reason, in the same sink (its ``topic`` column).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any, Callable, Mapping

from freshroute import input_position, version_time
from pipeline.checkpoints import drop_unfinished_writes
from pipeline.sink import MAX_CHANGELOG_RECORD_BYTES
from pipeline.tables import (DELETE_COLUMN, INTERNAL_COLUMNS, MICROBATCH, POSITION_COLUMN, QUERY_TABLE_COLUMN,
                             REALTIME, VERSION_TIME_COLUMN, WINDOW_START_COLUMN, Source, Table, TablesFileError)
from pipeline.validation import RAW_KEY, RAW_VALUE, REASON_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["MICROBATCH", "REALTIME"]

PARTITIONER = "io.freshroute.changelog.ChangelogPartitioner"
WINDOWED_TOPICS = "freshroute.windowed.topics"  # ChangelogPartitioner.WINDOWED_TOPICS


class RealtimeRefused(TablesFileError):
    """A table's shape is one Real-time Mode cannot run (and the table does not say ``pipeline_mode='microbatch'``)."""

    code = "REALTIME_REFUSED"


def refused(table: str, why: str) -> RealtimeRefused:
    return RealtimeRefused(f"table {table!r} cannot run in Real-time Mode: {why}. Give the table "
                           f"pipeline_mode='microbatch' in the tables file to run it in micro-batches", table=table)


def _header(name: str, value: "Column") -> "Column":
    from pyspark.sql import functions as F

    return F.struct(F.lit(name).alias("key"), value.cast("string").cast("binary").alias("value"))


@dataclass(frozen=True)
class _Rows:
    """A table's rows as changelog records before their size is judged: which rows make one, and each one's key,
    value (null: a tombstone) and lineage headers."""

    kept: "Column"
    key: "Column"
    value: "Column"
    lineage: "Column"


def changelog_records(tables: list[tuple[Table, str]], frame: "DataFrame", source: Source,
                      dead_letter_topic: str, ghosts: frozenset[str] = frozenset()) -> "DataFrame":
    """The Kafka sink's rows (``topic``, ``key``, ``value``, ``headers``) of a query's frame: its tables' changelog
    records, and a dead letter for each row too large for its changelog. ``tables``: each table and its changelog
    topic; ``frame``: one table's own (with :data:`POSITION_COLUMN`, and a versioned table's
    :data:`VERSION_TIME_COLUMN`), or several tables' (:data:`QUERY_TABLE_COLUMN` and a struct of each table's columns
    named after it, :mod:`pipeline.fusion`); ``ghosts``: tables whose rows are never kept (retired versions computed
    only for the query's state), left out after the aggregation, which a checkpoint allows."""
    from pyspark.sql import functions as F

    if len(tables) == 1:
        (t, topic), = tables
        one = _rows(t, frame.columns, F.col)
        kept = F.lit(False) if t.name in ghosts else one.kept
        staged = [F.lit(t.name), F.lit(topic), one.key, one.value, one.lineage]
    else:
        index = F.col(QUERY_TABLE_COLUMN)
        rows = [_rows(t, frame.schema[t.name].dataType.fieldNames(), F.col(t.name).getField) for t, _ in tables]

        def picked(each: list["Column"]) -> "Column":
            # Each table's column only on its own rows: another's may raise (on_invalid='fail') on a null struct.
            out = F.when(index == 0, each[0])
            for i, c in enumerate(each[1:], 1):
                out = out.when(index == i, c)
            return out

        own = [(index == i) & r.kept for i, (r, (t, _)) in enumerate(zip(rows, tables)) if t.name not in ghosts]
        kept = reduce(lambda a, b: a | b, own) if own else F.lit(False)
        staged = [picked([F.lit(t.name) for t, _ in tables]), picked([F.lit(topic) for _, topic in tables]),
                  *(picked([getattr(r, c) for r in rows]) for c in ("key", "value", "lineage"))]
    names = ("table", "topic", "key", "value", "lineage")
    return _judged(frame.where(kept).select(*(c.alias(n) for c, n in zip(staged, names))), source, dead_letter_topic)


def _rows(t: Table, columns: list[str], column: Callable[[str], "Column"]) -> _Rows:
    """Table ``t``'s rows as records, from its row's ``columns`` (``column(name)``: one of them)."""
    from pyspark.sql import functions as F

    values = [c for c in columns if c != t.key and c not in INTERNAL_COLUMNS]
    key = column(t.key).cast("string")
    kept = key.isNotNull()
    if t.window is not None:
        start = column(WINDOW_START_COLUMN)
        kept = kept & start.isNotNull() & (start >= 0)
        # translate, not lower: Spark's lower() maps case with ICU, a word break iterator made for every row.
        key = F.concat(key, F.lit("\x00"), F.lpad(F.translate(F.hex(start), "ABCDEF", "abcdef"), 16, "0"))
    deleted = reduce(lambda a, b: a & b, [column(c).isNull() for c in values])
    if DELETE_COLUMN in columns:
        deleted = deleted | F.coalesce(column(DELETE_COLUMN), F.lit(False))
    # Every column, null ones included, as the micro-batch sink writes them.
    value = F.when(~deleted, F.to_json(F.struct(*[column(c).alias(c) for c in values]), {"ignoreNullFields": "false"}))
    lineage = F.array(_header(input_position.HEADER, F.to_json(column(POSITION_COLUMN))))
    if VERSION_TIME_COLUMN in columns:
        lineage = F.concat(lineage, F.array(_header(version_time.HEADER, column(VERSION_TIME_COLUMN))))
    return _Rows(kept, key, value, lineage)


def _judged(staged: "DataFrame", source: Source, dead_letter_topic: str) -> "DataFrame":
    """The sink's rows of records made once each (``staged``: a table's name, its changelog topic, the key, value and
    lineage): a record too large for its changelog becomes a dead letter, is skipped or fails the query, as its
    source's ``on_invalid`` says."""
    from pyspark.sql import functions as F

    table, key, value = F.col("table"), F.col("key"), F.col("value")
    size = F.octet_length(key) + F.coalesce(F.octet_length(value), F.lit(0))
    too_large = size > MAX_CHANGELOG_RECORD_BYTES
    if source.on_invalid == "fail":
        value = F.when(too_large, F.raise_error(F.concat(
            F.lit("INVALID_INPUT: table "), table, F.lit(": a row of "), size.cast("string"),
            F.lit(" bytes for key "), F.substring(key, 1, 100),
            F.lit(f" cannot go to its changelog, and its source {source.name} says on_invalid='fail'"))).cast("string")
        ).otherwise(value)
    elif source.on_invalid == "skip":
        staged, too_large = staged.where(~too_large), F.lit(False)
    letter = F.array(_header("freshroute.reason", F.lit("output_too_large")),
                     _header("freshroute.source", F.lit(source.name)), _header("freshroute.table", table),
                     _header("freshroute.value_bytes", F.octet_length(value)))
    return staged.select(F.when(too_large, F.lit(dead_letter_topic)).otherwise(F.col("topic")).alias("topic"),
                         key.alias("key"), F.when(~too_large, value).alias("value"),
                         F.when(too_large, letter).otherwise(F.col("lineage")).alias("headers"))


def dead_letters(source: Source, rejected: "DataFrame", topic: str, partitions: int) -> "DataFrame":
    """The Kafka sink's rows of a source's rejected records: by its ``on_invalid``, dead letters with their reason
    and origin (``dead_letter``), or the end of the query naming the first (``fail``)."""
    from pyspark.sql import functions as F

    reason, offset = F.col(REASON_COLUMN), F.col("offset")
    if source.on_invalid == "fail":
        failed = F.raise_error(F.concat(
            F.lit(f"INVALID_INPUT: source {source.name}: record "), F.col("topic"), F.lit("/"),
            F.col("partition").cast("string"), F.lit("@"), offset.cast("string"), F.lit(" is rejected ("), reason,
            F.lit("), and the source says on_invalid='fail'")))
        return rejected.select(F.lit(topic).alias("topic"), F.col(RAW_KEY).alias("key"),
                               failed.cast("binary").alias("value"))
    timestamp = F.coalesce(F.unix_millis(F.col("timestamp")).cast("string"), F.lit(""))
    headers = F.array(_header("freshroute.reason", reason), _header("freshroute.source", F.lit(source.name)),
                      _header("freshroute.topic", F.col("topic")), _header("freshroute.partition", F.col("partition")),
                      _header("freshroute.offset", offset), _header("freshroute.timestamp", timestamp))
    large = reason == "too_large"
    # Over the source's limit, and maybe over the topic's: its origin says where the input still holds it.
    headers = F.when(large, F.concat(headers, F.array(_header("freshroute.value_bytes",
                                                              F.octet_length(RAW_VALUE))))).otherwise(headers)
    return rejected.select(F.lit(topic).alias("topic"), F.col(RAW_KEY).alias("key"),
                           F.when(~large, F.col(RAW_VALUE)).alias("value"), headers.alias("headers"),
                           (F.col("partition") % F.lit(partitions)).alias("partition"))


def start_query(records: "DataFrame", name: str, settings: Any, windowed_topics: list[str]) -> "StreamingQuery":
    """Start the Real-time query ``name`` writing ``records`` through Spark's Kafka sink, checkpointed every
    ``realtime_checkpoint_interval`` (``settings``: the pipeline's)."""
    drop_unfinished_writes(settings.query_checkpoint(name), name)
    return (records.writeStream.queryName(name).outputMode("update").format("kafka")
            .options(**sink_options(settings.kafka(), windowed_topics))
            .option("checkpointLocation", str(settings.query_checkpoint(name)))
            .trigger(realTime=f"{settings.realtime_checkpoint_ms} milliseconds")
            .start())


def sink_options(kafka: Mapping[str, Any], windowed_topics: list[str]) -> dict[str, str]:
    """The Kafka sink's options: the deployment's Kafka settings (as ``kafka.*``) and the changelog partitioner."""
    options = {f"kafka.{k}": str(v) for k, v in kafka.items()}
    options["kafka.partitioner.class"] = PARTITIONER
    options[f"kafka.{WINDOWED_TOPICS}"] = ",".join(windowed_topics)
    # A record is sent within a millisecond of its row; under load a millisecond still fills batches.
    options["kafka.linger.ms"] = "1"
    return options


def task_slots(input_partitions: int, stateful: bool, shuffle_partitions: int) -> int:
    """The task slots a Real-time query holds for its life: a task per input partition, and per shuffle partition
    when it aggregates (both stages run at once)."""
    return input_partitions + (shuffle_partitions if stateful else 0)

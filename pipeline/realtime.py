"""Real-time Mode: a table's changelog records made in the JVM and written by Spark's own Kafka sink.

A query in Spark's Real-time Mode runs long-lived tasks that emit each changed row within milliseconds, in update
mode, and writes only through a sink that takes rows one at a time: Spark's Kafka sink. So what the micro-batch
sink (:mod:`pipeline.sink`) does in Python for each row is done here as Spark SQL, with no Python on the record
path: the record key is the table key's UTF-8 bytes (a windowed table's with its window start, as
:func:`freshroute.windows.window_key` writes it), the value the JSON of the other columns or none (a tombstone),
and the partition Kafka's murmur2 of the table key, by freshroute's partitioner class
(``jvm/changelog-partitioner``), exactly as :func:`freshroute.keys.partition_for` computes it.

Each row also carries its input position (:mod:`freshroute.input_position`): the query's aggregation gets one more
aggregate, per input partition the offset of the latest input record of the row's key, so that a store node can
skip the older rows a replay after a crash writes again. A row too large for its changelog, and every record its
source rejects, go to the source's dead-letter topic with their reason, in the same sink (its ``topic`` column).
"""

from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING, Any, Mapping

from freshroute import input_position
from pipeline.sink import MAX_CHANGELOG_RECORD_BYTES
from pipeline.tables import DELETE_COLUMN, MICROBATCH, REALTIME, WINDOW_START_COLUMN, Source, Table, TablesFileError
from pipeline.validation import RAW_KEY, RAW_VALUE, REASON_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["MICROBATCH", "REALTIME"]

POSITION_COLUMN = "_freshroute_position"
PARTITIONER = "io.freshroute.changelog.ChangelogPartitioner"
WINDOWED_TOPICS = "freshroute.windowed.topics"  # ChangelogPartitioner.WINDOWED_TOPICS


class RealtimeRefused(TablesFileError):
    """A table's shape is one Real-time Mode cannot run (and the table does not say ``pipeline_mode='microbatch'``)."""

    code = "REALTIME_REFUSED"


def refused(table: str, why: str) -> RealtimeRefused:
    return RealtimeRefused(f"table {table!r} cannot run in Real-time Mode: {why}. Give the table "
                           f"pipeline_mode='microbatch' in the tables file to run it in micro-batches", table=table)


def with_input_position(spark: "SparkSession", table: str, df: "DataFrame", partitions: int) -> "DataFrame":
    """The table's frame with :data:`POSITION_COLUMN`: per input partition, the offset of the latest input record
    its row reflects (null where none).

    The position is one more aggregate of the table's own aggregation (or, for a table that aggregates nothing, one
    more column of its projection), added to Spark's analyzed plan: the table's function stays as the user wrote
    it, and the aggregate lives in the same state, so it is exactly as old as the row's other columns.
    """
    from pyspark.sql import DataFrame, functions as F

    jvm = spark._jvm
    plan = df._jdf.queryExecution().analyzed()
    # The plan's top down to the node that reads the source rows or aggregates them: projections and filters of the
    # aggregated rows pass the position on.
    above = []
    node = plan
    while node.nodeName() in ("Project", "Filter", "SubqueryAlias") and not _reads_source(node):
        above.append(node)
        node = node.child()
    stateful = node.nodeName() == "Aggregate"
    if not stateful and not _reads_source(node):
        raise refused(table, f"its frame ends in a {node.nodeName()} over its source, where freshroute can place no "
                             f"input position (an aggregation, or a projection of the source rows, can)")
    child = DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, node.child()), spark)
    if not {"partition", "offset"} <= set(child.columns):
        raise refused(table, "the rows it aggregates no longer have the source's partition and offset columns")
    offsets = [F.when(F.col("partition") == p, F.col("offset")) for p in range(partitions)]
    if stateful:
        position = child.agg(F.array(*[F.max(o) for o in offsets]).alias(POSITION_COLUMN))
        expr = position._jdf.queryExecution().analyzed().aggregateExpressions().head()
    else:
        position = child.select(F.array(*offsets).alias(POSITION_COLUMN))
        expr = position._jdf.queryExecution().analyzed().projectList().head()
    logical = jvm.org.apache.spark.sql.catalyst.plans.logical
    if stateful:
        node = logical.Aggregate(node.groupingExpressions(), _appended(jvm, node.aggregateExpressions(), expr),
                                 node.child(), node.hint())
    else:
        node = logical.Project(_appended(jvm, node.projectList(), expr), node.child())
    attribute = expr.toAttribute()
    for parent in reversed(above):
        if parent.nodeName() == "Project":
            node = logical.Project(_appended(jvm, parent.projectList(), attribute), node)
        else:
            node = parent.withNewChildren(_seq(jvm, [node]))
    return DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, node), spark)


def _reads_source(node: Any) -> bool:
    """Whether a plan node is a projection of the source rows themselves (no aggregation below it)."""
    return node.nodeName() == "Project" and not _aggregates(node.child())


def aggregates(df: "DataFrame") -> bool:
    """Whether a frame aggregates (its Real-time query then runs a shuffle stage beside its source's)."""
    return _aggregates(df._jdf.queryExecution().analyzed())


def _aggregates(node: Any) -> bool:
    if node.nodeName() == "Aggregate":
        return True
    children = node.children()
    return any(_aggregates(children.apply(i)) for i in range(children.size()))


def _seq(jvm: Any, items: list) -> Any:
    java = jvm.java.util.ArrayList()
    for item in items:
        java.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(java).toList()


def _appended(jvm: Any, seq: Any, item: Any) -> Any:
    return _seq(jvm, [seq.apply(i) for i in range(seq.size())] + [item])


def _header(name: str, value: "Column") -> "Column":
    from pyspark.sql import functions as F

    return F.struct(F.lit(name).alias("key"), value.cast("string").cast("binary").alias("value"))


def changelog_records(t: Table, df: "DataFrame", topic: str, source: Source, dead_letter_topic: str) -> "DataFrame":
    """The Kafka sink's rows (``topic``, ``key``, ``value``, ``headers``) of a table's frame (with
    :data:`POSITION_COLUMN`): its changelog records, and a dead letter for each row too large for the changelog."""
    from pyspark.sql import functions as F

    values = [c for c in df.columns if c not in (t.key, DELETE_COLUMN, WINDOW_START_COLUMN, POSITION_COLUMN)]
    key = F.col(t.key).cast("string")
    rows = df.where(key.isNotNull())
    if t.window is not None:
        start = F.col(WINDOW_START_COLUMN)
        rows = rows.where(start.isNotNull() & (start >= 0))
        key = F.concat(key, F.lit("\x00"), F.lpad(F.lower(F.hex(start)), 16, "0"))
    deleted = reduce(lambda a, b: a & b, [F.col(c).isNull() for c in values])
    if DELETE_COLUMN in df.columns:
        deleted = deleted | F.coalesce(F.col(DELETE_COLUMN), F.lit(False))
    # Every column, null ones included, as the micro-batch sink writes them.
    value = F.when(~deleted, F.to_json(F.struct(*values), {"ignoreNullFields": "false"}))
    position = F.array(_header(input_position.HEADER, F.to_json(F.col(POSITION_COLUMN))))
    size = F.octet_length(key) + F.coalesce(F.octet_length(value), F.lit(0))
    too_large = size > MAX_CHANGELOG_RECORD_BYTES
    if source.on_invalid == "fail":
        value = F.when(too_large, F.raise_error(F.concat(
            F.lit(f"INVALID_INPUT: table {t.name}: a row of "), size.cast("string"),
            F.lit(" bytes for key "), F.substring(key, 1, 100),
            F.lit(f" cannot go to its changelog, and its source {source.name} says on_invalid='fail'"))).cast("string")
        ).otherwise(value)
    elif source.on_invalid == "skip":
        rows, too_large = rows.where(~(size > MAX_CHANGELOG_RECORD_BYTES)), F.lit(False)
    letter = F.array(_header("freshroute.reason", F.lit("output_too_large")),
                     _header("freshroute.source", F.lit(source.name)), _header("freshroute.table", F.lit(t.name)),
                     _header("freshroute.value_bytes", F.octet_length(value)))
    return rows.select(F.when(too_large, F.lit(dead_letter_topic)).otherwise(F.lit(topic)).alias("topic"),
                       key.alias("key"), F.when(~too_large, value).alias("value"),
                       F.when(too_large, letter).otherwise(position).alias("headers"))


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

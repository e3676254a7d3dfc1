"""A source's side of a query: its input topic checked, read through Spark's Kafka source, parsed and split into valid
rows and rejected records (:mod:`pipeline.validation`); and a table's frame over those rows, its columns checked."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from freshroute.errors import ConfigError
from pipeline.lineage import with_lineage
from pipeline.tables import (DELETE_COLUMN, Source, Table, TablesDefinition, TablesFileError, check_output_columns,
                             check_source_fields)
from pipeline.validation import RAW_KEY, RAW_VALUE, required_fields, split

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.settings import PipelineSettings

log = logging.getLogger("pipeline")


class InputTopicMissing(ConfigError):
    """A source names an input topic the broker does not have."""

    code = "INPUT_TOPIC_MISSING"


def check_inputs(settings: PipelineSettings, definition: TablesDefinition, admin: Any) -> None:
    """Every source's topic exists (or, with ``create_input_topics``, is made): a typo is an error, not an
    empty table."""
    from freshroute.topics import describe_topic
    from pipeline.topics import ensure_topic

    s = settings
    for src in definition.sources.values():
        topic = s.input_topic(src.topic)
        if describe_topic(admin, topic) is not None:
            continue
        if not s.create_input_topics:
            raise InputTopicMissing(f"source {src.name!r}: input topic {topic} does not exist on {s.bootstrap_servers}"
                                    f"; create it, fix the name in {definition.path}, or set "
                                    f"create_input_topics", source=src.name, topic=topic)
        ensure_topic(admin, topic, s.input_partitions, {}, replication_factor=s.changelog_replication_factor)
        log.info("source %s: created input topic %s (%d partitions)", src.name, topic, s.input_partitions)


def source_schema(src: Source) -> Any:
    """The source's schema as a Spark ``StructType``; a TablesFileError naming the source when it is not one."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    try:
        schema = _parse_datatype_string(src.schema)
    except Exception as e:
        raise TablesFileError(f"source {src.name!r}: schema {src.schema!r} is not a Spark DDL schema: "
                              f"{str(e).splitlines()[0]}", source=src.name) from None
    if not isinstance(schema, StructType):
        raise TablesFileError(f"source {src.name!r}: schema {src.schema!r} must list fields", source=src.name)
    check_source_fields(src, schema.fieldNames())
    return schema


def table_frame(spark: "SparkSession", definition: TablesDefinition, t: Table, rows: "DataFrame",
                built: Any = None) -> "DataFrame":
    """Table ``t``'s frame over its source's parsed ``rows``, its columns checked; whatever its definition gets wrong
    (a missing column, SQL Spark cannot analyse) a TablesFileError naming the file and the table."""
    try:
        df = t.dataframe(spark, rows, built)
    except TablesFileError:
        raise
    except Exception as e:
        raise TablesFileError(f"table {t.name!r} in {definition.path}: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}", table=t.name) from None
    delete_type = next((f.dataType.simpleString() for f in df.schema.fields if f.name == DELETE_COLUMN), None)
    check_output_columns(t, df.columns, delete_type, definition.path)
    return df


def version_times(spark: "SparkSession", t: Table, path: Path) -> Any:
    """What a micro-batch table's frame gets besides its definition: a versioned table's version time (None:
    nothing); ``path``: the tables file, to name."""
    if not t.versioned:
        return None

    def refuse(why: str) -> TablesFileError:
        return TablesFileError(f"table {t.name!r} in {path} cannot keep a history: {why}", table=t.name)

    return lambda df: with_lineage(spark, df, refuse, version_time=True)


def source_rows(spark: "SparkSession", settings: PipelineSettings, src: Source, tables: Iterable[Table] = (),
                realtime: bool = False) -> tuple["DataFrame", "DataFrame"]:
    """The source topic as a stream of valid parsed rows — the schema's fields plus the Kafka record columns — and
    one of its rejected records (:mod:`pipeline.validation`); ``tables``: every table of the source, whose keys and
    window time columns a record must have."""
    schema = source_schema(src)
    tables = list(tables)
    # A Real-time batch reads the clock once, at its start, and lasts a checkpoint interval: a record's time is
    # judged against a clock up to that much behind.
    slack_ms = settings.realtime_checkpoint_ms if realtime else 0
    return split(kafka_stream(spark, settings, settings.input_topic(src.topic), realtime), src, schema,
                 required_fields(schema, [t.key for t in tables]),
                 [t.window.time_column for t in tables if t.window is not None], slack_ms)


def kafka_stream(spark: "SparkSession", settings: PipelineSettings, topic: str, realtime: bool = False) -> "DataFrame":
    """The topic through Spark's own Kafka source, offsets in the query's checkpoint.

    The deployment's Kafka settings are passed as ``kafka.*`` options: the Java client's names, which are
    librdkafka's too for the common ones (``security.protocol``, ``sasl.*``); others must be given in
    the Java client's terms.
    """
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("kafka").option("subscribe", topic).option("startingOffsets", "earliest")
              .option("failOnDataLoss", "true"))
    if not realtime:
        # A task's consumer fetches ahead of the range it reads; at the partition's end the broker holds
        # that fetch for fetch.max.wait.ms (500 ms by default) and the task waits on it. Measured on the
        # demo stack: batches of 570–650 ms became 360–540 ms, and `local up` warm in 18 s, not >90 s.
        # (A Real-time task's fetch returns as soon as a record arrives, and waiting long is what idles it.)
        reader = reader.option("kafka.fetch.max.wait.ms", "10")
    for key, value in settings.kafka().items():
        reader = reader.option(f"kafka.{key}", str(value))
    if settings.max_records_per_batch and not realtime:
        reader = reader.option("maxOffsetsPerTrigger", str(settings.max_records_per_batch))
    # The record's bytes as they came: what a rejected record's dead letter carries.
    return reader.load().select(F.col("key").alias(RAW_KEY), F.col("value").alias(RAW_VALUE),
                                F.col("key").cast("string").alias("key"), "topic", "partition", "offset", "timestamp")

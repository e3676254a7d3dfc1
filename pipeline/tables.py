"""Table definitions: the user-editable tables file and what it declares.

A tables file is a Python module loaded by path. It declares input sources and the tables
computed from them, in either of two forms::

    from pyspark.sql import functions as F
    from pipeline.tables import source, sql_table, table

    source("readings", schema="sensor STRING, area STRING, reading DOUBLE")

    @table(name="sensor_stats", key="sensor", source="readings")
    def sensor_stats(readings):
        return readings.groupBy("sensor").agg(F.count("reading").alias("count"))

    sql_table(name="area_counts", key="area", source="readings",
              sql="SELECT area, count(*) AS count FROM readings GROUP BY area")

A source is a Kafka topic of JSON values parsed with ``schema``; besides the schema's
fields each row carries the record's ``key``, ``topic``, ``partition``, ``offset`` and
``timestamp``. A record that does not fit the schema reaches no table: it is counted and, by the
source's ``on_invalid``, dead-lettered, dropped or the end of the pipeline (:mod:`pipeline.validation`). A table's key column becomes the changelog record key; every other column
goes into the JSON value. Either form takes ``standby_replicas=N``: each partition of the
table is served by an active and N standbys on distinct store nodes (default: the
pipeline's ``--standby-replicas``).

Windowed tables: ``window=tumbling("10s", grace="5s", retention="1h")`` (or ``hopping(size, slide, ...)``)
adds a ``window`` column (Spark's ``struct<start, end>``) to the source rows, over event time (the
``time=`` column, by default the record's ``timestamp``) with a watermark of ``grace``; the table
groups by its key and ``window``::

    @table(name="sensor_windows", key="sensor", source="readings", window=tumbling("10s", grace="5s"))
    def sensor_windows(readings):
        return readings.groupBy("sensor", "window").agg(F.count("reading").alias("count"))

Versioned tables: ``history_retention="7d"`` keeps every version of each key for that long after it was replaced,
for lookups as of a past time; a version's time is the largest Kafka timestamp of the input records its row reflects
(:mod:`pipeline.lineage`).

Deletes: a changed row whose value columns are all null, or for which the table's
``delete_when`` (a Spark SQL boolean expression over its columns, e.g. ``"status = 'closed'"``)
is true, is written as a tombstone: the key leaves the table on every store node, and
compaction removes it from the changelog.
"""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from freshroute.errors import ConfigError
from freshroute.metadata.tables import MAX_STANDBY_REPLICAS
from freshroute.windows import WindowSpec, duration_ms, hopping, tumbling

__all__ = ["source", "table", "sql_table", "tumbling", "hopping"]

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Columns every source row carries from its Kafka record.
METADATA_COLUMNS = ("key", "topic", "partition", "offset", "timestamp")
# The column ``delete_when`` is evaluated into: the sink writes a tombstone where it is true.
DELETE_COLUMN = "_freshroute_delete"
# The column a windowed table's window start (ms) is carried in from Spark to the sink; the source rows' window column.
WINDOW_START_COLUMN = "_freshroute_window_start"
# In a query of several tables: the index of the table a row belongs to (its columns are in a struct named after it).
QUERY_TABLE_COLUMN = "_freshroute_table"
# What a row reflects of its input (pipeline.lineage): per input partition the offset of its latest input record, and
# a versioned table's version time.
POSITION_COLUMN = "_freshroute_position"
VERSION_TIME_COLUMN = "_freshroute_version_time"
# Columns the pipeline adds to a table's rows: none of them is a value column.
INTERNAL_COLUMNS = (DELETE_COLUMN, WINDOW_START_COLUMN, POSITION_COLUMN, VERSION_TIME_COLUMN)
WINDOW_COLUMN = "window"
# How a table's query runs: Spark's Real-time Mode (long-running tasks, each change out in milliseconds) or
# micro-batches (for shapes Real-time Mode refuses).
REALTIME, MICROBATCH = "realtime", "microbatch"
PIPELINE_MODES = (REALTIME, MICROBATCH)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TablesFileError(ConfigError):
    """The tables file cannot be loaded or declares something inconsistent."""

    code = "TABLES_FILE_ERROR"


@dataclass(frozen=True)
class Source:
    """An input topic of JSON values with a Spark DDL schema, and what to do with records that do not fit it
    (:mod:`pipeline.validation`)."""

    name: str
    schema: str
    topic: str  # without the deployment's topic prefix
    on_invalid: str = "dead_letter"  # "dead_letter" | "skip" | "fail"
    dead_letter_topic: str | None = None  # without the prefix; None: "<name>.rejected"
    max_clock_skew_ms: int = 300_000  # a record's time may be at most this far ahead of the pipeline's clock
    max_record_bytes: int = 1_000_000

    @property
    def rejected_topic(self) -> str:
        """Where its rejected records go (without the deployment's topic prefix)."""
        return self.dead_letter_topic or f"{self.name}.rejected"


@dataclass(frozen=True)
class Table:
    """A keyed table computed from one source, by a DataFrame function or by Spark SQL."""

    name: str
    key: str
    source: str
    build: Callable[["DataFrame"], "DataFrame"] | None = None
    sql: str | None = None
    standby_replicas: int | None = None  # None: the pipeline's default
    delete_when: str | None = None  # a Spark SQL boolean expression: rows where it is true are deletes
    window: WindowSpec | None = None
    trigger_ms: int | None = None  # None: the pipeline's trigger
    query: str | None = None  # the streaming query it runs in; None: its own, named after it
    stale_keys: str = "report"  # keys a recomputation no longer produces: "report" them or "tombstone" them
    pipeline_mode: str | None = None  # REALTIME or MICROBATCH; None: the pipeline's
    history_retention_ms: int = 0  # a versioned table keeps each key's replaced versions this long; 0: not versioned
    versions_from: str = "beginning"  # a new version's input: "beginning" (refused once it has expired) or "held"

    @property
    def query_name(self) -> str:
        return self.query or self.name

    @property
    def versioned(self) -> bool:
        return self.history_retention_ms > 0

    def dataframe(self, spark: "SparkSession", rows: "DataFrame",
                  built: "Callable[[DataFrame], DataFrame] | None" = None) -> "DataFrame":
        """The table as a streaming DataFrame over the parsed source rows (with :data:`DELETE_COLUMN`
        when it has ``delete_when``; a windowed table's rows get their window, its output the window start);
        ``built``: what to do with the frame the table's definition makes, before those columns are added."""
        from pyspark.sql import functions as F

        w = self.window
        if w is not None:
            if w.time_column not in rows.columns:
                raise TablesFileError(f"table {self.name!r}: window time column {w.time_column!r} is not a column of "
                                      f"source {self.source!r} ({rows.columns})", table=self.name)
            kind = next(f.dataType.simpleString() for f in rows.schema.fields if f.name == w.time_column)
            if kind != "timestamp":
                raise TablesFileError(f"table {self.name!r}: window time column {w.time_column!r} is a {kind}, not a "
                                      f"timestamp (convert it in the source schema or with timestamp_millis)",
                                      table=self.name)
            rows = (rows.withWatermark(w.time_column, f"{w.grace_ms} milliseconds")
                    .withColumn(WINDOW_COLUMN, F.window(w.time_column, f"{w.size_ms} milliseconds",
                                                        f"{w.slide_ms} milliseconds")))
        if self.build is not None:
            df = self.build(rows)
        else:
            # SQL names the source as a table: expose the parsed stream under that name.
            rows.createOrReplaceTempView(self.source)
            df = spark.sql(self.sql or "")
        if built is not None:
            df = built(df)
        if self.delete_when is not None:
            df = df.withColumn(DELETE_COLUMN, F.expr(self.delete_when))
        if w is not None:
            if WINDOW_COLUMN not in df.columns:
                raise TablesFileError(f"windowed table {self.name!r} must keep the {WINDOW_COLUMN!r} column: group by "
                                      f"its key and {WINDOW_COLUMN!r}", table=self.name)
            df = df.withColumn(WINDOW_START_COLUMN, F.unix_millis(F.col(f"{WINDOW_COLUMN}.start"))).drop(WINDOW_COLUMN)
        return df


@dataclass(frozen=True)
class TablesDefinition:
    """Everything one tables file declares."""

    path: Path
    sources: dict[str, Source] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)


class Collector:
    """What one load of a tables file has declared so far."""

    def __init__(self) -> None:
        self.sources: dict[str, Source] = {}
        self.tables: dict[str, Table] = {}

    def add_source(self, s: Source) -> None:
        if s.name in self.sources:
            raise ValueError(f"source {s.name!r} is declared twice")
        self.sources[s.name] = s

    def add_table(self, t: Table) -> None:
        if t.name in self.tables:
            raise ValueError(f"table {t.name!r} is declared twice")
        self.tables[t.name] = t


# Set only while load_tables() runs a tables file, so that declarations register with
# that load and with nothing else; outside a load they just return their value.
loading: contextvars.ContextVar[Collector | None] = contextvars.ContextVar("freshroute_tables_loading", default=None)


_Declared = TypeVar("_Declared", Source, Table)


def _declared(item: _Declared) -> _Declared:
    """Register ``item`` with the tables file being loaded, if one is; returns it."""
    collector = loading.get()
    if collector is not None:
        if isinstance(item, Table):
            collector.add_table(item)
        else:
            collector.add_source(item)
    return item


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{kind} name {name!r} must be a plain identifier (letters, digits, _)")


def source(name: str, schema: str, topic: str | None = None, *, on_invalid: str = "dead_letter",
           dead_letter_topic: str | None = None, max_clock_skew: Any = "5m", max_record_bytes: int = 1_000_000) -> Source:
    """Declare an input source: topic ``topic`` (default: ``name``) of JSON values with DDL ``schema``.

    A record that does not fit — see :mod:`pipeline.validation` — never reaches a table; ``on_invalid`` says what
    happens to it: ``"dead_letter"`` (counted, and written with its reason to ``dead_letter_topic``, by default
    ``<name>.rejected``), ``"skip"`` (counted only) or ``"fail"`` (the pipeline stops, naming it).
    ``max_clock_skew``: how far a record's time may be ahead of the pipeline's clock (default five minutes);
    ``max_record_bytes``: the largest value accepted.
    """
    from pipeline.validation import ON_INVALID, check_topic_name

    _check_name("source", name)
    if not isinstance(schema, str) or not schema.strip():
        raise ValueError(f"source {name!r} needs a schema, e.g. \"sensor STRING, reading DOUBLE\"")
    if on_invalid not in ON_INVALID:
        raise ValueError(f"source {name!r}: on_invalid must be one of {', '.join(map(repr, ON_INVALID))}, "
                         f"not {on_invalid!r}")
    if dead_letter_topic is not None:
        check_topic_name(f"source {name!r}: dead_letter_topic", dead_letter_topic)
    skew = duration_ms(max_clock_skew, f"source {name!r}: max_clock_skew")
    if not 0 < skew <= 7 * 86_400_000:
        raise ValueError(f"source {name!r}: max_clock_skew must be more than 0 and at most 7 days, not {max_clock_skew!r}")
    if type(max_record_bytes) is not int or not 0 < max_record_bytes <= 100_000_000:
        raise ValueError(f"source {name!r}: max_record_bytes must be a whole number of bytes in 1..100,000,000, "
                         f"not {max_record_bytes!r}")
    return _declared(Source(name, schema, topic or name, on_invalid, dead_letter_topic, skew, max_record_bytes))


def _check_standbys(name: str, standby_replicas: int | None) -> None:
    if standby_replicas is not None and (type(standby_replicas) is not int or
                                         not 0 <= standby_replicas <= MAX_STANDBY_REPLICAS):
        raise ValueError(f"table {name!r}: standby_replicas must be a whole number in 0..{MAX_STANDBY_REPLICAS}, "
                         f"not {standby_replicas!r}")


def _check_delete_when(name: str, delete_when: str | None) -> None:
    if delete_when is not None and (not isinstance(delete_when, str) or not delete_when.strip()):
        raise ValueError(f"table {name!r}: delete_when must be a Spark SQL boolean expression over the table's "
                         f"columns, e.g. \"status = 'closed'\", not {delete_when!r}")


def _check_trigger(name: str, trigger_ms: int | None) -> None:
    from pipeline.settings import MAX_TRIGGER_MS

    if trigger_ms is not None and (type(trigger_ms) is not int or not 0 <= trigger_ms <= MAX_TRIGGER_MS):
        raise ValueError(f"table {name!r}: trigger_ms must be a whole number of milliseconds in 0..{MAX_TRIGGER_MS}, "
                         f"not {trigger_ms!r}")


def _check_window(name: str, window: WindowSpec | None) -> None:
    if window is not None and not isinstance(window, WindowSpec):
        raise ValueError(f"table {name!r}: window must be tumbling(...) or hopping(...), not {window!r}")


def _check_stale_keys(name: str, stale_keys: str) -> None:
    from pipeline.recompute import STALE_KEYS

    if stale_keys not in STALE_KEYS:
        raise ValueError(f"table {name!r}: stale_keys must be one of {', '.join(map(repr, STALE_KEYS))}, "
                         f"not {stale_keys!r}")


VERSIONS_FROM = ("beginning", "held")


def _check_versions_from(name: str, versions_from: str) -> None:
    if versions_from not in VERSIONS_FROM:
        raise ValueError(f"table {name!r}: versions_from must be one of {', '.join(map(repr, VERSIONS_FROM))}, "
                         f"not {versions_from!r}")


def _check_mode(name: str, pipeline_mode: str | None) -> None:
    if pipeline_mode is not None and pipeline_mode not in PIPELINE_MODES:
        raise ValueError(f"table {name!r}: pipeline_mode must be one of {', '.join(map(repr, PIPELINE_MODES))}, "
                         f"not {pipeline_mode!r}")


def _history_retention_ms(name: str, history_retention: Any, window: WindowSpec | None) -> int:
    """A table's ``history_retention`` in milliseconds: a positive duration, or None (not versioned)."""
    if history_retention is None:
        return 0
    if window is not None:
        raise ValueError(f"table {name!r}: a windowed table cannot keep a history (history_retention): each window is "
                         f"a row of its own, read by its time range")
    what = f"table {name!r}: history_retention"
    ms = duration_ms(history_retention, what)
    if ms <= 0:
        raise ValueError(f"{what} must be a positive duration such as \"7d\", not {history_retention!r}")
    return ms


def _check_table(name: str, standby_replicas: int | None, delete_when: str | None, window: WindowSpec | None,
                 trigger_ms: int | None, query: str | None, stale_keys: str, pipeline_mode: str | None = None,
                 versions_from: str = "beginning") -> None:
    _check_name("table", name)
    _check_mode(name, pipeline_mode)
    _check_stale_keys(name, stale_keys)
    _check_versions_from(name, versions_from)
    _check_standbys(name, standby_replicas)
    _check_delete_when(name, delete_when)
    _check_window(name, window)
    _check_trigger(name, trigger_ms)
    if query is not None:
        _check_name("query", query)


def table(name: str, key: str, source: str, *, standby_replicas: int | None = None,
          delete_when: str | None = None, window: WindowSpec | None = None,
          trigger_ms: int | None = None, query: str | None = None, stale_keys: str = "report",
          pipeline_mode: str | None = None, history_retention: Any = None, versions_from: str = "beginning"
          ) -> Callable[[Callable[["DataFrame"], "DataFrame"]], Table]:
    """Declare a table computed by the decorated function ``(source rows) -> DataFrame``.

    ``standby_replicas``: standbys of each partition besides its active (default: the pipeline's setting).
    ``delete_when``: a Spark SQL boolean expression; a changed row for which it is true deletes its key.
    ``window``: :func:`tumbling` or :func:`hopping` windows; the function groups by its key and ``window``.
    ``trigger_ms``: this table's micro-batch interval (default: the pipeline's ``--trigger-ms``).
    ``query``: the streaming query the table runs in; tables of one source naming the same query share it: one read
    of the input, one plan and one checkpoint for all of them. Default: a micro-batch table's own; a Real-time
    table's, the one the source's Real-time tables share (``<source>.tables``), which computes them in one
    aggregation (a table that query cannot take runs in a query it names for itself).
    ``pipeline_mode``: ``"realtime"`` (Spark's Real-time Mode: each change in the changelog within milliseconds) or
    ``"microbatch"`` (for a shape Real-time Mode refuses); default: the pipeline's ``pipeline_mode``.
    ``stale_keys``: what a recomputation (its query started without a checkpoint) does with keys the table held and
    no longer produces, once it has caught up with its input: ``"report"`` them (logged, counted) or
    ``"tombstone"`` them (:mod:`pipeline.recompute`).
    ``history_retention``: keep every version of a key this long after it was replaced (``"7d"``, ``"12h"``,
    milliseconds), for lookups as of a past time; default: only the latest.
    ``versions_from``: what a new version of the table (its definition changed) is computed from: ``"beginning"``,
    the input's beginning, refused before it starts once the broker no longer holds it; or ``"held"``, whatever
    the broker holds (:mod:`pipeline.input_held`).
    """
    _check_table(name, standby_replicas, delete_when, window, trigger_ms, query, stale_keys, pipeline_mode,
                 versions_from)
    history_ms = _history_retention_ms(name, history_retention, window)

    def register(fn: Callable[["DataFrame"], "DataFrame"]) -> Table:
        if not callable(fn):
            raise ValueError(f"@table({name!r}) must decorate a function (source rows) -> DataFrame")
        return _declared(Table(name, key, source, build=fn, standby_replicas=standby_replicas,
                               delete_when=delete_when, window=window, trigger_ms=trigger_ms, query=query,
                               stale_keys=stale_keys, pipeline_mode=pipeline_mode, history_retention_ms=history_ms,
                               versions_from=versions_from))

    return register


def sql_table(name: str, key: str, source: str, sql: str, *, standby_replicas: int | None = None,
              delete_when: str | None = None, window: WindowSpec | None = None, trigger_ms: int | None = None,
              query: str | None = None, stale_keys: str = "report", pipeline_mode: str | None = None,
              history_retention: Any = None, versions_from: str = "beginning") -> Table:
    """Declare a table computed by Spark SQL; the query names the source as a table (with a ``window`` column when
    ``window`` is given: ``GROUP BY key, window``); the other arguments are :func:`table`'s."""
    _check_table(name, standby_replicas, delete_when, window, trigger_ms, query, stale_keys, pipeline_mode,
                 versions_from)
    history_ms = _history_retention_ms(name, history_retention, window)
    if not isinstance(sql, str) or not sql.strip():
        raise ValueError(f"sql_table {name!r} needs a SQL query")
    return _declared(Table(name, key, source, sql=sql, standby_replicas=standby_replicas, delete_when=delete_when,
                           window=window, trigger_ms=trigger_ms, query=query, stale_keys=stale_keys,
                           pipeline_mode=pipeline_mode, history_retention_ms=history_ms, versions_from=versions_from))


def check_output_columns(t: Table, columns: list[str], delete_type: str | None = None, path: Path | None = None
                         ) -> None:
    """A table's DataFrame must have its key column and at least one value column; ``delete_when``, if any, must be
    a boolean (``delete_type``: the Spark type of :data:`DELETE_COLUMN`); ``path``: the tables file, to name."""
    own = [c for c in columns if c not in INTERNAL_COLUMNS]
    table = f"table {t.name!r}" + (f" in {path}" if path else "")
    if t.key not in own:
        raise TablesFileError(f"{table}: key column {t.key!r} is not among its columns {own}", table=t.name)
    if len(own) < 2:
        raise TablesFileError(f"{table} has no value column besides its key {t.key!r}", table=t.name)
    if t.delete_when is not None and delete_type != "boolean":
        raise TablesFileError(f"{table}: delete_when {t.delete_when!r} is a {delete_type}, not a boolean "
                              f"expression", table=t.name)


def check_source_fields(s: Source, fields: list[str]) -> None:
    """A source's fields must not shadow the Kafka metadata columns every row carries."""
    clash = sorted(set(fields) & set(METADATA_COLUMNS))
    if clash:
        raise TablesFileError(f"source {s.name!r}: field(s) {clash} clash with the Kafka record columns "
                              f"{list(METADATA_COLUMNS)}; rename them in the schema", source=s.name)

"""What a source lets through to its tables, and why every other record was rejected.

Each record of a source's topic is checked before any table sees it; the first of these that applies is its
reason, and a rejected record reaches no table (so every table of a source sees the same records):

- ``too_large``: a value over the source's ``max_record_bytes``;
- ``not_json``: no value, a value that is not valid UTF-8, or not a JSON object;
- ``wrong_type``: a field of another JSON type than the schema gives it (a string where a number goes, say);
- ``missing_field``: a field a table of the source keys by, or one the schema says is ``NOT NULL``, absent or null;
- ``non_finite``: ``NaN`` or ``±Infinity`` (``1e999`` included) in a number field;
- ``future_timestamp``: the record's time (its Kafka timestamp, and any window time column of a table of the
  source) more than the source's ``max_clock_skew`` ahead of the batch's time — one bad clock would otherwise
  move the event-time watermark past every real record.

A table's row too large for its changelog (over a megabyte) is rejected the same way, as ``output_too_large``
(a dead letter naming the table and key, without the row): the key keeps its last row and the batch goes on.

Rejected records travel beside the tables' rows in the query that writes them (one query per source:
the first by name), so that checking costs no second read of the input, and the sink counts them
(``freshroute_pipeline_rejected_records_total{source,reason}``) and, by the source's ``on_invalid``, writes
them to its dead-letter topic with their reason and origin (``dead_letter``), drops them (``skip``) or stops
the pipeline naming the first (``fail``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable

from freshroute.errors import FatalError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

ON_INVALID = ("dead_letter", "skip", "fail")
REASONS = ("too_large", "not_json", "wrong_type", "missing_field", "non_finite", "future_timestamp",
           "output_too_large")
REASON_COLUMN = "reason"
RAW_KEY, RAW_VALUE = "_freshroute_raw_key", "_freshroute_raw_value"  # the record's bytes, as they came
_CORRUPT = "_freshroute_corrupt"
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# What a rejected record carries to the sink: its reason and where it came from, with its bytes.
REJECT_COLUMNS = (REASON_COLUMN, RAW_KEY, RAW_VALUE, "topic", "partition", "offset", "timestamp")
REJECTED_BRANCH = "_freshroute_rejected"  # the name of the rejected records' branch in a query's union


class InvalidInput(FatalError):
    """A record of a source whose ``on_invalid`` is ``fail`` was rejected: the pipeline stops, naming it."""

    code = "INVALID_INPUT"


def check_topic_name(what: str, topic: Any) -> None:
    if not isinstance(topic, str) or not _TOPIC.match(topic) or topic in (".", ".."):
        raise ValueError(f"{what} must be a Kafka topic name (letters, digits, '.', '_', '-'; at most 249), "
                         f"not {topic!r}")


def split(raw: "DataFrame", src: Any, schema: Any, required: Iterable[str], time_columns: Iterable[str],
          clock_slack_ms: int = 0) -> tuple["DataFrame", "DataFrame"]:
    """(valid rows: the schema's fields and the Kafka record columns; rejected records: :data:`REJECT_COLUMNS`) of
    the raw records of source ``src`` (a :class:`pipeline.tables.Source`): its Kafka record columns, with ``key`` and
    ``value`` also as the bytes they came as in :data:`RAW_KEY` and :data:`RAW_VALUE`; ``clock_slack_ms``: how far
    behind the batch's clock may be (a Real-time batch reads it once, at its start)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    text = F.col(RAW_VALUE).cast("string")
    checked = StructType([*schema.fields, StructField(_CORRUPT, StringType())])
    rows = raw.select("*", F.from_json(text, checked, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
                      .alias("_value"))
    value = F.col("_value")
    # A record the schema's parse could not take is parsed again, as any JSON object, to tell a wrong type from no
    # object at all: only those records pay for a second parse.
    unparsed = F.when(F.from_json(text, "map<string,string>").isNull(), "not_json").otherwise("wrong_type")
    reason = (F.when(F.octet_length(RAW_VALUE) > src.max_record_bytes, "too_large")
              .when(F.col(RAW_VALUE).isNull(), "not_json")
              .when(~F.expr(f"is_valid_utf8(CAST({RAW_VALUE} AS STRING))"), "not_json")
              .when(value.isNull(), "not_json")
              .when(value[_CORRUPT].isNotNull(), unparsed))
    for name in sorted(set(required)):
        reason = reason.when(value[name].isNull(), "missing_field")
    for column in _number_fields(schema, value):
        reason = reason.when(F.isnan(column) | F.abs(column).eqNullSafe(F.lit(float("inf"))), "non_finite")
    ahead = F.current_timestamp() + F.expr(f"INTERVAL {src.max_clock_skew_ms + clock_slack_ms} MILLISECONDS")
    for name in ["timestamp", *sorted(set(time_columns) - {"timestamp"})]:
        column = F.col("timestamp") if name == "timestamp" else value[name]
        reason = reason.when(column > ahead, "future_timestamp")
    rows = rows.withColumn(REASON_COLUMN, reason)
    record_columns = [c for c in raw.columns if c not in (RAW_KEY, RAW_VALUE)]
    valid = (rows.where(F.col(REASON_COLUMN).isNull())
             .select(*[value[f.name].alias(f.name) for f in schema.fields], *record_columns))
    rejected = rows.where(F.col(REASON_COLUMN).isNotNull()).select(*REJECT_COLUMNS)
    return valid, rejected


def _number_fields(schema: Any, parent: "Column") -> list["Column"]:
    """Every float and double field of ``schema`` (through nested structs) as a column under ``parent``."""
    from pyspark.sql.types import DoubleType, FloatType, StructType

    out = []
    for f in schema.fields:
        if isinstance(f.dataType, (DoubleType, FloatType)):
            out.append(parent[f.name])
        elif isinstance(f.dataType, StructType):
            out.extend(_number_fields(f.dataType, parent[f.name]))
    return out


def required_fields(schema: Any, keys: Iterable[str]) -> list[str]:
    """The top-level fields a record must have: the tables' key columns that are source fields, and every field
    the schema says is ``NOT NULL``."""
    names = {f.name for f in schema.fields}
    return sorted({k for k in keys if k in names} | {f.name for f in schema.fields if not f.nullable})

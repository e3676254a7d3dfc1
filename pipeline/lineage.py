"""What each row of a table reflects of its input, as columns freshroute adds to the table's analyzed plan.

Two columns, each one more aggregate of the table's own aggregation (or, for a table that aggregates nothing, one
more column of its projection of the source rows), so that the table's function stays as the user wrote it and the
columns live in the same state as the row's others — exactly as old as they are:

- :data:`~pipeline.tables.POSITION_COLUMN` (a Real-time table's): per input partition, the offset of the latest input
  record its row reflects (null where none) — :mod:`freshroute.input_position`;
- :data:`~pipeline.tables.VERSION_TIME_COLUMN` (a versioned table's): the largest Kafka timestamp (ms) of the input
  records its row reflects: the time the row's version became true (:mod:`freshroute.version_time`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from pipeline.catalyst import frame_of, python_list, scala_list
from pipeline.tables import POSITION_COLUMN, VERSION_TIME_COLUMN, TablesFileError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


def with_lineage(spark: "SparkSession", df: "DataFrame", refuse: Callable[[str], TablesFileError], *,
                 input_partitions: int | None = None, version_time: bool = False) -> "DataFrame":
    """The table's frame with :data:`POSITION_COLUMN` (when ``input_partitions`` is given: its source's partitions)
    and :data:`VERSION_TIME_COLUMN` (when ``version_time``); ``refuse(why)``: the error to raise when its frame has a
    shape neither fits."""
    from pyspark.sql import functions as F

    jvm = spark._jvm
    plan = df._jdf.queryExecution().analyzed()
    # The plan's top down to the node that reads the source rows or aggregates them: projections and filters of the
    # aggregated rows pass the columns on.
    above = []
    node = plan
    while node.nodeName() in ("Project", "Filter", "SubqueryAlias") and not _reads_source(node):
        above.append(node)
        node = node.child()
    stateful = node.nodeName() == "Aggregate"
    if not stateful and not _reads_source(node):
        raise refuse(f"its frame ends in a {node.nodeName()} over its source, where freshroute can place no input "
                     f"position or version time (an aggregation, or a projection of the source rows, can)")
    child = frame_of(spark, node.child())
    columns: list["Column"] = []
    if input_partitions is not None:
        if not {"partition", "offset"} <= set(child.columns):
            raise refuse("the rows it aggregates no longer have the source's partition and offset columns")
        offsets = [F.when(F.col("partition") == p, F.col("offset")) for p in range(input_partitions)]
        columns.append(F.array(*[F.max(o) for o in offsets] if stateful else offsets).alias(POSITION_COLUMN))
    if version_time:
        if "timestamp" not in child.columns:
            raise refuse("the rows it aggregates no longer have the source's timestamp column, which its "
                          "versions' times come from")
        time = F.unix_millis(F.col("timestamp"))
        columns.append((F.max(time) if stateful else time).alias(VERSION_TIME_COLUMN))
    if not columns:
        return df
    if stateful:
        exprs = child.agg(*columns)._jdf.queryExecution().analyzed().aggregateExpressions()
    else:
        exprs = child.select(*columns)._jdf.queryExecution().analyzed().projectList()
    added = python_list(exprs)
    logical = jvm.org.apache.spark.sql.catalyst.plans.logical
    if stateful:
        node = logical.Aggregate(node.groupingExpressions(), _appended(jvm, node.aggregateExpressions(), added),
                                 node.child(), node.hint())
    else:
        node = logical.Project(_appended(jvm, node.projectList(), added), node.child())
    attributes = [e.toAttribute() for e in added]
    for parent in reversed(above):
        if parent.nodeName() == "Project":
            node = logical.Project(_appended(jvm, parent.projectList(), attributes), node)
        else:
            node = parent.withNewChildren(scala_list(jvm, [node]))
    return frame_of(spark, node)


def aggregates(df: "DataFrame") -> bool:
    """Whether a frame aggregates (its Real-time query then runs a shuffle stage beside its source's)."""
    return _aggregates(df._jdf.queryExecution().analyzed())


def _reads_source(node: Any) -> bool:
    """Whether a plan node is a projection of the source rows themselves (no aggregation below it)."""
    return node.nodeName() == "Project" and not _aggregates(node.child())


def _aggregates(node: Any) -> bool:
    if node.nodeName() == "Aggregate":
        return True
    return any(_aggregates(c) for c in python_list(node.children()))


def _appended(jvm: Any, seq: Any, items: list) -> Any:
    return scala_list(jvm, python_list(seq) + items)

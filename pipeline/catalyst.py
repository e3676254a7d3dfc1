"""Spark's Catalyst plans from Python, through py4j: what :mod:`pipeline.lineage` and :mod:`pipeline.fusion` need to
take an analysed plan apart and build one: Scala sequences both ways, and a DataFrame of a plan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def python_list(seq: Any) -> list[Any]:
    """A Scala sequence's items."""
    return [seq.apply(i) for i in range(seq.size())]


def scala_list(jvm: Any, items: list[Any]) -> Any:
    """A Scala immutable list of ``items``, as Catalyst's constructors take them."""
    java = jvm.java.util.ArrayList()
    for item in items:
        java.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(java).toList()


def frame_of(spark: "SparkSession", plan: Any) -> "DataFrame":
    """The DataFrame of a logical plan (analysed on the way, as any Dataset's)."""
    from pyspark.sql import DataFrame

    return DataFrame(spark._jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, plan), spark)

"""The demo tables: sensor readings (JSON ``{"sensor","area","reading"}`` keyed by sensor on topic ``readings``).

Edit this file, or point ``--tables-file`` at a copy, to define your own tables. Both
forms are shown: a PySpark DataFrame function and Spark SQL, keyed and windowed.
"""

from pyspark.sql import functions as F

from pipeline.tables import source, sql_table, table, tumbling

# Every field is required: a reading without one is rejected before any table sees it (pipeline/validation.py),
# counted, and written to the dead-letter topic readings.rejected with its reason.
source("readings", schema="sensor STRING NOT NULL, area STRING NOT NULL, reading DOUBLE NOT NULL")

# Every table runs in Spark's Real-time Mode (the pipeline's pipeline_mode): each reading reaches its tables'
# changelogs within milliseconds.


@table(name="sensor_stats", key="sensor", source="readings")
def sensor_stats(readings):
    """Per sensor: count, sum, avg, min, max and the last reading."""
    return readings.groupBy("sensor").agg(
        F.count("reading").alias("count"),
        F.sum("reading").alias("sum"),
        F.avg("reading").alias("avg"),
        F.min("reading").alias("min"),
        F.max("reading").alias("max"),
        # "Last" by record time, then partition and offset: the same on every replay,
        # whatever order the records reach the aggregation in.
        F.max_by("reading", F.struct("timestamp", "partition", "offset")).alias("last"),
    )


sql_table(
    name="area_counts",
    key="area",
    source="readings",
    sql="SELECT area, count(*) AS count FROM readings GROUP BY area",
)


# A window's running value changes with each reading; it becomes final when the watermark, which moves at each of
# the query's checkpoints, has passed its end and grace.
@table(name="sensor_windows", key="sensor", source="readings",
       window=tumbling("10 seconds", grace="5 seconds", retention="1 hour"))
def sensor_windows(readings):
    """Per sensor and 10 s of record time: count, avg, min and max; final once no late reading can change it."""
    return readings.groupBy("sensor", "window").agg(
        F.count("reading").alias("count"),
        F.avg("reading").alias("avg"),
        F.min("reading").alias("min"),
        F.max("reading").alias("max"),
    )

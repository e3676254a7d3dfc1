"""A tables file checked before anything starts: every table built over an empty input of its source's shape.

Spark analyses each table's frame as the pipeline would build it — the source's schema parsed and validated, the
table's function or SQL, its key and value columns checked, a versioned table's version time placed — over an empty
batch of records instead of the topic, so a key column that does not exist or SQL naming a missing column is refused
in seconds, naming the file and the table, with no broker and nothing started.

    python -m pipeline.analysis TABLES_FILE      (exit 2 and one line ``freshroute: CODE: message`` when refused)
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from freshroute.errors import FreshrouteError
from freshroute.launch import stopped
from pipeline.tables import TablesDefinition
from pipeline.tables_file import load_tables
from pipeline.validation import RAW_KEY, RAW_VALUE, required_fields, split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The columns of a source's records as pipeline.sources.kafka_stream selects them from Spark's Kafka source.
RECORD_SHAPE = (f"{RAW_KEY} BINARY, {RAW_VALUE} BINARY, key STRING, topic STRING, partition INT, offset BIGINT, "
                f"timestamp TIMESTAMP")


def check(spark: "SparkSession", definition: TablesDefinition) -> None:
    """Build every table of ``definition``; a TablesFileError for the first that cannot be built."""
    from pipeline.sources import source_schema, table_frame, version_times

    for src in definition.sources.values():
        tables = [t for t in definition.tables.values() if t.source == src.name]
        schema = source_schema(src)
        records = spark.createDataFrame([], RECORD_SHAPE)
        rows, _rejected = split(records, src, schema, required_fields(schema, [t.key for t in tables]),
                                [t.window.time_column for t in tables if t.window is not None])
        for t in tables:
            table_frame(spark, definition, t, rows, version_times(spark, t, definition.path))


def session() -> "SparkSession":
    """A small local session for analysis only (no task runs)."""
    from pyspark.sql import SparkSession

    from pipeline.session import archive_options, jit_options
    from pipeline.settings import PipelineSettings

    return (SparkSession.builder.master("local[1]").appName("freshroute-tables-check")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            # A short life: the optimising compiler would only compete with the analysis for the cores.
            .config("spark.driver.extraJavaOptions",
                    jit_options("client", realtime=False, microbatches=False).strip()
                    + archive_options(PipelineSettings().jars_dir))
            .getOrCreate())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.analysis", description=__doc__.split("\n\n")[0])
    p.add_argument("tables_file")
    a = p.parse_args(argv)
    try:
        definition = load_tables(a.tables_file)
        spark = session()
        spark.sparkContext.setLogLevel("ERROR")
        try:
            check(spark, definition)
        finally:
            spark.stop()
    except FreshrouteError as e:
        return stopped(e)
    print(f"{a.tables_file}: {len(definition.tables)} table(s) built: "
          f"{', '.join(sorted(definition.tables))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

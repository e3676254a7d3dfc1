"""A micro-batch query: one or more tables of a source, a batch every trigger, each batch's rows through the Python
sink (:mod:`pipeline.sink`). Tables that share a query (``query=`` in the tables file) read, plan and checkpoint once
for all of them; one query of each source also writes its rejected records (:func:`rejects_query`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pipeline.checkpoints import committed_batches, drop_unfinished_writes
from pipeline.outputs import TableRun, table_run
from pipeline.query import Query, QueryContext
from pipeline.recompute import MARK_FILE, Recomputation
from pipeline.session import codegen
from pipeline.sink import QuerySink, RejectWriter
from pipeline.sources import source_rows, table_frame, version_times
from pipeline.tables import MICROBATCH, QUERY_TABLE_COLUMN, Source, Table, TablesDefinition
from pipeline.tables_file import queries
from pipeline.validation import REJECTED_BRANCH

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipeline.settings import PipelineSettings

log = logging.getLogger("pipeline")

# The last micro-batches of every query, whose median ran within the trigger interval (at least
# WARM_BATCH_MS): the JIT has compiled the hot paths and the Python workers are up. Until then
# a batch takes seconds, and freshness with it. A median, not every batch: with several queries
# sharing two cores, one batch in a few runs long on a warm pipeline too.
WARM_BATCHES = 5
WARM_BATCH_MS = 500

Frames = tuple[list["DataFrame"], "DataFrame | None"]


def trigger_ms(settings: PipelineSettings, tables: list[Table]) -> int:
    """A query's trigger: its tables' (they name the same, or none: the pipeline's)."""
    return settings.trigger_ms if tables[0].trigger_ms is None else tables[0].trigger_ms


def rejects_query(settings: PipelineSettings, definition: TablesDefinition, src: Source,
                  beside: frozenset[str] = frozenset()) -> str | None:
    """The micro-batch query that counts and writes the source's rejected records (every query of the source
    filters them): the one with the longest trigger, since each batch reads the input once more for them. None
    when all its tables run in Real-time Mode: they have a query of their own. A query of versions built or kept
    beside the served ones (``beside``) writes none: they would be written twice."""
    own = {name: tables for name, tables in queries(definition, settings.mode_of).items()
           if tables[0].source == src.name and settings.mode_of(tables[0]) == MICROBATCH
           and not all(t.name in beside for t in tables)}
    return min(own, key=lambda name: (-trigger_ms(settings, own[name]), name)) if own else None


class MicrobatchQuery(Query):
    """A query of micro-batch tables of one source, written by the Python sink a batch at a time."""

    # Its tasks come and go with each batch.
    task_slots = 0
    WARM_REASON = (f"the median of the last {WARM_BATCHES} micro-batches of every query ran within its trigger "
                   f"interval (at least {WARM_BATCH_MS} ms)")

    def __init__(self, context: QueryContext, name: str, tables: list[Table]) -> None:
        super().__init__(context, name, tables[0].source, tables)
        self.trigger_ms = trigger_ms(context.settings, tables)
        self.recent_ms: list[int] = []  # the last WARM_BATCHES batches' durations
        self._frames: Frames | None = None  # built for its tables' specs, for its first start

    def prepare(self, admin: Any) -> None:
        """Starting without a checkpoint over changelogs that hold keys: note where they and its input end, so that
        the keys it no longer produces are found once it has caught up (:mod:`pipeline.recompute`)."""
        from freshroute.changelog_reader import end_offsets
        from pipeline.topics import describe_topic

        s = self.context.settings
        checkpoint = s.query_checkpoint(self.name)
        if committed_batches(checkpoint) or (checkpoint / MARK_FILE).exists():
            return
        topics = {t.name: describe_topic(admin, s.changelog_topic(t.name)) for t in self.tables
                  if t.window is None and t.name not in self.context.ghosts}
        ends = end_offsets(admin, {info.name: info.partitions for info in topics.values() if info is not None})
        changelogs = {name: ends[info.name] for name, info in topics.items() if info is not None}
        if not any(any(e.values()) for e in changelogs.values()):
            return
        source = describe_topic(admin, s.input_topic(self.context.definition.sources[self.source].topic))
        assert source is not None, "inputs are checked first"
        Recomputation(checkpoint, end_offsets(admin, {source.name: source.partitions}), changelogs).save()
        log.info("query %s starts without a checkpoint over changelogs that hold keys (%s): keys it no longer "
                 "produces are looked for once it has read its input to where it ends now", self.name,
                 ", ".join(changelogs))

    def most_slots(self) -> int:
        return 0

    def build(self, admin: Any, rejects: RejectWriter) -> None:
        c = self.context
        self._frames = batched, rejected = self._table_frames()
        self.runs = [table_run(c.settings, c.definition, t, df, admin, c.producer, rejects, self.name,
                               t.name in c.ghosts) for t, df in zip(self.tables, batched)]
        self.rejects = rejects if rejected is not None else None

    def start(self) -> None:
        c = self.context
        s, spark = c.settings, c.spark
        assert spark is not None
        (frames, rejected), self._frames = self._frames or self._table_frames(), None
        branches = [(r.table.name, frame) for r, frame in zip(self.runs, frames)]
        if rejected is not None and self.rejects is not None:
            branches.append((REJECTED_BRANCH, rejected))
        df = union_tables(branches)
        sink = QuerySink([r.writer for r in self.runs], c.producer, s.kafka(),
                         Recomputation.load(s.query_checkpoint(self.name)), self.rejects,
                         frozenset(r.table.name for r in self.runs if r.ghost))
        codegen(spark, False)
        writer = (df.writeStream.queryName(self.name).outputMode("update").foreachBatch(sink.write_batch)
                  .option("checkpointLocation", str(s.query_checkpoint(self.name))))
        writer = (writer.trigger(availableNow=True) if s.available_now
                  else writer.trigger(processingTime=f"{self.trigger_ms} milliseconds"))
        # A query takes the session's settings as it starts. A windowed table's watermark moves at the end of a
        # batch: a batch without input then publishes it (and Spark evicts what it closed), so a quiet stream's
        # windows still become final. Only when the watermark moved: a query of keyed tables never runs one.
        no_data = "spark.sql.streaming.noDataMicroBatches.enabled"
        spark.conf.set(no_data, "true" if self.windowed is not None else "false")
        drop_unfinished_writes(s.query_checkpoint(self.name), self.name)
        try:
            self.query = writer.start()
        finally:
            spark.conf.set(no_data, "false")
        source = s.input_topic(c.definition.sources[self.source].topic)
        for r in self.runs:
            if r.ghost:
                log.info("table %s: retired, computed in query %s for its state only, written nowhere",
                         r.table.name, self.name)
                continue
            log.info("table %s: streaming %s → %s (%d partitions × 1 active + %d standbys, key %s), query %s, "
                     "checkpoint %s", r.table.name, source, r.spec.topic, r.spec.partitions, r.spec.standby_replicas,
                     r.table.key, self.name, s.query_checkpoint(self.name))

    def batch_ended(self, progress: Any) -> None:
        self.recent_ms = [*self.recent_ms, progress.batchDuration][-WARM_BATCHES:]
        super().batch_ended(progress)

    def input_reached(self, run: TableRun, progress: Any) -> None:
        # A batch's report says what there was to read when it started and what it read.
        if self.context.input_lag is not None:
            self.context.input_lag.observe(run.table.name, progress)

    def warm(self) -> bool:
        """The median of its last :data:`WARM_BATCHES` batches ran within its trigger (at least
        :data:`WARM_BATCH_MS`)."""
        return (len(self.recent_ms) == WARM_BATCHES
                and sorted(self.recent_ms)[WARM_BATCHES // 2] <= max(self.trigger_ms, WARM_BATCH_MS))

    def _table_frames(self) -> Frames:
        """Its tables' streaming DataFrames over one read of their source, and its rejected records if this query is
        the one that writes them (:func:`rejects_query`)."""
        c = self.context
        assert c.spark is not None
        src = c.definition.sources[self.source]
        rows, rejected = source_rows(c.spark, c.settings, src, c.source_tables(src.name, self.tables))
        frames = [table_frame(c.spark, c.definition, t, rows, version_times(c.spark, t, c.definition.path))
                  for t in self.tables]
        return frames, rejected if rejects_query(c.settings, c.definition, src, c.beside) == self.name else None


def union_tables(frames: list[tuple[str, "DataFrame"]]) -> "DataFrame":
    """One streaming DataFrame of several tables' frames (name, frame), for one query: each row is
    (:data:`QUERY_TABLE_COLUMN`, one struct column per table), its table's struct set, the others null. One
    frame stays as it is."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    if len(frames) == 1:
        return frames[0][1]
    # Every field nullable: a row's other tables' structs are null, and Arrow refuses a null struct whose
    # fields say they never are (a count, or a window of a non-null timestamp).
    types = [StructType([StructField(f.name, f.dataType, True) for f in df.schema.fields]) for _, df in frames]
    branches = [df.select(F.lit(i).alias(QUERY_TABLE_COLUMN),
                          *[(F.struct(*df.columns).cast(types[i]) if j == i else F.lit(None).cast(types[j])).alias(other)
                            for j, (other, _) in enumerate(frames)])
                for i, (_, df) in enumerate(frames)]
    union = branches[0]
    for branch in branches[1:]:
        union = union.union(branch)
    return union

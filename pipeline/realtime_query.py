"""A Real-time query: its tables' changelog records made in the JVM (:mod:`pipeline.realtime`) and written by Spark's
Kafka sink, from long-running tasks; or, for a source whose tables all run in Real-time Mode, its rejected records.

A source's Real-time tables share one query (:func:`pipeline.tables_file.queries`), which reads and parses each
record once and computes them all in one aggregation (:mod:`pipeline.fusion`).

Its progress comes only at its checkpoints (every ``realtime_checkpoint_interval``), so between them the pipeline
learns how far its table has got from what it wrote (:mod:`pipeline.follower`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pipeline.checkpoints import frozen_shuffle_partitions
from pipeline.follower import committed_offsets
from pipeline.fusion import fuse
from pipeline.input_lag import source_offsets
from pipeline.lineage import aggregates, with_lineage
from pipeline.outputs import TableRun, table_run
from pipeline.query import Query, QueryContext
from pipeline.realtime import changelog_records, dead_letters, refused, start_query, task_slots
from pipeline.session import codegen, running_tasks
from pipeline.sink import RejectWriter
from pipeline.sources import source_rows, table_frame
from pipeline.tables import Table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


log = logging.getLogger("pipeline")


class RealtimeQuery(Query):
    """A Real-time query of one or more tables of a source, whose tasks run for as long as it does."""

    WARM_REASON = "every Real-time query's tasks are running, and every table has caught up with its input"
    _frame: DataFrame | None = None  # built for its tables' specs, for its first start

    def __init__(self, context: QueryContext, name: str, tables: list[Table]) -> None:
        super().__init__(context, name, tables[0].source, tables)
        self._tables: list[tuple[Table, DataFrame]] = []  # each table's frame, as its spec was made from

    def pause_ms(self, progress: Any) -> int | None:
        # Its tasks process for one checkpoint interval; the rest of the batch they are stopped: the state committed,
        # the logs written, the next batch planned and its tasks launched.
        return max(0, progress.batchDuration - self.context.settings.realtime_checkpoint_ms)

    def most_slots(self) -> int:
        # As if it aggregated: whether it does is known once its frame is planned, in the session this sizes.
        return task_slots(self.context.input_partitions[self.source], True, self.shuffle_partitions)

    @property
    def shuffle_partitions(self) -> int:
        """Its shuffle's partitions: as its checkpoint froze them, else as the settings say (its first start)."""
        settings = self.context.settings
        return frozen_shuffle_partitions(settings.query_checkpoint(self.name)) or settings.shuffle_partitions

    def build(self, admin: Any, rejects: RejectWriter) -> None:
        c = self.context
        self._frame = self._query_frame()
        self.runs = [table_run(c.settings, c.definition, t, df, admin, c.producer, rejects, self.name,
                               t.name in c.ghosts) for t, df in self._tables]
        self.task_slots = task_slots(c.input_partitions[self.source], aggregates(self._frame), self.shuffle_partitions)
        if c.reflected is not None:
            # What its last committed checkpoint read is in the changelog: a mark from the start.
            c.reflected.batches_ended(self.runs_read_back(), committed_offsets(c.settings.query_checkpoint(self.name)))

    def start(self) -> None:
        """Start the query: its tables' changelog records, from the frame built for their specs, else a new one."""
        c = self.context
        frame, self._frame = self._frame if self._frame is not None else self._query_frame(), None
        rejects = self.runs[0].writer.rejects
        assert rejects is not None
        self._start(changelog_records([(r.table, r.spec.topic) for r in self.runs], frame,
                                      c.definition.sources[self.source], rejects.topic,
                                      frozenset(r.table.name for r in self.runs if r.ghost)))
        s = c.settings
        source = s.input_topic(c.definition.sources[self.source].topic)
        for r in self.runs:
            if r.ghost:
                log.info("table %s: retired, computed in Real-time query %s for its state only, written nowhere",
                         r.table.name, self.name)
                continue
            log.info("table %s: streaming %s → %s in Real-time Mode (%d partitions × 1 active + %d standbys, "
                     "key %s), checkpoint %s every %s", r.table.name, source, r.spec.topic, r.spec.partitions,
                     r.spec.standby_replicas, r.table.key, s.query_checkpoint(self.name),
                     s.realtime_checkpoint_interval)

    def input_reached(self, run: TableRun, progress: Any) -> None:
        # A checkpoint's offsets, beside what its rows say.
        if self.context.follower is not None and progress.sources:
            self.context.follower.reached(run.table.name, source_offsets(progress.sources[0].endOffset) or {})

    def runs_read_back(self) -> list[TableRun]:
        return [r for r in self.runs if not r.ghost]

    def warm(self) -> bool:
        """Its tasks all running, and each of its tables caught up with its input since the pipeline started."""
        c = self.context
        # Beside micro-batches, whose tasks come and go, the session's count of running tasks says nothing of these:
        # such a pipeline is warm when its micro-batches are.
        if c.microbatches:
            return True
        lag = c.input_lag
        if lag is None or c.spark is None:
            return False
        # Since the start: what arrived while Spark started ran through a JIT still cold. Each table on its own: with
        # input arriving all the time, the tables are seldom all at its end at one instant.
        if any(lag.latest.get(t.name) is None or lag.latest[t.name].caught_up_ms <= lag.started_ms
               for t in self.tables if t.name not in c.ghosts):
            return False
        # Every one of the slots the session's queries hold.
        return self.query is not None and self.query.isActive and running_tasks(c.spark) >= c.slots

    def _start(self, records: "DataFrame") -> None:
        """Start writing ``records`` through Spark's Kafka sink."""
        assert self.context.spark is not None
        # Code generation on: a Real-time query is planned once and runs for hours.
        codegen(self.context.spark, True)
        self.query = start_query(records, self.name, self.context.settings, self.context.windowed_changelogs)

    def _query_frame(self) -> "DataFrame":
        """Its tables' frames over one read of its source, with their rows' input positions: one table's own, or
        several fused into one aggregation (:mod:`pipeline.fusion`)."""
        c = self.context
        spark = c.spark
        assert spark is not None
        src = c.definition.sources[self.source]
        rows, _ = source_rows(spark, c.settings, src, c.source_tables(src.name, self.tables), realtime=True)
        partitions = c.input_partitions[src.name]

        def frame(t: Table) -> "DataFrame":
            return table_frame(spark, c.definition, t, rows, lambda df: with_lineage(
                spark, df, lambda why: refused(t.name, why), input_partitions=partitions, version_time=t.versioned))

        self._tables = [(t, frame(t)) for t in self.tables]
        return self._tables[0][1] if len(self._tables) == 1 else fuse(spark, self.name, rows, self._tables)


class RealtimeRejectsQuery(RealtimeQuery):
    """The Real-time query of a source's rejected records, when all its tables run in Real-time Mode: dead letters,
    or the end of the pipeline, as the source's ``on_invalid`` says."""

    def __init__(self, context: QueryContext, source: str) -> None:
        Query.__init__(self, context, f"{source}.rejected", source, [])

    def most_slots(self) -> int:
        return task_slots(self.context.input_partitions[self.source], False, 0)

    def build(self, admin: Any, rejects: RejectWriter) -> None:
        self.rejects = rejects
        self.task_slots = self.most_slots()

    def start(self) -> None:
        c = self.context
        assert c.spark is not None and self.rejects is not None
        src = c.definition.sources[self.source]
        _, rejected = source_rows(c.spark, c.settings, src, c.source_tables(src.name), realtime=True)
        self._start(dead_letters(src, rejected, self.rejects.topic, self.rejects.partitions))
        log.info("source %s: its rejected records → %s in Real-time Mode", src.name, self.rejects.topic)

"""Where a query's rows go: each table's changelog topic (made if need be), spec and writer, each source's writer of
rejected records, and a windowed table's watermark, published from its query's progress."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from freshroute.errors import FreshrouteError
from freshroute.metadata.tables import TableSpec
from pipeline.sink import ChangelogProducer, ChangelogWriter, RejectWriter
from pipeline.tables import INTERNAL_COLUMNS, Source, Table, TablesDefinition
from pipeline.window_expiry import WindowExpiry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

    from pipeline.settings import PipelineSettings

log = logging.getLogger("pipeline")


@dataclass
class TableRun:
    """One table: its spec, its changelog writer, and what its query's batches did for it."""

    table: Table
    spec: TableSpec
    writer: ChangelogWriter
    last_progress: Any = None  # its query's last micro-batch's progress report seen (for metrics)
    last_pause_ms: int | None = None  # how long its Real-time query's last checkpoint stopped processing
    late_rows_dropped: int = 0  # input rows past their window's grace, since start
    windows_expired: int = 0  # windows tombstoned after their retention, since start
    ghost: bool = False  # a retired version its shared query computes for its state: no changelog, nothing written


def reject_writer(settings: PipelineSettings, admin: Any, src: Source, producer: ChangelogProducer) -> RejectWriter:
    """The writer of the source's rejected records; its dead-letter topic made if need be (with the input's
    partitions and the changelogs' replication)."""
    from freshroute.topics import describe_topic
    from pipeline.topics import ensure_topic

    s = settings
    topic = s.input_topic(src.rejected_topic)
    partitions = 1
    if src.on_invalid == "dead_letter":
        source = describe_topic(admin, s.input_topic(src.topic))
        info = ensure_topic(admin, topic, len(source.partitions) if source else 1, {},
                            replication_factor=s.changelog_replication_factor)
        partitions = len(info.partitions)
    log.info("source %s: records that do not fit its schema are %s", src.name,
             {"dead_letter": f"written to {topic}", "skip": "counted and dropped",
              "fail": "the end of the pipeline"}[src.on_invalid])
    return RejectWriter(src.name, src.on_invalid, topic, partitions, producer)


def table_run(settings: PipelineSettings, definition: TablesDefinition, t: Table, df: "DataFrame", admin: Any,
              producer: ChangelogProducer, rejects: RejectWriter | None, query: str, ghost: bool = False) -> TableRun:
    """The table's changelog topic (created if need be), spec and writer; ``query``: the streaming query computing
    it; ``ghost``: a retired version computed only for its query's state (:mod:`pipeline.versions`), whose changelog
    is neither made nor written: its spec says the settings' partitions."""
    from freshroute.topics import history_topic_config, keep_uncompacted, topic_config
    from pipeline.topics import ensure_topic

    s = settings
    topic = s.changelog_topic(t.name)
    if ghost:
        spec = TableSpec(t.name, topic, s.changelog_partitions, t.key, {}, 0, window=t.window,
                         input_topic=s.input_topic(definition.sources[t.source].topic), pipeline_mode=s.mode_of(t),
                         query=query, history_retention_ms=t.history_retention_ms)
        return TableRun(t, spec, ChangelogWriter(t.name, topic, spec.partitions, t.key, producer, t.window,
                                                 rejects=rejects),
                        ghost=True)
    # Records stay uncompacted longer than a replay takes (a versioned table's, as long as its history).
    lag_ms, kept = s.replay_compaction_lag_ms, "a replay's newer rows"
    if t.versioned:
        history_ms = int(history_topic_config(t.history_retention_ms)["min.compaction.lag.ms"])
        lag_ms, kept = max(lag_ms, history_ms), "the table's history"
    info = ensure_topic(admin, topic, s.changelog_partitions, {**s.changelog_config(), "min.compaction.lag.ms":
                                                                str(lag_ms)},
                        replication_factor=s.changelog_replication_factor)
    if changed := keep_uncompacted(admin, topic, topic_config(admin, topic), lag_ms, kept):
        log.info("table %s: %s", t.name, changed)
    if info.replication_factor != s.changelog_replication_factor:
        log.warning("changelog %s has replication factor %d (setting says %d); Kafka's partition "
                    "reassignment changes it", topic, info.replication_factor, s.changelog_replication_factor)
    if len(info.partitions) != s.changelog_partitions:
        # Existing records are partitioned by the existing count: keep it.
        log.warning("changelog %s has %d partitions (setting says %d); keeping %d", topic,
                    len(info.partitions), s.changelog_partitions, len(info.partitions))
    value_schema = {f.name: f.dataType.simpleString() for f in df.schema.fields
                    if f.name != t.key and f.name not in INTERNAL_COLUMNS}
    standbys = s.standby_replicas if t.standby_replicas is None else t.standby_replicas
    spec = TableSpec(t.name, topic, len(info.partitions), t.key, value_schema, standbys, window=t.window,
                     input_topic=s.input_topic(definition.sources[t.source].topic),
                     pipeline_mode=s.mode_of(t), query=query,
                     history_retention_ms=t.history_retention_ms)
    expiry = WindowExpiry(s.window_index(t.name)) if t.window is not None else None
    return TableRun(t, spec, ChangelogWriter(t.name, topic, spec.partitions, t.key, producer, t.window, expiry,
                                             t.stale_keys, rejects))


def windows_progress(run: TableRun, progress: Any, seen: int, query: "StreamingQuery | None") -> None:
    """Count the late rows of every batch of ``query`` since ``seen``, and publish the watermark (expiring windows)."""
    from pipeline.metrics import late_rows, watermark_ms

    reports = [progress]
    if progress.batchId > seen + 1 and query is not None:
        # Batches that ended between two reads: Spark keeps the recent ones.
        reports = [p for p in query.recentProgress if seen < p.batchId <= progress.batchId]
    late = sum(late_rows(p) for p in reports)
    if late:
        run.late_rows_dropped += late
        log.info("table %s: %d input row(s) arrived past their window's grace and were dropped", run.table.name,
                 late)
    wm = watermark_ms(progress)
    if wm is None:
        return
    try:
        run.windows_expired += run.writer.advance_watermark(wm)
    except FreshrouteError as e:  # the next batch's report tries again
        log.warning("table %s: watermark not published: %s", run.table.name, e.message)


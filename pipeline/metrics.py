"""The pipeline's Prometheus metrics: each table's last micro-batch, as the supervising loop read it.

Gauges of the last batch seen, not counters: the loop reads each query's last progress twice a
second, and a batch that ends between two reads is not seen (the batch id shows the gap).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# A watermark this old means "no event-time column": Spark reports the epoch.
_NO_WATERMARK_MS = 1
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def watermark_ms(progress: Any) -> int | None:
    """The batch's event-time watermark in epoch ms, or None when the table has none."""
    raw = (getattr(progress, "eventTime", None) or {}).get("watermark")
    if not raw:
        return None
    ms = (datetime.fromisoformat(raw.replace("Z", "+00:00")) - _EPOCH) // timedelta(milliseconds=1)
    return ms if ms > _NO_WATERMARK_MS else None


def late_rows(progress: Any) -> int:
    """Input rows the batch dropped as later than the watermark (past a window's grace)."""
    return sum(getattr(op, "numRowsDroppedByWatermark", 0) or 0 for op in getattr(progress, "stateOperators", None) or [])


class PipelineCollector(Collector):
    """Per table: the last batch's id, duration, input rows, rates, changelog records and watermark; per source, the
    records rejected by reason."""

    def __init__(self, runs: Callable[[], Iterable[Any]], rejects: Callable[[], Iterable[Any]] = list) -> None:
        self._runs = runs
        self._rejects = rejects  # each source's RejectWriter

    def collect(self) -> Iterator[GaugeMetricFamily]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"freshroute_pipeline_{name}", doc, labels=["table"])

        batch = gauge("batch_id", "id of the last micro-batch seen")
        duration = gauge("batch_duration_ms", "the last micro-batch's duration (ms)")
        pause = gauge("checkpoint_pause_ms", "how long the last checkpoint of the table's Real-time query stopped "
                      "processing (ms): its batch's duration beyond the checkpoint interval")
        rows = gauge("batch_input_rows", "input rows of the last micro-batch")
        input_rate = gauge("input_rows_per_second", "input rows per second, as Spark reports it for the last batch")
        processed = gauge("processed_rows_per_second", "rows processed per second in the last batch")
        changes = gauge("batch_changelog_records", "changelog records the last micro-batch published")
        deletes = gauge("batch_changelog_deletes", "tombstones among them: keys the last micro-batch deleted")
        watermark = gauge("watermark_ms", "the table's event-time watermark (epoch ms), for tables with one")
        late = CounterMetricFamily("freshroute_pipeline_late_rows_dropped", "input rows dropped as later than the "
                                   "watermark: past their window's grace", labels=["table"])
        stale = gauge("stale_keys", "keys the table held that its recomputation no longer produces, found once it "
                      "caught up with its input (reported or tombstoned, as the table's stale_keys says)")
        expired = CounterMetricFamily("freshroute_pipeline_windows_expired", "windows tombstoned after their retention",
                                      labels=["table"])
        for run in list(self._runs()):
            name = [run.table.name]
            if run.writer.stale_found is not None:
                stale.add_metric(name, run.writer.stale_found)
            p = run.last_progress
            if p is None:
                continue
            batch.add_metric(name, p.batchId)
            duration.add_metric(name, p.batchDuration)
            if run.last_pause_ms is not None:
                pause.add_metric(name, run.last_pause_ms)
            rows.add_metric(name, p.numInputRows)
            input_rate.add_metric(name, p.inputRowsPerSecond or 0.0)
            processed.add_metric(name, p.processedRowsPerSecond or 0.0)
            written = run.writer.written.get(p.batchId)
            if written:
                changes.add_metric(name, written.records)
                deletes.add_metric(name, written.deletes)
            if run.table.window is not None:
                wm = watermark_ms(p)
                if wm is not None:
                    watermark.add_metric(name, wm)
                late.add_metric(name, run.late_rows_dropped)
                expired.add_metric(name, run.windows_expired)
        rejected = CounterMetricFamily("freshroute_pipeline_rejected_records", "input records that did not fit their "
                                       "source's schema, by source and reason (pipeline.validation)",
                                       labels=["source", "reason"])
        for writer in list(self._rejects()):
            for reason, n in sorted(writer.counts.items()):
                rejected.add_metric([writer.source, reason], n)
        yield from (batch, duration, pause, rows, input_rate, processed, changes, deletes, watermark, late, expired,
                    stale, rejected)

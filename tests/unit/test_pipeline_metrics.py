"""The pipeline's Prometheus collector: each table's last micro-batch as the supervising loop saw it."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from freshroute.windows import tumbling
from pipeline.metrics import PipelineCollector, late_rows, watermark_ms
from pipeline.sink import Written


def progress(batch_id: int, watermark: str | None = None):
    return SimpleNamespace(batchId=batch_id, batchDuration=180, numInputRows=25, inputRowsPerSecond=50.0,
                           processedRowsPerSecond=138.9, eventTime={"watermark": watermark} if watermark else {})


def test_a_scrape_reports_each_tables_last_batch_and_a_watermark_only_where_there_is_one():
    runs = [SimpleNamespace(table=SimpleNamespace(name="sensor_stats", window=None), last_progress=progress(41),
                            last_pause_ms=640, writer=SimpleNamespace(written={41: Written(12, 3.0, 4.0, 2)},
                                                                      stale_found=3)),
            SimpleNamespace(table=SimpleNamespace(name="windows", window=tumbling("10s")), late_rows_dropped=3,
                            windows_expired=5, last_progress=progress(7, "2026-11-24T10:00:05.000Z"),
                            last_pause_ms=None, writer=SimpleNamespace(written={}, stale_found=None)),
            SimpleNamespace(table=SimpleNamespace(name="not_started", window=None), last_progress=None,
                            last_pause_ms=None, writer=SimpleNamespace(written={}, stale_found=None))]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PipelineCollector(lambda: runs))
    text = generate_latest(registry).decode()
    for line in ['freshroute_pipeline_batch_id{table="sensor_stats"} 41.0',
                 'freshroute_pipeline_batch_duration_ms{table="sensor_stats"} 180.0',
                 'freshroute_pipeline_checkpoint_pause_ms{table="sensor_stats"} 640.0',
                 'freshroute_pipeline_batch_input_rows{table="sensor_stats"} 25.0',
                 'freshroute_pipeline_input_rows_per_second{table="sensor_stats"} 50.0',
                 'freshroute_pipeline_batch_changelog_records{table="sensor_stats"} 12.0',
                 'freshroute_pipeline_batch_changelog_deletes{table="sensor_stats"} 2.0',
                 'freshroute_pipeline_watermark_ms{table="windows"} 1.795514405e+12',
                 'freshroute_pipeline_late_rows_dropped_total{table="windows"} 3.0',
                 'freshroute_pipeline_windows_expired_total{table="windows"} 5.0',
                 'freshroute_pipeline_stale_keys{table="sensor_stats"} 3.0']:
        assert line in text, (line, text)
    assert 'watermark_ms{table="sensor_stats"}' not in text and "not_started" not in text
    assert 'checkpoint_pause_ms{table="windows"}' not in text  # a micro-batch query's: none
    assert 'late_rows_dropped_total{table="sensor_stats"}' not in text and 'stale_keys{table="windows"}' not in text


def test_the_epoch_watermark_of_a_table_without_event_time_is_none():
    assert watermark_ms(progress(1, "1970-01-01T00:00:00.000Z")) is None
    assert watermark_ms(progress(1)) is None
    assert watermark_ms(progress(1, "2026-11-24T10:00:05.000Z")) == 1_795_514_405_000


def test_late_rows_are_summed_over_a_batchs_stateful_operators():
    report = SimpleNamespace(stateOperators=[SimpleNamespace(numRowsDroppedByWatermark=4),
                                             SimpleNamespace(numRowsDroppedByWatermark=0)])
    assert late_rows(report) == 4
    assert late_rows(SimpleNamespace(stateOperators=[])) == 0

"""Benchmark bookkeeping: target ratios, and the restore rate read from a store node's log."""

from __future__ import annotations

import orjson
import pytest

from loadtest.bench import (FIGURES, evaluate_targets, expected_figures, format_table, interleaved, median_of,
                            together)
from loadtest.restore import changelog_record, restore_rate_from_log


def test_targets_are_ratios_with_their_direction():
    fig = {k: None for k in FIGURES}
    fig.update(router_rest_rps=3000, redis_get_rps=40000, router_grpc_rps=1800, baseline_grpc_rps=2000,
               router_grpc_p50_ms=3.0, direct_store_p50_ms=1.5, freshness_p99_ms=1400, restore_rps=None,
               raw_consume_rps=50000)
    got = {t["target"]: (t["value"], t["met"]) for t in evaluate_targets(fig)}
    assert got["router_rest_rps / redis_get_rps >= 0.15"] == (0.075, False)
    assert got["router_grpc_rps / baseline_grpc_rps >= 0.75"] == (0.9, True)
    assert got["router_grpc_p50_ms / direct_store_p50_ms <= 1.5"] == (2.0, False)
    assert got["freshness_p99_ms <= 25"] == (1400.0, False)
    assert got["freshness_p99_ms_cold <= 200"] == (None, None)
    assert got["stack_idle_cpu_cores <= 0.4"] == (None, None)
    assert got["pipeline_burst_s <= 10"] == (None, None)
    assert got["restore_rps / raw_consume_rps >= 0.6"] == (None, None)
    table = format_table(fig, evaluate_targets(fig))
    assert "[MISS]" in table and "[MET ]" in table and "[n/a ]" in table


def test_compared_figures_alternate_which_runs_first():
    order = []
    xs, ys = interleaved(3, lambda: order.append("a") or len(order), lambda: order.append("b") or len(order))
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert xs == [1, 4, 5] and ys == [2, 3, 6]
    assert median_of([1200.0, None, 900.0, 3000.0]) == 1200.0 and median_of([None]) is None


def test_latency_pairs_run_at_the_same_time():
    # Each side waits for the other to start: run one after the other, the first would time out.
    import threading

    started = threading.Barrier(2, timeout=5)

    def side(name):
        def run():
            started.wait()
            return name
        return run

    assert together(2, side("a"), side("b")) == (["a", "a"], ["b", "b"])


LOG = """2026-11-22 00:30:00,000 INFO store_node.changelog: replica sensor_stats/0 (standby): restoring from the start of changelog x
2026-11-22 00:30:02,500 INFO store_node.changelog: replica sensor_stats/0: caught up at offset 5000 after 5000 offsets in 2.5s (2000/s), now STANDBY
2026-11-22 00:30:03,000 INFO store_node.changelog: replica sensor_stats/3: caught up at offset 4000 after 4000 offsets in 2.0s (2000/s), now ACTIVE
2026-11-22 00:30:03,000 INFO store_node.changelog: replica other_table/3: caught up at offset 9 after 9 offsets in 0.1s (90/s), now ACTIVE
"""


def test_restore_rate_spans_the_earliest_start_to_the_last_catch_up():
    out = restore_rate_from_log(LOG, "sensor_stats")
    # starts at 00:30:00.0 and 00:30:01.0, last catch-up at 00:30:03.0: 9000 offsets in 3 s
    assert out == {"records": 9000, "seconds": 3.0, "replicas": 2, "restore_rps": 3000.0}
    assert restore_rate_from_log(LOG, "missing") is None


def test_restore_rate_never_divides_by_less_than_a_tenth_of_a_second():
    line = ("2026-11-22 00:30:00,000 INFO store_node.changelog: replica t/0: caught up at offset 50 "
            "after 50 offsets in 0.0s (50000/s), now ACTIVE")
    assert restore_rate_from_log(line, "t") == {"records": 50, "seconds": 0.1, "replicas": 1, "restore_rps": 500.0}


def test_scratch_changelog_records_cycle_over_the_keys_with_json_rows():
    assert changelog_record(0, 3)[0] == b"key-0" and changelog_record(4, 3)[0] == b"key-1"
    assert orjson.loads(changelog_record(7, 3)[1]) == {"count": 7, "sum": 7.5, "last": "2026-01-01T00:00:00Z"}


def test_a_run_must_produce_the_figures_its_options_ask_for():
    assert expected_figures(False, False) == list(FIGURES)
    assert expected_figures(False, True) == ["restore_rps", "raw_consume_rps"]
    skipped = expected_figures(True, False)
    assert "restore_rps" not in skipped and "raw_consume_rps" not in skipped and len(skipped) == len(FIGURES) - 2
    warm_only = expected_figures(False, False, no_cold=True)
    assert {"freshness_p99_ms_cold", "local_up_s"}.isdisjoint(warm_only) and len(warm_only) == len(FIGURES) - 2
    assert {"freshness_p99_ms", "freshness_p99_ms_loaded"} <= set(warm_only)


@pytest.mark.parametrize("figure", FIGURES)
def test_every_figure_has_a_load_client_in_the_table(figure):
    assert figure in format_table({k: 1.0 for k in FIGURES}, [])


def test_a_components_footprint_counts_the_processes_it_started_and_the_ones_that_ended():
    """A component's CPU is its whole process tree's: a busy grandchild, and a child that burned
    CPU and exited within the window (reaped by its parent), both count; an idle component ~0."""
    import subprocess
    import sys

    from loadtest.footprint import during

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
    # The parent runs two children that burn 0.4 s and 0.6 s of CPU and exit (waited for), then
    # says so and idles: the window is from before the first starts until then.
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {burn.format(s=0.4)!r}])\n"
        f"subprocess.run([sys.executable, '-c', {burn.format(s=0.6)!r}])\n"
        "print('done', flush=True)\ntime.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    idle.stdout.readline()  # started before the window: its start-up is not idling
    try:
        said, fp = during({"busy": parent.pid, "idle": idle.pid}, parent.stdout.readline)
    finally:
        for p in (parent, idle):
            p.kill()
            p.wait()
    assert said == "done\n"  # the window was the work's: until the parent said so
    assert 0.95 <= fp.cores["busy"] * fp.seconds <= 1.6  # 0.4 + 0.6 s, plus three interpreters starting
    assert fp.cores["idle"] * fp.seconds < 0.02
    assert fp.total_cores == fp.cores["busy"] + fp.cores["idle"]
    assert fp.describe().startswith("busy ")


def test_the_client_bench_counts_only_reads_that_found_their_key():
    from freshroute.client import Lookup
    from freshroute.errors import NoReplicaWithinBound
    from loadtest.clientbench import _check

    def lookup(found: bool) -> Lookup:
        return Lookup("sensor_stats", "sensor-1", found, b"{}" if found else None, 0, "node-1", "active", 0, 0, 1)

    _check("client", lookup(True))
    _check("client", [lookup(True), lookup(True)])
    _check("redis", [b"x", b"y"])
    for missed in (lookup(False), [lookup(True), lookup(False)], [lookup(True), NoReplicaWithinBound("stale")]):
        with pytest.raises(RuntimeError, match="did not find every bench key"):
            _check("client", missed)
    with pytest.raises(RuntimeError, match="not every bench key"):
        _check("redis", [b"x", None])


def test_each_checkpoint_during_the_window_is_noted_once_with_its_pause():
    import time

    import httpx

    from loadtest.bench import CheckpointPauses

    scrapes = iter([(7, 500), (7, 500), (8, 640), (8, 640), (9, 2100)] + [(9, 2100)] * 100)

    def scrape(_request: httpx.Request) -> httpx.Response:
        batch, pause = next(scrapes)
        return httpx.Response(200, text=f'freshroute_pipeline_batch_id{{table="t"}} {batch}.0\n'
                                        f'freshroute_pipeline_checkpoint_pause_ms{{table="t"}} {pause}.0\n')

    real_get = httpx.get
    httpx.get = lambda url, timeout: httpx.Client(transport=httpx.MockTransport(scrape)).get(url)
    try:
        with CheckpointPauses("http://pipeline/metrics") as pauses:
            deadline = time.monotonic() + 10
            while pauses.seen.get("t", []) != [640, 2100] and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        httpx.get = real_get
    assert pauses.seen == {"t": [640, 2100]}  # batch 7 ended before the window opened
    with CheckpointPauses(None) as none:  # no metrics port: nothing seen, nothing asked
        pass
    assert none.seen == {}

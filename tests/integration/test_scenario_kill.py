"""kill -9 of a store node under lookup load: no lookup fails, and every answer is consistent with the changelog."""

from __future__ import annotations

import random
import threading
import time

import httpx
import orjson
import pytest

from freshroute.client import Client
from freshroute.errors import FreshrouteError
from loadtest.scenario import Fault, LoadConfig, run
from tests.integration.stack_fixture import (FIRST_DATA_TIMEOUT_S, all_sensors_served, expected_sensor_stats, produce_readings, start_stack,
                                             wait_until)

SENSORS = 30
VICTIM = "store-node-2"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("scenario-kill"))
    yield s
    s.down()


@pytest.fixture(scope="module")
def readings(stack):
    rng = random.Random(23)
    events = [{"sensor": f"sensor-{i}", "area": "wheel", "reading": round(rng.uniform(0, 100), 2)}
              for i in range(SENSORS)]
    events += [{"sensor": f"sensor-{rng.randrange(SENSORS)}", "area": "cabin", "reading": round(rng.uniform(0, 100), 2)}
               for _ in range(1200)]
    produce_readings(stack, events)
    return events


def test_kill_9_of_a_store_node_under_load(stack, readings, tmp_path):
    expected = expected_sensor_stats(readings)
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
        wait_until(lambda: all_sensors_served(client, expected, max_lag=0), FIRST_DATA_TIMEOUT_S, "every sensor's final stats to be served")
    old_pid = stack.components[VICTIM].pid

    # A loose bound: every partition keeps a replica within it while one node is down.
    cfg = LoadConfig(keys=SENSORS, protocol="both", concurrency=8, rate=120.0, duration_s=24.0, timeout_s=5.0,
                     bound_mix="none:2,max_lag=100000:1,max_staleness_ms=120000:1,session:2", seed=3)
    out = tmp_path / "report"
    summary = run(stack, cfg, [Fault(8.0, "kill", VICTIM, 5.0)], out, check=True, plots=True, title="kill-node")

    events = [f["event"] for f in summary["faults"]]
    assert any(e.startswith(f"kill -9 {VICTIM} (pid {old_pid})") for e in events), events
    assert any(e.startswith(f"start {VICTIM}") for e in events), events
    assert stack.components[VICTIM].pid != old_pid and stack.components[VICTIM].alive()

    assert summary["requests"] >= 1000, summary
    assert summary["failed"] == 0, (summary["errors_by_code"], summary["first_failures"])
    assert summary["outcomes"] == {"ok": summary["requests"]}, summary["outcomes"]
    assert set(summary["by_protocol"]) == {"rest", "grpc"}

    consistency = summary["consistency"]
    assert consistency["ok"], orjson.dumps(consistency, option=orjson.OPT_INDENT_2).decode()
    assert consistency["values_checked"] == summary["requests"]
    assert consistency["session_reads_checked"] > 0 and consistency["bounds_checked"] > 0

    lines = (out / "requests.jsonl").read_bytes().splitlines()
    assert len(lines) == summary["requests"]
    for name in ("summary.json", "timeseries.json", "consistency.json", "throughput.png", "latency.png",
                 "staleness.png", "timeline.png"):
        assert (out / name).stat().st_size > 0, name


def test_kill_9_of_a_store_node_under_client_load(stack, readings, tmp_path):
    """freshroute.client reading the store nodes directly: the same guarantees as through the router."""
    expected = expected_sensor_stats(readings)
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
        wait_until(lambda: all_sensors_served(client, expected, max_lag=0), FIRST_DATA_TIMEOUT_S, "every sensor's final stats to be served")
    old_pid = stack.components[VICTIM].pid

    cfg = LoadConfig(keys=SENSORS, protocol="client", concurrency=8, rate=150.0, duration_s=20.0, timeout_s=5.0,
                     bound_mix="none:2,max_lag=100000:1,max_staleness_ms=120000:1,session:2", seed=5)
    # Beside the load, the synchronous client's session reads every sensor over and over.
    stop = threading.Event()
    seen: list[tuple[int, int]] = []
    failures: list[str] = []

    def session_reads() -> None:
        c = stack.config
        with Client(redis_url=c.redis_url, namespace=c.namespace) as direct:
            session = direct.session()
            for n in range(100_000):
                if stop.is_set():
                    return
                try:
                    r = session.get("sensor_stats", f"sensor-{n % SENSORS}")
                    seen.append((r.partition, r.applied_offset))
                except FreshrouteError as e:
                    failures.append(f"{e.code}: {e.message}")

    reader = threading.Thread(target=session_reads)
    reader.start()
    try:
        summary = run(stack, cfg, [Fault(6.0, "kill", VICTIM, 5.0)], tmp_path / "report", check=True, plots=False,
                      title="kill-node-client")
    finally:
        stop.set()
        reader.join(30)
    assert not failures, failures[:5]
    assert len(seen) > 500
    last: dict[int, int] = {}
    for partition, applied in seen:
        assert applied >= last.get(partition, 0), (partition, applied, last[partition])
        last[partition] = applied

    events = [f["event"] for f in summary["faults"]]
    assert any(e.startswith(f"kill -9 {VICTIM} (pid {old_pid})") for e in events), events
    assert summary["requests"] >= 1000, summary
    assert summary["failed"] == 0, (summary["errors_by_code"], summary["first_failures"])
    assert summary["outcomes"] == {"ok": summary["requests"]}, summary["outcomes"]
    assert set(summary["by_protocol"]) == {"client"}
    consistency = summary["consistency"]
    # Every answer within its bound, every value one the changelog held, no session read backwards.
    assert consistency["ok"], orjson.dumps(consistency, option=orjson.OPT_INDENT_2).decode()
    assert consistency["session_reads_checked"] > 0 and consistency["bounds_checked"] > 0


def test_kill_9_of_a_store_node_during_window_lookups(stack, readings, tmp_path):
    """The demo's sensor_windows read through REST, gRPC and the client while a node dies: no loose-bound lookup fails,
    and every answer's windows are those the changelog held at its position, final as its watermark says."""
    expected = expected_sensor_stats(readings)
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
        wait_until(lambda: all_sensors_served(client, expected, max_lag=0), FIRST_DATA_TIMEOUT_S,
                   "every sensor's final stats to be served")
        span = 30 * 60 * 1000  # every window of the readings, produced minutes ago at most
        now = int(time.time() * 1000)
        wait_until(lambda: all(client.get(f"/v1/tables/sensor_windows/keys/sensor-{i}/windows", params={
            "from": now - span, "to": now + 1, "max_lag": 0}).json().get("windows") for i in range(SENSORS)), 60,
                   "every sensor's windows to be served")
    old_pid = stack.components[VICTIM].pid
    summaries = []
    for protocol, seed in (("both", 7), ("client", 8)):
        cfg = LoadConfig(table="sensor_windows", keys=SENSORS, protocol=protocol, concurrency=8, rate=100.0,
                         duration_s=12.0, timeout_s=5.0, window_span_ms=span,
                         bound_mix="none:2,max_lag=100000:1,max_staleness_ms=120000:1,session:2", seed=seed)
        faults = [Fault(4.0, "kill", VICTIM, 4.0)] if protocol == "both" else []
        summaries.append(run(stack, cfg, faults, tmp_path / protocol, check=True, plots=False,
                             title=f"kill-node-windows-{protocol}"))
    events = [f["event"] for f in summaries[0]["faults"]]
    assert any(e.startswith(f"kill -9 {VICTIM} (pid {old_pid})") for e in events), events
    for summary in summaries:
        assert summary["requests"] >= 500, summary
        assert summary["failed"] == 0, (summary["errors_by_code"], summary["first_failures"])
        consistency = summary["consistency"]
        assert consistency["ok"], orjson.dumps(consistency, option=orjson.OPT_INDENT_2).decode()
        assert consistency["values_checked"] == summary["requests"] and consistency["session_reads_checked"] > 0
    records = [orjson.loads(line) for line in (tmp_path / "both" / "requests.jsonl").read_bytes().splitlines()]
    assert sum(len(r["windows"]) for r in records) >= len(records)  # answers carry windows, not empty lists

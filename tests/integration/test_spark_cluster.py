"""The pipeline on a Spark standalone cluster: a master and a worker from PySpark's own installation.

Readings arrive steadily; mid-stream the worker is killed with kill -9 (its process group: the
worker and the executor it runs, as when its host dies) and a new worker is started. Checked:
the project's code reached the executors as a shipped py-file, the tables equal a
recomputation of every reading produced (none lost, none counted twice), and the stack's status
lists the master and the workers.
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.integration.cluster_support import Readings
from tests.integration.stack_fixture import (FIRST_DATA_TIMEOUT_S, all_sensors_served, expected_sensor_stats,
                                             start_stack, wait_until)

pytestmark = pytest.mark.integration

SENSORS = 30


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("spark-cluster"), nodes=2, spark_cluster=True, routers=1)
    yield s
    s.discard()


def master_state(stack) -> dict:
    return httpx.get(f"{stack.config.spark_master_ui}/json/", timeout=5, follow_redirects=True).json()


def test_a_worker_killed_mid_stream_and_replaced_loses_and_doubles_nothing(stack):
    c = stack.config
    status = {x["name"]: x for x in stack.status()["components"]}
    assert status["spark-master"]["role"] == "spark-master" and status["spark-master"]["url"] == c.spark_master_url
    assert status["spark-worker"]["role"] == "spark-worker" and status["spark-worker"]["alive"]
    assert "--spark-master" in stack.components["pipeline"].command

    readings = Readings(stack, SENSORS, rate=20.0, seed=17).start()
    try:
        with httpx.Client(base_url=c.rest_url, timeout=10) as client:
            wait_until(lambda: all(client.get(f"/v1/tables/sensor_stats/keys/sensor-{i}").status_code == 200
                                   for i in range(SENSORS)), FIRST_DATA_TIMEOUT_S, "every sensor to be served", stack=stack)
        apps = master_state(stack)["activeapps"]
        assert len(apps) == 1 and apps[0]["name"].startswith("freshroute-pipeline-"), apps
        # The executor fetched the project's code from the driver, into its own work directory.
        worker_dir = c.home / "spark" / "spark-worker"
        wait_until(lambda: list(worker_dir.rglob("freshroute-pyfiles.zip")), 30, "the shipped py-file on the worker")

        time.sleep(1)
        victim = stack.components["spark-worker"]
        stack.signal("spark-worker", signal.SIGKILL)  # the worker and its executor, as when the host dies
        wait_until(lambda: not victim.alive(), 10, "the worker to die")
        time.sleep(1)  # readings keep arriving while the cluster has no worker
        replacement = stack.add_spark_worker()
        wait_until(lambda: any(e.get("appid") == apps[0]["id"] for e in _executors(stack, replacement)), 60,
                   "an executor of the pipeline on the new worker")
        time.sleep(2)
    finally:
        events = readings.stop()

    expected = expected_sensor_stats(events)
    assert len(events) >= 250, len(events)
    with httpx.Client(base_url=c.rest_url, timeout=10) as client:
        wait_until(lambda: all_sensors_served(client, expected, max_lag=0), FIRST_DATA_TIMEOUT_S,
                   "every sensor to equal the recomputation of every reading", stack=stack)
    alive = [w for w in master_state(stack)["workers"] if w["state"] == "ALIVE"]
    assert len(alive) == 1, alive


def _executors(stack, worker: str) -> list[dict]:
    """The executors ``worker`` runs now, as its web UI lists them."""
    ui = stack.components[worker].addresses["web_ui"]
    try:
        doc = httpx.get(f"{ui}/json/", timeout=5, follow_redirects=True).json()
    except (httpx.HTTPError, ValueError):
        return []
    return doc.get("executors", [])

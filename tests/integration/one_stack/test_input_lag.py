"""A stopped pipeline never looks fresh: with its input still growing, SIGSTOP of the pipeline makes every answer's
input lag grow (REST, gRPC, the client) within seconds, ``max_input_lag_ms`` refuses those answers and the table's
pipeline shows as not running; SIGCONT brings all of it back. kill -9 of the pipeline does the same, and a new one
catches up from the checkpoint with no reading lost or counted twice. The input's ends are read from the broker by a
store node, so nothing here waits for the stopped pipeline to say anything."""

from __future__ import annotations

import signal
import threading
import time

import grpc
import httpx
import pytest

from freshroute.client import Client
from freshroute.errors import NoReplicaWithinBound, NotYetVisible
from proto import router_pb2, router_pb2_grpc
from tests.integration.cluster_support import Readings
from tests.integration.stack_fixture import (all_sensors_served, expected_sensor_stats, produced, wait_until,
                                             write_reading)

pytestmark = pytest.mark.integration

SENSORS = 8
KEY = "sensor-1"
BOUND_MS = 1000  # a running pipeline is within it between batches (a trigger plus a batch behind: ~0.5–1.5 s)
STOPPED_MS = 2000  # a stopped one gets past it within seconds


def write_one(stack) -> tuple[str, str]:
    """One reading of a sensor of its own, produced and delivered; the sensor and a write token of it."""
    sensor = f"lag-ryw-{int(time.time()) % 100000}"
    return sensor, write_reading(stack, {"sensor": sensor, "area": "ryw", "reading": 5.0,
                                         "ts": int(time.time() * 1000)})


def read_after(client, sensor: str, token: str, within_s: float = 180.0):
    """The sensor's row after ``token``: asked again while no replica has the reading (a new pipeline may take longer
    than one lookup's longest wait to start), never answered without it."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return client.get("sensor_stats", sensor, after=token, wait_ms=30_000)
        except NotYetVisible:
            if time.monotonic() > deadline:
                raise


class Waiting:
    """A call run in a thread of its own: its result (or the error it raised) once it returns."""

    def __init__(self, call) -> None:
        self.outcome = None
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(call,), daemon=True).start()

    def _run(self, call) -> None:
        try:
            self.outcome = call()
        except BaseException as e:  # noqa: BLE001 — the test looks at it
            self.outcome = e
        self._done.set()

    def result(self, timeout_s: float):
        assert self._done.wait(timeout_s), "the lookup did not end"
        return self.outcome


def test_a_stopped_or_killed_pipeline_shows_in_every_answers_input_lag_and_max_input_lag_ms_refuses_it(stack):
    c = stack.config
    readings = Readings(stack, SENSORS, rate=40.0, seed=23).start()
    path = f"/v1/tables/sensor_stats/keys/{KEY}"
    with httpx.Client(base_url=c.rest_url, timeout=10) as http, \
            grpc.insecure_channel(c.grpc_address) as channel, \
            Client(c.redis_url, namespace=c.namespace) as client:
        stub = router_pb2_grpc.RouterStub(channel)

        def rest_lag() -> dict:
            r = http.get(path)
            return r.json()["input_lag"] if r.status_code == 200 else {"records": -1, "ms": -1}

        def pipeline_alive() -> bool:
            return {t["name"]: t for t in http.get("/v1/tables").json()["tables"]}["sensor_stats"]["pipeline"]["alive"]

        def keeping_up() -> bool:
            return http.get(path, params={"max_input_lag_ms": BOUND_MS}).status_code == 200 and pipeline_alive()

        def client_within(bound: int) -> bool:
            try:
                return client.get("sensor_stats", KEY, max_input_lag_ms=bound).found
            except NoReplicaWithinBound:
                return False

        def behind_everywhere(how: str) -> None:
            wait_until(lambda: rest_lag()["ms"] > STOPPED_MS and rest_lag()["records"] > 0, 15,
                       f"the answers' input lag to grow with the pipeline {how}", stack=stack)
            refused = http.get(path, params={"max_input_lag_ms": BOUND_MS})
            err = refused.json()["error"]
            assert refused.status_code == 503 and err["code"] == "NO_REPLICA_WITHIN_BOUND", refused.text
            assert err["input_lag"]["ms"] > STOPPED_MS and err["input_lag"]["records"] > 0
            got = stub.Get(router_pb2.GetRequest(table="sensor_stats", key=KEY), timeout=5)
            assert got.input_lag.ms > STOPPED_MS and got.input_lag.records > 0
            with pytest.raises(grpc.RpcError) as e:
                stub.Get(router_pb2.GetRequest(table="sensor_stats", key=KEY,
                                               bound=router_pb2.Bound(max_input_lag_ms=BOUND_MS)), timeout=5)
            assert e.value.code() is grpc.StatusCode.UNAVAILABLE
            # The client reads the same metadata on its own refresh (every 150 ms).
            wait_until(lambda: client.get("sensor_stats", KEY).input_lag_ms > STOPPED_MS, 5,
                       "the client's answers to say so too", stack=stack)
            direct = client.get("sensor_stats", KEY)
            assert direct.input_lag_records > 0 and direct.node.startswith("node-")
            with pytest.raises(NoReplicaWithinBound):
                client.get("sensor_stats", KEY, max_input_lag_ms=BOUND_MS)
            wait_until(lambda: not pipeline_alive(), 10, "the pipeline to show as not running", stack=stack)
            behind = http.get("/v1/cluster").json()["pipelines"]
            assert {t["table"]: t["alive"] for t in behind}["sensor_stats"] is False

        try:
            wait_until(keeping_up, 120, "the pipeline keeping up with the readings", stack=stack)
            stack.signal("pipeline", signal.SIGSTOP)
            try:
                behind_everywhere("stopped")
            finally:
                stack.signal("pipeline", signal.SIGCONT)
            wait_until(keeping_up, 60, "the pipeline to catch up again", stack=stack)
            wait_until(lambda: client_within(BOUND_MS), 10, "the client's answers within the bound again", stack=stack)

            stack.signal("pipeline", signal.SIGKILL)
            behind_everywhere("killed")
            # A reading written while no pipeline runs: a lookup after it waits for the new one, never answers
            # without it.
            sensor, token = write_one(stack)
            waited = Waiting(lambda: read_after(client, sensor, token))
            time.sleep(1.0)
            assert waited.outcome is None, f"answered with no pipeline running: {waited.outcome}"
            stack.start("pipeline")
            wait_until(keeping_up, 180, "a new pipeline to catch up from the checkpoint", stack=stack)
            outcome = waited.result(200)
            assert not isinstance(outcome, BaseException), outcome
            assert outcome.found and outcome.value["count"] == 1
        finally:
            readings.stop()
        # Every reading counted once: what was read before the kill, and after it from the checkpoint.
        expected = expected_sensor_stats(produced(stack))
        wait_until(lambda: all_sensors_served(http, expected, max_lag=0), 60,
                   "every sensor to be served as a recomputation says", stack=stack)

"""Elastic scaling on the whole stack under a steady lookup load: 3 → 4 → 5 store nodes, then back by draining.

On the shared stack, readings arriving throughout the module. Scaling out, new nodes restore their
share before taking actives over (warm-up); scaling in, a SIGTERM drains a node: it hands its
actives to their standbys and keeps answering until they have taken over. Neither may fail a
lookup, and placements must end balanced: every node within one replica, and one active, of
every other. The stack ends as it began, on its three nodes.
"""

from __future__ import annotations

import threading
import time

import orjson
import pytest

from loadtest.scenario import LoadConfig, run
from tests.integration.cluster_support import (assert_clean_load, Readings, Watch, balanced, fully_replicated, metadata, node_id, spread,
                                               wait_every_sensor_served)
from tests.integration.stack_fixture import FIRST_DATA_TIMEOUT_S, wait_until

pytestmark = pytest.mark.integration

SENSORS = 40


@pytest.fixture(scope="module")
def readings(stack):
    r = Readings(stack, SENSORS, rate=20.0).start()
    wait_every_sensor_served(stack, SENSORS, FIRST_DATA_TIMEOUT_S)
    yield r
    r.stop()


def _load(duration_s: float) -> LoadConfig:
    return LoadConfig(keys=SENSORS, protocol="both", concurrency=8, rate=60.0, duration_s=duration_s,
                      timeout_s=5.0, bound_mix="none:2,max_lag=100000:1,max_staleness_ms=120000:1,session:2", seed=9)


def _under_load(stack, duration_s: float, out, title: str, steps) -> dict:
    """Run ``steps()`` while a lookup load runs, from 2 s into it until 2 s after they are done (``duration_s`` at
    most); returns the load's summary (with its consistency check)."""
    summary: dict = {}
    done = threading.Event()
    load = threading.Thread(target=lambda: summary.update(run(stack, _load(duration_s), [], out, check=True,
                                                              plots=False, title=title, stop=done)))
    load.start()
    try:
        time.sleep(2)
        steps()
        time.sleep(2)
    finally:
        done.set()
        load.join(duration_s + 120)
    return summary


def test_scale_out_from_three_to_five_nodes_under_load(stack, readings, tmp_path):
    md = metadata(stack)
    nodes = {"node-1", "node-2", "node-3"}
    wait_until(lambda: fully_replicated(md, nodes) and balanced(md.assignment(), nodes), 120,
               "three nodes holding an active and a standby of every partition", stack=stack)
    watch = Watch(md).start()
    took: dict[str, float] = {}

    def steps() -> None:
        for _ in range(2):
            t0 = time.monotonic()
            name = stack.add_store_node()
            nodes.add(node_id(name))
            wait_until(lambda: fully_replicated(md, nodes) and balanced(md.assignment(), nodes), 90,
                       f"{name} restored its share and the cluster balanced", interval_s=0.05)
            took[name] = round(time.monotonic() - t0, 2)

    summary = _under_load(stack, 60.0, tmp_path / "report", "scale out 3 → 5", steps)
    watch.stop()
    assignment = md.assignment()
    replicas, actives = spread(assignment)
    print("SCALE-OUT", orjson.dumps({"balanced_after_s": took, "replicas": replicas, "actives": actives,
                                     "assignments_written": len(watch.changes),
                                     "max_heartbeat_gap_ms": watch.max_heartbeat_gap_ms,
                                     "lookups": summary.get("requests"), "failed": summary.get("failed")}).decode())
    assert set(took) == {"store-node-4", "store-node-5"}
    assert nodes == {"node-1", "node-2", "node-3", "node-4", "node-5"}
    assert set(replicas) == nodes and max(replicas.values()) - min(replicas.values()) <= 1, replicas
    assert set(actives) == nodes and max(actives.values()) - min(actives.values()) <= 1, actives
    assert fully_replicated(md, nodes)
    assert not watch.dropped, watch.dropped  # adding nodes never dropped one
    assert_clean_load(summary, per_s=20)  # a third of the 60/s asked: 2 busy cores


def test_scale_in_by_draining_two_nodes_under_load(stack, readings, tmp_path):
    md = metadata(stack)
    nodes = {"node-1", "node-2", "node-3", "node-4", "node-5"}
    wait_until(lambda: fully_replicated(md, nodes) and balanced(md.assignment(), nodes), 90, "five balanced nodes",
               stack=stack)
    took: dict[str, float] = {}

    def steps() -> None:
        for name in ("store-node-5", "store-node-4"):
            t0 = time.monotonic()
            stack.stop(name)  # SIGTERM: drain, hand over, leave
            assert not stack.components[name].alive()
            nodes.discard(node_id(name))
            wait_until(lambda: fully_replicated(md, nodes) and balanced(md.assignment(), nodes), 60,
                       f"{name} drained and the rest rebalanced", interval_s=0.05)
            took[name] = round(time.monotonic() - t0, 2)

    summary = _under_load(stack, 60.0, tmp_path / "report", "scale in 5 → 3 (SIGTERM drain)", steps)
    print("SCALE-IN", orjson.dumps({"stopped_and_rebalanced_s": took, "lookups": summary.get("requests"),
                                    "failed": summary.get("failed")}).decode())
    assert nodes == {"node-1", "node-2", "node-3"}
    assert_clean_load(summary, per_s=20)  # a third of the 60/s asked: 2 busy cores
    for name in ("store-node-4", "store-node-5"):
        log = (stack.config.home / "logs" / f"{name}.log").read_text()
        assert "draining" in log and "Traceback" not in log

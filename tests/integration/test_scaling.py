"""Elastic scaling on the whole stack under a steady lookup load: 2 → 3 → 4 store nodes, then back by draining.

One stack for the module, readings arriving throughout. Scaling out, new nodes restore their
share before taking actives over (warm-up); scaling in, a SIGTERM drains a node: it hands its
actives to their standbys and keeps answering until they have taken over. Neither may fail a
lookup, and placements must end balanced: every node within one replica, and one active, of
every other.
"""

from __future__ import annotations

import threading
import time

import orjson
import pytest

from loadtest.scenario import LoadConfig, run
from tests.integration.cluster_support import (Readings, Watch, balanced, fully_replicated, metadata, node_id, spread,
                                               wait_every_sensor_served)
from tests.integration.stack_fixture import FIRST_DATA_TIMEOUT_S, discard, start_stack, wait_until

pytestmark = pytest.mark.integration

SENSORS = 40


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("scaling"), nodes=2)
    yield s
    discard(s)


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
    """Run ``steps()`` while a lookup load runs, from 4 s into it until 4 s after they are done (``duration_s`` at
    most); returns the load's summary (with its consistency check)."""
    summary: dict = {}
    done = threading.Event()
    load = threading.Thread(target=lambda: summary.update(run(stack, _load(duration_s), [], out, check=True,
                                                              plots=False, title=title, stop=done)))
    load.start()
    try:
        time.sleep(4)
        steps()
        time.sleep(4)
    finally:
        done.set()
        load.join(duration_s + 120)
    return summary


def _assert_clean(summary: dict) -> None:
    assert summary["requests"] >= 20 * summary["duration_s"], summary  # a third of the 60/s asked: 2 busy cores
    assert summary["failed"] == 0, (summary["errors_by_code"], summary["first_failures"])
    consistency = summary["consistency"]
    assert consistency["ok"], orjson.dumps(consistency, option=orjson.OPT_INDENT_2).decode()
    assert consistency["values_checked"] == summary["requests"]


def test_scale_out_from_two_to_four_nodes_under_load(stack, readings, tmp_path):
    md = metadata(stack)
    nodes = {"node-1", "node-2"}
    wait_until(lambda: fully_replicated(md, nodes) and balanced(md.assignment(), nodes), 120,
               "two nodes holding an active and a standby of every partition")
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

    summary = _under_load(stack, 60.0, tmp_path / "report", "scale out 2 → 4", steps)
    watch.stop()
    assignment = md.assignment()
    replicas, actives = spread(assignment)
    print("SCALE-OUT", orjson.dumps({"balanced_after_s": took, "replicas": replicas, "actives": actives,
                                     "assignments_written": len(watch.changes),
                                     "max_heartbeat_gap_ms": watch.max_heartbeat_gap_ms,
                                     "lookups": summary.get("requests"), "failed": summary.get("failed")}).decode())
    assert set(took) == {"store-node-3", "store-node-4"}
    assert nodes == {"node-1", "node-2", "node-3", "node-4"}
    assert set(replicas) == nodes and max(replicas.values()) - min(replicas.values()) <= 1, replicas
    assert set(actives) == nodes and max(actives.values()) - min(actives.values()) <= 1, actives
    assert fully_replicated(md, nodes)
    assert not watch.dropped, watch.dropped  # adding nodes never dropped one
    _assert_clean(summary)


def test_scale_in_by_draining_two_nodes_under_load(stack, readings, tmp_path):
    md = metadata(stack)
    nodes = {"node-1", "node-2", "node-3", "node-4"}
    wait_until(lambda: fully_replicated(md, nodes) and balanced(md.assignment(), nodes), 90, "four balanced nodes")
    took: dict[str, float] = {}

    def steps() -> None:
        for name in ("store-node-4", "store-node-3"):
            t0 = time.monotonic()
            stack.stop(name)  # SIGTERM: drain, hand over, leave
            assert not stack.components[name].alive()
            nodes.discard(node_id(name))
            wait_until(lambda: fully_replicated(md, nodes) and balanced(md.assignment(), nodes), 60,
                       f"{name} drained and the rest rebalanced", interval_s=0.05)
            took[name] = round(time.monotonic() - t0, 2)

    summary = _under_load(stack, 60.0, tmp_path / "report", "scale in 4 → 2 (SIGTERM drain)", steps)
    print("SCALE-IN", orjson.dumps({"stopped_and_rebalanced_s": took, "lookups": summary.get("requests"),
                                    "failed": summary.get("failed")}).decode())
    assert nodes == {"node-1", "node-2"}
    _assert_clean(summary)
    for name in ("store-node-3", "store-node-4"):
        log = (stack.config.home / "logs" / f"{name}.log").read_text()
        assert "draining" in log and "Traceback" not in log

"""Redis Sentinel: kill -9 of the Redis primary under lookup load, then of a store node.

The stack runs ``--redis-sentinel``: a Redis primary, a replica and three sentinels, and every
component (store nodes, routers, pipeline) finds the primary through the sentinels. Checked:
the sentinels promote the replica and no lookup of the load fails meanwhile; the cluster's
membership and assignment live on in the new primary (every partition an active and a
standby, each serving); the assignment stays fenced (its generation never goes back); and a
store node killed after the failover is handled as ever: its actives are promoted and the
replication factor restored.
"""

from __future__ import annotations

import signal
import threading
import time

import orjson
import pytest
import redis

from loadtest.scenario import LoadConfig, run
from tests.integration.cluster_support import (assert_clean_load, TABLE, Readings, StrictProbe, Watch, fully_replicated, keys_by_partition,
                                               lease_holder, metadata, node_id, wait_every_sensor_served)
from tests.integration.stack_fixture import start_stack, wait_until

pytestmark = pytest.mark.integration

SENSORS = 40
NODES = {"node-1", "node-2", "node-3"}
STRICT_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("sentinel"), nodes=3, redis_sentinel=True)
    yield s
    s.discard()


def master_address(stack) -> tuple[str, int] | None:
    location = stack.config.redis_location()
    for host, port in location.sentinels:
        try:
            found = redis.Redis(host=host, port=port, socket_timeout=1).sentinel_get_master_addr_by_name(
                location.master_name)
        except redis.RedisError:
            continue
        if found:
            return found[0].decode() if isinstance(found[0], bytes) else found[0], int(found[1])
    return None


def settled(check) -> bool:
    """``check()``, or False while the sentinels still call the new primary's state in flux."""
    try:
        return check()
    except redis.RedisError:
        return False


def test_components_follow_a_sentinel_failover_and_a_node_killed_afterwards_is_still_handled(stack, tmp_path):
    c = stack.config
    status = stack.status()
    roles = sorted(x["role"] for x in status["components"] if x["role"].startswith("redis"))
    assert roles == ["redis", "redis-replica", "redis-sentinel", "redis-sentinel", "redis-sentinel"], roles
    assert status["redis"]["sentinels"] == c.redis_sentinels and status["redis"]["master_name"]

    readings = Readings(stack, SENSORS, rate=20.0).start()
    md = metadata(stack)
    try:
        wait_every_sensor_served(stack, SENSORS)
        wait_until(lambda: fully_replicated(md, NODES), 120, "an active and a standby of every partition")
        assert master_address(stack) == (c.host, c.redis_port)
        keys = keys_by_partition(SENSORS, md.tables()[TABLE].partitions)
        probe = StrictProbe(c.rest_url, keys, period_s=0.005)
        watch = Watch(md).start()
        summary: dict = {}
        # From 2 s before the Redis kill until 1 s after the strict reads of the node kill: 60 s at most.
        done = threading.Event()
        load = LoadConfig(keys=SENSORS, protocol="both", concurrency=8, rate=60.0, duration_s=60.0, timeout_s=5.0,
                          bound_mix="none:2,max_lag=100000:1,max_staleness_ms=120000:1,session:2", seed=13)
        loader = threading.Thread(target=lambda: summary.update(
            run(stack, load, [], tmp_path / "report", check=True, plots=False, title="sentinel failover",
                stop=done)))
        loader.start()
        try:
            time.sleep(2)
            before = md.assignment()
            redis_killed = time.monotonic()
            stack.signal("redis", signal.SIGKILL)
            wait_until(lambda: master_address(stack) == (c.host, c.redis_replica_port), 30,
                       "the sentinels to promote the replica", interval_s=0.05)
            failover_s = time.monotonic() - redis_killed
            # Membership and assignment live on in the new primary: the same placement, every replica serving.
            wait_until(lambda: settled(lambda: fully_replicated(md, NODES)), 30,
                       "every replica reported serving to the new primary")
            after = md.assignment()
            assert after.replicas == before.replicas and after.generation >= before.generation
            # The lease ran out during the outage (1.2 s): a node takes it again on the new primary.
            wait_until(lambda: settled(lambda: lease_holder(md) is not None), 10, "an assignor holding the lease again")

            victim = "store-node-2"
            vid = node_id(victim)
            led = sorted(p for (t, p), ns in md.assignment().replicas.items() if t == TABLE and ns[0] == vid)
            probe.start()
            time.sleep(1)
            node_killed = time.monotonic()
            stack.signal(victim, signal.SIGKILL)
            watch.forget_gaps(vid)
            wait_until(lambda: fully_replicated(md, NODES - {vid}), 60, "the replication factor restored on the survivors",
                       interval_s=0.05)
            time.sleep(STRICT_WITHIN_S)
            probe.stop()
            time.sleep(1)
        finally:
            probe.stop()
            done.set()
            loader.join(120)
            watch.stop()
    finally:
        readings.stop()

    promoted = md.assignment()
    assert all(promoted.replicas[(TABLE, p)][0] != vid for p in led), (led, promoted.replicas)
    strict = probe.first_ok_after(node_killed, not_node=vid)
    generations = [a.generation for _, a in watch.changes]
    print("SENTINEL", orjson.dumps({"failover_s": round(failover_s, 3), "strict_first_ok_s": strict,
                                    "generations": generations, "lookups": summary.get("requests"),
                                    "failed": summary.get("failed")}, option=orjson.OPT_NON_STR_KEYS).decode())
    assert all(s is not None and s <= STRICT_WITHIN_S for s in strict.values()), strict
    assert generations == sorted(generations), generations
    assert_clean_load(summary, per_s=40)


ROLES, ENTRIES = ["store-node", "router", "pipeline"], ["cli", "module"]


@pytest.fixture(scope="module")
def unknown_master(stack, tmp_path_factory):
    """Each role started by each entry point with a master name no sentinel knows, all at once: (return code, stderr)
    by (role, entry)."""
    import subprocess
    import sys

    c = stack.config
    cwd = tmp_path_factory.mktemp("no-such-master")
    started = {}
    for role in ROLES:
        for entry in ENTRIES:
            own = ["--node-id", "node-x"] if role == "store-node" else []
            command = ["tools.cli", role] if entry == "cli" else [role.replace("-", "_")]
            started[(role, entry)] = subprocess.Popen(
                [sys.executable, "-m", *command, *own, "--redis-sentinels", c.redis_sentinels,
                 "--redis-master-name", "no-such-master", "--namespace", "never-used"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd)
    stderrs = {key: proc.communicate(timeout=60)[1] for key, proc in started.items()}
    return {key: (started[key].returncode, stderr) for key, stderr in stderrs.items()}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_master_name_no_sentinel_knows_stops_a_component_at_start_naming_the_setting(unknown_master, role, entry):
    """``freshroute <role>`` and ``python -m <package>`` are one entry point, and check alike."""
    returncode, stderr = unknown_master[(role, entry)]
    assert returncode == 2, stderr[-2000:]
    assert "CONFIG_ERROR" in stderr and "redis_master_name" in stderr and "'no-such-master'" in stderr
    assert "Traceback" not in stderr

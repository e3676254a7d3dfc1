"""Failover on the whole stack under a steady lookup load: kill -9 of a node (REST and gRPC, the client, window
lookups), of the assignor, a pause, and a wiped disk.

On the shared stack (3 store nodes); readings keep arriving throughout the module, so strict reads
(``max_lag=0``) mean something: a replica answers them only while it holds every record the
broker has. Each kill measures, from the kill:

- strict reads of every partition the dead node was active for, served again (by a survivor);
- the assignment naming a new active for each of them, and reads answered by that new active;
- the replication factor restored: every partition with an active and a standby, both serving,
  on the two survivors;

and checks that no lookup of the load failed and that every answer is consistent with the
changelog. The kills under the client's and under window lookups are the scenario runner's own
faults (``loadtest.scenario``: kill -9, then start again). Figures are printed with ``-s``.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time

from freshroute.client import Client
from freshroute.errors import FreshrouteError

import httpx
import orjson
import pytest

from freshroute.keys import partition_for, serialize_key
from loadtest.scenario import Fault, LoadConfig, run
from proto import store_pb2
from tests.integration.cluster_support import (assert_clean_load, TABLE, Readings, StrictProbe, Watch, balanced, fully_replicated,
                                               keys_by_partition, lease_holder, metadata, node_id, node_status,
                                               read_from_node, wait_every_sensor_served)
from tests.integration.stack_fixture import (FIRST_DATA_TIMEOUT_S, expected_sensor_stats, produced, same_stats,
                                             wait_until)

pytestmark = pytest.mark.integration

SENSORS = 40
BULK_SENSORS = 2000  # their changelog records make the wiped node's restore last seconds at its paced rate
NODES = {"node-1", "node-2", "node-3"}
# The strict-read target; the store nodes' heartbeat expiry is 1.2 s, so a survivor's standby
# must answer long before the dead node is even declared dead.
STRICT_WITHIN_S = 2.0
# Promotion = the 1.2 s expiry + one 100 ms assignment poll + following it; the margin is for a
# loaded 2-core machine.
PROMOTED_WITHIN_S = 3.0


@pytest.fixture(scope="module")
def readings(stack):
    r = Readings(stack, SENSORS, rate=20.0).start()
    wait_every_sensor_served(stack, SENSORS, FIRST_DATA_TIMEOUT_S)
    md = metadata(stack)
    wait_until(lambda: fully_replicated(md, NODES) and balanced(md.assignment(), NODES), 120,
               "an active and a standby of every partition, balanced")
    yield r
    r.stop()


def _load(duration_s: float) -> LoadConfig:
    # Loose bounds: every partition keeps a replica within them while one node is down.
    return LoadConfig(keys=SENSORS, protocol="both", concurrency=8, rate=60.0, duration_s=duration_s,
                      timeout_s=5.0, bound_mix="none:2,max_lag=100000:1,max_staleness_ms=120000:1,session:2", seed=5)


def _kill_under_load(stack, victim: str, out, plots: bool = False) -> dict:
    """kill -9 ``victim`` 3 s into a lookup load that lasts until 2 s after it is back and the cluster balanced again;
    measure; return the figures."""
    md = metadata(stack)
    wait_until(lambda: fully_replicated(md, NODES), 60, "a fully replicated cluster before the kill")
    vid = node_id(victim)
    partitions = md.tables()[TABLE].partitions
    assignment = md.assignment()
    led = sorted(p for (t, p), ns in assignment.replicas.items() if t == TABLE and ns[0] == vid)
    assert led, f"{vid} leads no {TABLE} partition: {assignment.replicas}"
    keys = keys_by_partition(SENSORS, partitions)
    probe = StrictProbe(stack.config.rest_url, {p: keys[p] for p in led if p in keys})
    watch = Watch(md).start()
    summary: dict = {}
    # The failover and the victim's return take about 8 s from the kill at 3 s; the load ends 2 s after them (60 s at
    # most), never before them.
    done = threading.Event()
    load = threading.Thread(target=lambda: summary.update(run(stack, _load(60.0), [], out, check=True, plots=plots,
                                                              title=f"kill -9 {victim}", stop=done)))
    load.start()
    try:
        time.sleep(2)
        probe.start()
        time.sleep(1)
        killed_at = time.monotonic()
        stack.signal(victim, signal.SIGKILL)
        watch.forget_gaps(vid)
        survivors = NODES - {vid}
        wait_until(lambda: fully_replicated(md, survivors), 60, "the replication factor restored on the survivors",
                   interval_s=0.02)
        rf_s = time.monotonic() - killed_at
        time.sleep(2)  # strict reads go on after the failover
        probe.stop()
        stack.start(victim)
        wait_until(lambda: fully_replicated(md, NODES) and balanced(md.assignment(), NODES), 90,
                   f"{vid} back and the cluster balanced again")
        time.sleep(2)  # lookups go on with it back
    finally:
        probe.stop()
        done.set()
        load.join(120)
        watch.stop()
    promoted = next((t - killed_at for t, a in watch.changes
                     if t >= killed_at and all(a.replicas[(TABLE, p)][0] != vid for p in led)), None)
    figures = {
        "victim": vid, "partitions_led": led,
        "strict_first_ok_s": probe.first_ok_after(killed_at, not_node=vid),
        "strict_failed": probe.failures_after(killed_at),
        "promoted_s": promoted,
        "new_active_serves_s": probe.first_active_after(killed_at, vid),
        "replication_restored_s": round(rf_s, 3),
        "nodes_dropped": [n for t, n in watch.dropped],
        "max_heartbeat_gap_ms": watch.max_heartbeat_gap_ms,
        "lookups": summary.get("requests"), "failed": summary.get("failed"),
    }
    print("FAILOVER", orjson.dumps(figures, option=orjson.OPT_NON_STR_KEYS).decode())
    return {"figures": figures, "summary": summary, "watch": watch}


def _assert_failover(result: dict, vid: str) -> None:
    f, summary = result["figures"], result["summary"]
    strict = f["strict_first_ok_s"]
    assert strict and all(s is not None and s <= STRICT_WITHIN_S for s in strict.values()), f
    assert f["promoted_s"] is not None and f["promoted_s"] <= PROMOTED_WITHIN_S, f
    assert all(s is not None and s <= PROMOTED_WITHIN_S + 1.0 for s in f["new_active_serves_s"].values()), f
    # Only the killed node ever left the assignment: nobody else was declared dead under this load.
    assert set(f["nodes_dropped"]) <= {vid}, f
    assert_clean_load(summary, per_s=35)  # 35 of the 60 asked a second


def test_kill_9_of_a_node_under_load(stack, readings, tmp_path):
    md = metadata(stack)
    holder = lease_holder(md)
    assert holder is not None
    victim = next(f"store-node-{n.rsplit('-', 1)[1]}" for n in sorted(NODES) if n != holder[0])
    out = tmp_path / "report"
    result = _kill_under_load(stack, victim, out, plots=True)
    _assert_failover(result, node_id(victim))
    assert lease_holder(md)[0] == holder[0]  # the assignor was not involved
    # Both protocols, every bound kind checked, and the scenario's report whole.
    summary = result["summary"]
    assert set(summary["by_protocol"]) == {"rest", "grpc"}
    assert summary["outcomes"] == {"ok": summary["requests"]}, summary["outcomes"]
    consistency = summary["consistency"]
    assert consistency["session_reads_checked"] > 0 and consistency["bounds_checked"] > 0
    assert len((out / "requests.jsonl").read_bytes().splitlines()) == summary["requests"]
    for name in ("summary.json", "timeseries.json", "consistency.json", "throughput.png", "latency.png",
                 "staleness.png", "timeline.png"):
        assert (out / name).stat().st_size > 0, name


def test_kill_9_of_the_assignor_under_load(stack, readings, tmp_path):
    md = metadata(stack)
    holder = lease_holder(md)
    assert holder is not None
    before = md.assignment().generation
    result = _kill_under_load(stack, f"store-node-{holder[0].rsplit('-', 1)[1]}", tmp_path / "report")
    _assert_failover(result, holder[0])
    after = lease_holder(md)
    assert after is not None and after[0] != holder[0] and after[1] > holder[1], (holder, after)
    assert md.assignment().generation > before
    # Every assignment written after the kill came from the new holder's generation.
    written = [a.generation for _, a in result["watch"].changes[1:]]
    assert written and all(g > holder[1] for g in written), written


def test_a_pause_shorter_than_the_expiry_is_no_failover(stack, readings):
    """A stop-the-world pause of half a second (a long GC pause) must not move a single replica."""
    md = metadata(stack)
    wait_until(lambda: fully_replicated(md, NODES), 60, "a fully replicated cluster")
    holder = lease_holder(md)
    victim = next(f"store-node-{n.rsplit('-', 1)[1]}" for n in sorted(NODES) if holder is None or n != holder[0])
    before = md.assignment()
    watch = Watch(md).start()
    try:
        stack.signal(victim, signal.SIGSTOP)
        time.sleep(0.5)
        stack.signal(victim, signal.SIGCONT)
        time.sleep(3)
    finally:
        stack.signal(victim, signal.SIGCONT)
        watch.stop()
    assert not watch.dropped, watch.dropped
    assert md.assignment().replicas == before.replicas
    print("PAUSED", victim, "0.5 s; heartbeat gaps", watch.max_heartbeat_gap_ms)


def _back_to_full_strength(stack) -> None:
    md = metadata(stack)
    wait_until(lambda: fully_replicated(md, NODES) and balanced(md.assignment(), NODES), 90,
               "every node back and the cluster balanced", stack=stack)


def test_kill_9_of_a_store_node_under_client_load(stack, readings, tmp_path):
    """freshroute.client reading the store nodes directly: the same guarantees as through the router."""
    victim = "store-node-2"
    old_pid = stack.components[victim].pid
    cfg = LoadConfig(keys=SENSORS, protocol="client", concurrency=8, rate=150.0, duration_s=11.0, timeout_s=5.0,
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
                    r = session.get(TABLE, f"sensor-{n % SENSORS}")
                    seen.append((r.partition, r.applied_offset))
                except FreshrouteError as e:
                    failures.append(f"{e.code}: {e.message}")

    reader = threading.Thread(target=session_reads)
    reader.start()
    try:
        summary = run(stack, cfg, [Fault(3.0, "kill", victim, 5.0)], tmp_path / "report", check=True, plots=False,
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
    assert any(e.startswith(f"kill -9 {victim} (pid {old_pid})") for e in events), events
    assert any(e.startswith(f"start {victim}") for e in events), events
    assert stack.components[victim].pid != old_pid and stack.components[victim].alive()
    assert summary["requests"] >= 1000, summary
    assert summary["failed"] == 0, (summary["errors_by_code"], summary["first_failures"])
    assert summary["outcomes"] == {"ok": summary["requests"]}, summary["outcomes"]
    assert set(summary["by_protocol"]) == {"client"}
    consistency = summary["consistency"]
    # Every answer within its bound, every value one the changelog held, no session read backwards.
    assert consistency["ok"], orjson.dumps(consistency, option=orjson.OPT_INDENT_2).decode()
    assert consistency["session_reads_checked"] > 0 and consistency["bounds_checked"] > 0
    _back_to_full_strength(stack)


def test_kill_9_of_a_store_node_during_window_lookups(stack, readings, tmp_path):
    """The demo's sensor_windows read through REST, gRPC and the client while a node dies: no loose-bound lookup fails,
    and every answer's windows are those the changelog held at its position, final as its watermark says."""
    victim = "store-node-1"
    span = 30 * 60 * 1000  # every window of the readings, produced minutes ago at most
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
        now = int(time.time() * 1000)
        wait_until(lambda: all(client.get(f"/v1/tables/sensor_windows/keys/sensor-{i}/windows", params={
            "from": now - span, "to": now + 1}).json().get("windows") for i in range(SENSORS)), 60,
                   "every sensor's windows to be served", stack=stack)
    old_pid = stack.components[victim].pid
    # REST, gRPC and client workers in turn.
    cfg = LoadConfig(table="sensor_windows", keys=SENSORS, protocol="all", concurrency=9, rate=120.0,
                     duration_s=10.0, timeout_s=5.0, window_span_ms=span,
                     bound_mix="none:2,max_lag=100000:1,max_staleness_ms=120000:1,session:2", seed=7)
    summary = run(stack, cfg, [Fault(2.0, "kill", victim, 4.0)], tmp_path / "windows", check=True, plots=False,
                  title="kill-node-windows")
    events = [f["event"] for f in summary["faults"]]
    assert any(e.startswith(f"kill -9 {victim} (pid {old_pid})") for e in events), events
    assert summary["requests"] >= 600, summary
    assert set(summary["by_protocol"]) == {"rest", "grpc", "client"}, summary["by_protocol"]
    assert summary["failed"] == 0, (summary["errors_by_code"], summary["first_failures"])
    consistency = summary["consistency"]
    assert consistency["ok"], orjson.dumps(consistency, option=orjson.OPT_INDENT_2).decode()
    assert consistency["values_checked"] == summary["requests"] and consistency["session_reads_checked"] > 0
    records = [orjson.loads(line) for line in (tmp_path / "windows" / "requests.jsonl").read_bytes().splitlines()]
    assert sum(len(r["windows"]) for r in records) >= len(records)  # answers carry windows, not empty lists
    _back_to_full_strength(stack)


def test_a_wiped_node_restores_then_serves_the_recomputed_values(stack, readings):
    md = metadata(stack)
    victim = "store-node-3"
    vid = node_id(victim)
    bulk = readings.burst(BULK_SENSORS)
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as client:
        wait_until(lambda: all(client.get(f"/v1/tables/{TABLE}/keys/{k}").status_code == 200 for k in bulk[::97]),
                   180, "the bulk sensors to be served", stack=stack)
    wait_until(lambda: fully_replicated(md, NODES), 60, "a fully replicated cluster")
    stack.stop(victim)  # SIGTERM: drains, hands its actives over
    shutil.rmtree(stack.config.home / "data" / vid)
    # Paced so that RESTORING lasts long enough to be seen from outside.
    stack.start(victim, "--apply-rate-limit", "1000", "--restore-log-interval-ms", "500")
    try:
        _restores_and_serves(stack, md, victim, readings)
    finally:  # the stack is shared: the node applies at full speed again for the modules after this one
        stack.stop(victim)
        stack.start(victim)
    _back_to_full_strength(stack)


def _restores_and_serves(stack, md, victim: str, readings: Readings) -> None:
    """``victim`` restores from the changelog's start, then serves every hosted sensor's recomputed stats."""
    vid = node_id(victim)

    def states() -> set[str]:
        report = md.nodes().get(vid)
        return {r.state.value for r in report.replicas} if report is not None else set()

    wait_until(lambda: "RESTORING" in states(), 60, f"{vid} to report restoring replicas", interval_s=0.05,
               stack=stack)
    wait_until(lambda: fully_replicated(md, NODES) and balanced(md.assignment(), NODES), 180,
               f"{vid} restored, serving, and the cluster balanced", stack=stack)
    readings.stop()
    expected = expected_sensor_stats(produced(stack))
    address = stack.components[victim].addresses["address"]
    hosted = {int(t.split("/")[1]) for t in node_status(address).tables if t.startswith(f"{TABLE}/")}
    assert hosted
    partitions = md.tables()[TABLE].partitions
    mine = [s for s in expected if partition_for(serialize_key(s), partitions) in hosted]

    def node_matches() -> bool:
        got = read_from_node(stack.components[victim].addresses["read_address"], mine, partitions)
        return all(got[s].status == store_pb2.OK and same_stats(orjson.loads(got[s].value), expected[s]) for s in mine)

    wait_until(node_matches, 120, f"{vid} to serve every hosted sensor's recomputed stats", stack=stack)
    log = (stack.config.home / "logs" / f"{victim}.log").read_text()
    assert "restoring from the start of changelog" in log
    assert "restoring sensor_stats:" in log or "restoring area_counts:" in log  # progress lines
    assert "caught up at offset" in log
    st = node_status(address)
    assert all(c.resumed_from == 0 for c in st.counters)
    restored = [line for line in log.splitlines() if "caught up at offset" in line][-len(st.replicas):]
    print(f"RESTORED {vid}: partitions {sorted(hosted)}, {len(mine)} sensors checked", *restored, sep="\n")

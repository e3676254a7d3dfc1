"""The partition harness's parts that need no namespaces: the rules a cut writes, what a dead run leaves, and how a
scenario's row reads its recording."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from freshroute.windows import hopping, tumbling

from loadtest.partitions import network
from loadtest.partitions.faults import SCENARIOS, NetworkFaults
from loadtest.partitions.figures import fresh_claims_end, scenario_row, shows_and_recovers
from loadtest.partitions.network import Link, Network
from loadtest.partitions.settled import Settled


def answer(t: float, offsets: int | None = 0, ms: int | None = 0, outcome: str = "ok", input_ms: int = 0) -> dict:
    return {"t": t, "outcome": outcome, "lag": {"offsets": offsets, "ms": ms},
            "input_lag": {"records": 0, "ms": input_ms}}


def test_the_cut_shows_at_the_first_answer_labelled_behind_and_ends_at_the_last_one_after_healing():
    records = [answer(1.0), answer(5.0, ms=3000),  # stale before the cut: not the cut's
               answer(10.2), answer(11.1, offsets=None, ms=900), answer(12.0, ms=2500),
               answer(20.5, outcome="unavailable"), answer(23.4, ms=2100), answer(24.0)]
    assert shows_and_recovers(records, cut=10.0, heal=20.0, slack_ms=2000) == (1.1, 3.4)


def test_an_input_that_stopped_reaching_the_tables_shows_in_the_input_lag():
    records = [answer(9.0), answer(11.0, input_ms=1500), answer(12.5, input_ms=2600), answer(21.0, input_ms=9000),
               answer(22.0, input_ms=300)]
    assert shows_and_recovers(records, cut=10.0, heal=20.0, slack_ms=2000) == (2.5, 1.0)


def test_a_cut_nobody_noticed_shows_never_and_one_gone_by_the_heal_is_whole_at_once():
    assert shows_and_recovers([answer(t) for t in (9.0, 11.0, 25.0)], 10.0, 20.0, 2000) == (None, None)
    assert shows_and_recovers([answer(11.0, ms=3000), answer(21.0)], 10.0, 20.0, 2000) == (1.0, 0.0)


def test_the_cut_off_node_vouches_until_its_last_answer_labelled_fresh_arrives():
    def served(t: float, node: str, latency_ms: float = 10, **lag) -> dict:
        return {**answer(t, **lag), "served_by": {"node": node}, "latency_ms": latency_ms}

    records = [served(9.0, "node-2"),  # before the cut
               served(10.5, "node-2", latency_ms=400),  # asked before its labels could know, arrived at 10.9
               served(11.0, "node-1"),  # another node's: not the cut's
               served(11.2, "node-2", offsets=None, ms=1200),  # unknown: not vouching
               served(11.4, "node-2", outcome="unavailable"),
               served(21.0, "node-2")]  # after healing
    assert fresh_claims_end(records, "node-2", cut=10.0, heal=20.0, slack_ms=2000) == 0.9
    assert fresh_claims_end(records[3:], "node-2", cut=10.0, heal=20.0, slack_ms=2000) is None


def test_a_cut_off_node_shows_behind_in_its_labels_or_in_the_view_whichever_comes_first(tmp_path):
    import orjson

    def served(t: float, node: str, **lag) -> dict:
        return {**answer(t, **lag), "served_by": {"node": node}, "latency_ms": 10}

    def row(records: list[dict], scenario: str, view: float | None) -> dict:
        (tmp_path / "r.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        summary = {"faults": [{"t": 10.0, "event": "cut store-node-2 <-/-> broker for 10s"},
                              {"t": 20.0, "event": "heal store-node-2 <-/-> broker"}]}
        return scenario_row(SCENARIOS[scenario], summary, tmp_path / "r.jsonl", 2000, Settled([]), (view, 1.0))

    # The router sent every read elsewhere before one reached the node: its labels never said behind, the view did.
    fresh = [served(9.0, "node-2", offsets=None), served(10.3, "node-2"), served(11.5, "node-1", offsets=None)]
    r = row(fresh, "node-broker", view=1.2)
    assert (r["labelled_behind_s"], r["shown_behind_s"], r["fresh_claims_s"]) == (None, 1.2, 0.31)
    assert (r["operator_s"], r["operator_cleared_s"]) == (1.2, 1.0)
    r = row([*fresh, served(10.8, "node-2", offsets=None, ms=900)], "node-broker", view=1.2)
    assert (r["labelled_behind_s"], r["shown_behind_s"]) == (0.81, 0.81)
    assert row(fresh, "node-broker", view=None)["shown_behind_s"] is None  # shown nowhere
    # Where the view's sign is not the node's replicas behind (a node cut off from Redis shows dead), only labels.
    assert row(fresh, "node-redis", view=1.17)["shown_behind_s"] is None
    assert row(fresh, "router-node", view=None)["labelled_behind_s"] is None


def test_a_row_refuses_a_scenario_whose_cut_was_never_made(tmp_path):
    (tmp_path / "r.jsonl").write_bytes(b"")
    summary = {"faults": [{"t": 10.0, "event": "FAILED cut-both store-node-2>broker: nft: not found"}]}
    with pytest.raises(RuntimeError, match="not applied"):
        scenario_row(SCENARIOS["node-broker"], summary, tmp_path / "r.jsonl", 2000, Settled([]))


def test_a_cut_drops_the_peers_packets_in_the_places_namespace_and_healing_deletes_its_table(monkeypatch):
    calls = []
    monkeypatch.setattr(network, "run_ip", lambda *args, ns=None, stdin=None: calls.append((args, ns, stdin)) or "")
    net = Network("frp7", {"frp7-store-node-2": "10.77.0.12", "frp7-broker": "10.77.0.21"}, "10.77.0.100")
    net.cut(Link("frp7-store-node-2", "frp7-broker", "out"))
    (args, ns, rules), = calls
    assert args == ("nft", "-f", "-") and ns == "frp7-store-node-2"
    assert "hook output" in rules and "ip daddr 10.77.0.21 drop" in rules and "hook input" not in rules
    net.cut(Link("frp7-store-node-2", "frp7-broker", "out"))  # cut already: nothing more
    assert len(calls) == 1
    net.heal_all()
    assert calls[-1] == (("nft", "delete", "table", "inet", "freshroute_cut_0"), "frp7-store-node-2", None)
    with pytest.raises(ValueError):
        Link("a", "b", "sideways")


def test_only_namespaces_of_runs_whose_harness_is_gone_are_leftovers():
    dead = 2 ** 22 + 12345  # above any pid_max this machine hands out
    assert not os.path.exists(f"/proc/{dead}")
    names = [f"frp{os.getpid()}-hub", f"frp{dead}-hub", f"frp{dead}-store-node-1", "other-ns", "frpx-hub"]
    assert network.leftover_tags(names) == {f"frp{dead}"}


def test_a_scenario_names_components_and_the_injector_maps_them_to_their_namespaces():
    class Config:
        @staticmethod
        def place_of(name: str) -> str:
            return f"frp7-{name}"

    class Stack:
        config = Config()

    faults = NetworkFaults(Stack(), 0.0, print, network=None)  # type: ignore[arg-type]
    (fault,) = SCENARIOS["node-broker-in"].faults(10.0, 5.0)
    assert (fault.at_s, fault.hold_s) == (10.0, 5.0)
    assert faults.links(fault) == [Link("frp7-store-node-2", "frp7-broker", "in")]
    (fault,) = SCENARIOS["redis-sentinel"].faults(10.0, 5.0)
    assert [link.peer for link in faults.links(fault)] == ["frp7-redis-sentinel-1", "frp7-redis-sentinel-2",
                                                           "frp7-redis-replica"]
    assert SCENARIOS["redis-sentinel"].sentinel and not SCENARIOS["node-redis"].sentinel


def test_the_cluster_view_shows_a_node_behind_dead_or_the_metadata_lost_and_when_it_clears():
    from loadtest.partitions.watch import ClusterWatch, metadata_lost

    def view(offsets: int | None, ms: int, alive: bool = True, redis_ok: bool = True) -> dict:
        replica = {"table": "t", "partition": 0, "lag": {"offsets": offsets, "ms": ms}}
        return {"nodes": [{"node": "node-1", "alive": True, "replicas": [dict(replica, lag={"offsets": 0, "ms": 0})]},
                          {"node": "node-2", "alive": alive, "replicas": [replica]}],
                "metadata": {"redis_ok": redis_ok}}

    watch = ClusterWatch("http://unused", "http://unused/metrics")
    watch.seen = [(100.0, view(0, 0)), (110.5, view(0, 0)), (111.2, view(None, 1200)), (120.4, view(None, 9000)),
                  (121.0, view(0, 0, redis_ok=False)), (122.0, view(0, 0, alive=False))]
    behind = SCENARIOS["node-broker"].sign(2000)
    assert watch.shows(behind, t0=100.0, cut=10.0, heal=20.0) == (1.2, 1.0)
    assert watch.shows(SCENARIOS["node-redis"].sign(2000), 100.0, 10.0, 20.0) == (22.0 - 10.0, None)
    assert watch.shows(metadata_lost, 100.0, 10.0, 20.0) == (11.0, 2.0)
    assert SCENARIOS["router-node"].sign(2000) is None
    lagging = {"tables": [{"name": "sensor_stats", "input_lag": {"records": 40, "ms": 2500}}]}
    assert SCENARIOS["pipeline-broker"].sign(2000)(lagging)
    assert not SCENARIOS["pipeline-redis"].sign(3000)(lagging)


def test_the_recomputation_is_the_demo_tables_definitions_last_by_record_time_then_partition_and_offset(monkeypatch):
    import orjson

    from freshroute import changelog_reader
    from loadtest.partitions.settled import recomputed

    class Message:
        def __init__(self, sensor: str, reading: float, ts: int, partition: int, offset: int) -> None:
            self._v = orjson.dumps({"sensor": sensor, "area": "east" if sensor == "s1" else "west",
                                    "reading": reading})
            self._ts, self._p, self._o = ts, partition, offset

        def value(self): return self._v
        def timestamp(self): return (1, self._ts)
        def partition(self): return self._p
        def offset(self): return self._o

    messages = [Message("s1", 3.0, 100, 0, 0), Message("s1", 1.0, 300, 0, 2), Message("s1", 7.0, 200, 0, 1),
                Message("s2", 5.0, 100, 1, 0)]

    def consume(bootstrap, topic, on_message, *args, **kwargs):
        for m in messages:
            on_message(m)
        return len(messages), 0.0, {}

    monkeypatch.setattr(changelog_reader, "consume_to_end", consume)
    stats = {"s1": {"count": 3, "sum": 11.0, "avg": 11.0 / 3, "min": 1.0, "max": 7.0, "last": 1.0},
             "s2": {"count": 1, "sum": 5.0, "avg": 5.0, "min": 5.0, "max": 5.0, "last": 5.0}}
    areas = {"east": {"count": 3}, "west": {"count": 1}}
    assert recomputed("b", "readings", None) == {"sensor_stats": stats, "area_counts": areas}
    # Windows of 200 ms by record time: s1's readings at 100 and 200 ms fall in two.
    assert recomputed("b", "readings", tumbling(200))["sensor_windows"] == {
        "s1": {0: {"count": 1, "avg": 3.0, "min": 3.0, "max": 3.0}, 200: {"count": 2, "avg": 4.0, "min": 1.0, "max": 7.0}},
        "s2": {0: {"count": 1, "avg": 5.0, "min": 5.0, "max": 5.0}}}
    assert sorted(recomputed("b", "readings", hopping(200, 100))["sensor_windows"]["s1"]) == [0, 100, 200, 300]


class Windows:
    """A router's windows endpoint of one key, as an ``httpx.Client`` is asked for it."""

    def __init__(self, windows: dict[int, tuple[dict, bool]], watermark: int) -> None:
        self.windows, self.watermark, self.asked = windows, watermark, []

    def get(self, path: str, params: dict) -> SimpleNamespace:
        self.asked.append((params["from"], params["to"], params["max_lag"]))
        served = [{"start": s, "value": v, "final": f} for s, (v, f) in sorted(self.windows.items())
                  if params["from"] <= s < params["to"]]
        return SimpleNamespace(status_code=200, json=lambda: {"windows": served, "watermark_ms": self.watermark})


def w(count: int, low: float, high: float) -> dict:
    return {"count": count, "avg": (low + high) / 2 if count == 2 else low, "min": low, "max": high}


def test_settled_windows_equal_their_recomputation_or_lack_exactly_the_readings_dropped_late():
    from loadtest.partitions.settled import settled_windows

    spec = tumbling(10_000, grace=5_000, retention=3_600_000)
    want = {"s1": {0: w(2, 1.0, 3.0), 10_000: w(1, 5.0, 5.0), 20_000: w(1, 9.0, 9.0)}}
    whole = Windows({0: (w(2, 1.0, 3.0), True), 10_000: (w(1, 5.0, 5.0), True), 20_000: (w(1, 9.0, 9.0), False)},
                    watermark=20_000)
    settled = settled_windows(whole, spec, want, dropped=0, keys=["s1"])  # type: ignore[arg-type]
    assert settled.differing == [] and settled.late == 0 and settled.checked == 3
    assert settled.served[("s1", 10_000)] == w(1, 5.0, 5.0)
    assert whole.asked == [(0, 30_000, 0)]
    # A final window a reading came too late for: no loss when the pipeline counted it dropped, a loss when not.
    short = Windows({**whole.windows, 0: (w(1, 1.0, 1.0), True)}, watermark=20_000)
    assert settled_windows(short, spec, want, dropped=1, keys=["s1"]).differing == []  # type: ignore[arg-type]
    assert settled_windows(short, spec, want, dropped=0, keys=["s1"]).differing == ["sensor_windows/s1@0"]  # type: ignore[arg-type]
    # An open window short of a reading, a window missing that is not final, one with a reading too many: lost.
    lost = Windows({0: (w(2, 1.0, 3.0), True), 10_000: (w(2, 5.0, 6.0), True), 20_000: (w(1, 8.0, 8.0), False)},
                   watermark=20_000)
    assert settled_windows(lost, spec, want, dropped=0, keys=["s1"]).differing == [  # type: ignore[arg-type]
        "sensor_windows/s1@10000", "sensor_windows/s1@20000"]
    missing = Windows({0: (w(2, 1.0, 3.0), True), 10_000: (w(1, 5.0, 5.0), True)}, watermark=20_000)
    assert settled_windows(missing, spec, want, dropped=1, keys=["s1"]).differing == [  # type: ignore[arg-type]
        "sensor_windows/s1@20000"]


def test_a_window_labelled_final_that_changed_afterwards_is_refuted(tmp_path):
    import orjson

    from loadtest.partitions.settled import finals_refuted

    recording = tmp_path / "requests.jsonl"
    answers = [{"t": 1.0, "key": "s1", "windows": [{"start": 0, "value": w(1, 1.0, 1.0), "final": False}]},
               {"t": 2.0, "key": "s1", "windows": [{"start": 0, "value": w(2, 1.0, 3.0), "final": True}]},
               {"t": 3.0, "key": "s2", "windows": [{"start": 0, "value": w(1, 4.0, 4.0), "final": True}]},
               {"t": 3.5, "key": "s1", "outcome": "unavailable"}]
    recording.write_bytes(b"\n".join(orjson.dumps(a) for a in answers) + b"\n")
    checked, refuted = finals_refuted(recording, {("s1", 0): w(2, 1.0, 3.0), ("s2", 0): w(2, 4.0, 6.0)})
    assert checked == 2 and len(refuted) == 1 and refuted[0].startswith("s2@0:")


def test_the_routers_metrics_show_a_node_behind_dead_or_redis_lost():
    from loadtest.partitions.watch import router_samples

    exposition = "\n".join([
        '# TYPE freshroute_router_replica_lag_offsets gauge',
        'freshroute_router_replica_lag_offsets{table="t",partition="0",node="node-1",role="active"} 0.0',
        '# TYPE freshroute_router_replica_staleness_ms gauge',
        'freshroute_router_replica_staleness_ms{table="t",partition="0",node="node-1",role="active"} 0.0',
        'freshroute_router_replica_staleness_ms{table="t",partition="0",node="node-2",role="standby"} 300.0',
        '# TYPE freshroute_router_replica_alive gauge',
        'freshroute_router_replica_alive{table="t",partition="0",node="node-1",role="active"} 1.0',
        'freshroute_router_replica_alive{table="t",partition="0",node="node-2",role="standby"} 0.0',
        '# TYPE freshroute_router_redis_up gauge', 'freshroute_router_redis_up 1.0',
        '# TYPE freshroute_router_lookups_total counter', 'freshroute_router_lookups_total{outcome="ok"} 5.0', ""])
    view = {"metrics": router_samples(exposition)}
    assert len(view["metrics"]) == 6  # the router's own gauges only
    behind, dead = SCENARIOS["node-broker"].metrics_sign(2000), SCENARIOS["node-redis"].metrics_sign(2000)
    assert behind(view)  # node-2's offset lag has no sample: unknown
    assert dead(view)
    assert not SCENARIOS["router-redis"].metrics_sign(2000)(view)
    assert SCENARIOS["pipeline-broker"].metrics_sign(2000) is None

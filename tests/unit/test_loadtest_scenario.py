"""Fault schedules of the scenarios, and the fault injector against a fake stack (no processes)."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

import pytest

from loadtest.scenario import Fault, FaultInjector, faults_for, worker_protocol


@dataclass
class _Comp:
    pid: int
    up: bool = True

    def alive(self) -> bool:
        return self.up


@dataclass
class _Stack:
    components: dict = field(default_factory=lambda: {"store-node-2": _Comp(100), "redis": _Comp(200)})
    calls: list = field(default_factory=list)

    def signal(self, name, sig):
        self.calls.append(("signal", name, sig))
        if sig == signal.SIGKILL:
            self.components[name].up = False

    def stop(self, name):
        self.calls.append(("stop", name))
        self.components[name].up = False

    def start(self, name):
        self.calls.append(("start", name))
        self.components[name] = _Comp(self.components[name].pid + 1)
        return self.components[name]


def _injector(stack):
    return FaultInjector(stack, time.monotonic(), lambda _m: None)


def test_schedules_put_the_fault_a_third_into_the_run():
    assert faults_for("kill-node", 30, "store-node-2", 5) == [Fault(10.0, "kill", "store-node-2", 5)]
    assert faults_for("redis-outage", 30, "store-node-2", 4) == [Fault(10.0, "redis-outage", "redis", 4)]
    assert faults_for("steady", 30, "store-node-2", 5) == []
    assert [f.action for f in faults_for("all", 50, "store-node-1", 2)] == ["kill", "pause", "restart", "redis-outage"]
    with pytest.raises(ValueError):
        faults_for("meteor", 30, "store-node-2", 5)


def test_kill_then_start_again_recording_both_events():
    stack = _Stack()
    inj = _injector(stack)
    inj.apply(Fault(0, "kill", "store-node-2", 0.0))
    assert stack.calls == [("signal", "store-node-2", signal.SIGKILL), ("start", "store-node-2")]
    assert [e["event"] for e in inj.events] == ["kill -9 store-node-2 (pid 100)", "start store-node-2 (pid 101)"]
    assert stack.components["store-node-2"].alive()


@dataclass
class _Broker:
    node_id: int


@dataclass
class _Brokers(_Stack):
    components: dict = field(default_factory=lambda: {"broker": _Comp(300), "broker-2": _Comp(400),
                                                      "store-node-2": _Comp(100)})

    def broker_names(self):
        return ["broker", "broker-2"]

    def broker_nodes(self):
        return (_Broker(1), _Broker(2))


def test_a_killed_brokers_fencing_is_watched_and_held_for_the_check():
    reads = []

    def isrs():
        reads.append(time.time())
        in_sync = [1, 2] if len(reads) < 3 else [1]  # fenced at the third read
        return [([1, 2], in_sync), ([2], [2])]  # the partition broker-2 alone holds keeps it in sync

    stack = _Brokers()
    inj = FaultInjector(stack, time.monotonic(), lambda _m: None, isrs=isrs)
    before = int(time.time() * 1000)
    inj.apply(Fault(0, "kill", "broker-2", 0.0))
    inj.settle(5)
    assert len(reads) == 3
    assert [e["event"] for e in inj.events][-1] == "broker-2 is in no in-sync replica set"
    [(start, until)] = inj.held
    assert before - 500 <= start <= before - 500 + 1000 and int(reads[-1] * 1000) <= until
    # A store node's kill holds nothing.
    inj.apply(Fault(0, "kill", "store-node-2", 0.0))
    inj.settle(5)
    assert len(reads) == 3 and len(inj.held) == 1


def test_pause_resumes_and_redis_outage_restarts():
    stack = _Stack()
    inj = _injector(stack)
    inj.apply(Fault(0, "pause", "store-node-2", 0.0))
    inj.apply(Fault(0, "redis-outage", "redis", 0.0))
    inj.apply(Fault(0, "restart", "store-node-2", 0.0))
    assert stack.calls == [("signal", "store-node-2", signal.SIGSTOP), ("signal", "store-node-2", signal.SIGCONT),
                           ("stop", "redis"), ("start", "redis"), ("stop", "store-node-2"), ("start", "store-node-2")]


def test_a_component_that_is_down_is_skipped_and_unknown_ones_refused():
    stack = _Stack()
    stack.components["store-node-2"].up = False
    inj = _injector(stack)
    inj.apply(Fault(0, "kill", "store-node-2", 0.0))
    assert stack.calls == [] and "skip" in inj.events[0]["event"]
    with pytest.raises(KeyError):
        inj.apply(Fault(0, "kill", "store-node-9", 0.0))


def test_undo_all_resumes_what_an_interrupted_fault_left_down():
    stack = _Stack()
    inj = _injector(stack)
    stack.signal("store-node-2", signal.SIGSTOP)
    inj._undo["store-node-2"] = lambda: stack.signal("store-node-2", signal.SIGCONT)
    inj.undo_all()
    inj.undo_all()  # idempotent
    assert stack.calls[-1] == ("signal", "store-node-2", signal.SIGCONT)
    assert stack.calls.count(("signal", "store-node-2", signal.SIGCONT)) == 1


def test_mixed_protocols_give_each_worker_its_turn():
    assert [worker_protocol("all", i) for i in range(6)] == ["rest", "grpc", "client"] * 2
    assert [worker_protocol("both", i) for i in range(4)] == ["rest", "grpc"] * 2
    assert {worker_protocol("client", i) for i in range(3)} == {"client"}


def test_a_load_given_a_stop_event_ends_when_it_is_set_and_not_before():
    import asyncio
    import threading

    from loadtest.scenario import _end_when

    stop, budget = threading.Event(), [1000]
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    asyncio.run(_end_when(stop, t0 + 30, budget))
    assert budget == [0] and 0.15 < time.monotonic() - t0 < 5
    budget = [1000]
    asyncio.run(_end_when(threading.Event(), time.monotonic() + 0.1, budget))  # the deadline ends it: budget kept
    assert budget == [1000]


def test_the_check_of_two_tables_sums_their_counts_and_keeps_each_one():
    from loadtest.scenario import merged

    keys = {"ok": True, "table": "sensor_stats", "requests": 10, "labels_checked": 20, "violations": 0,
            "violations_by_kind": {}, "offending": []}
    windows = {"ok": False, "table": "sensor_windows", "requests": 4, "labels_checked": 8, "violations": 1,
               "violations_by_kind": {"value": 1}, "offending": [{"index": 3, "kind": "value"}]}
    both = merged([keys, windows])
    assert both["ok"] is False and both["table"] == "sensor_stats+sensor_windows"
    assert (both["requests"], both["labels_checked"], both["violations"]) == (14, 28, 1)
    assert both["violations_by_kind"] == {"value": 1} and both["offending"] == [{"index": 3, "kind": "value"}]
    assert both["tables"]["sensor_windows"] is windows and merged([keys]) is keys

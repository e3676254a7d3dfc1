"""The local stack without its real components: naming, ports, the state file, priorities, routers, liveness."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.local import stack as stack_mod
from tools.local.stack import Component, Stack, StackConfig


def _stack(tmp_path, monkeypatch, busy: set[int]) -> tuple[Stack, list[str]]:
    stack = Stack(StackConfig(home=tmp_path, store_ports=(7101, 7102, 7103)))
    started: list[str] = []

    def start(name, *extra):
        role, command, addresses = stack.command_for(name)
        started.append(name)
        busy.add(int(addresses["address"].rsplit(":", 1)[1]))  # it listens at once
        comp = Component(name, role, 4242, command, str(tmp_path / f"{name}.log"), addresses)
        stack.components[name] = comp
        stack.save()
        return comp

    monkeypatch.setattr(stack, "start", start)
    monkeypatch.setattr(stack_mod, "_port_open", lambda host, port: port in busy)
    monkeypatch.setattr(Component, "alive", lambda self: True)
    return stack, started


def test_the_new_node_takes_the_next_name_and_port(tmp_path, monkeypatch):
    stack, started = _stack(tmp_path, monkeypatch, busy={7101, 7102, 7103})
    assert stack.add_store_node() == "store-node-4"
    assert started == ["store-node-4"]
    assert stack.config.store_ports == (7101, 7102, 7103, 7104)
    addresses = stack.components["store-node-4"].addresses
    assert (addresses["node_id"], addresses["address"]) == ("node-4", "127.0.0.1:7104")
    assert addresses["metrics"].startswith("http://127.0.0.1:") and addresses["metrics"].endswith("/metrics")
    assert Stack.load(tmp_path).config.store_ports == (7101, 7102, 7103, 7104)  # recorded for `local status`


def test_a_busy_next_port_is_replaced_by_a_free_one(tmp_path, monkeypatch):
    stack, _ = _stack(tmp_path, monkeypatch, busy={7101, 7102, 7103, 7104})
    monkeypatch.setattr(stack_mod, "free_port", lambda host: 40123)
    assert stack.add_store_node() == "store-node-4"
    assert stack.config.store_ports[-1] == 40123


def test_loading_where_no_stack_is_recorded_says_how_to_start_one(tmp_path):
    from tools.local.stack import NoLocalStack

    with pytest.raises(NoLocalStack, match="no local stack recorded under .*freshroute local up"):
        Stack.load(tmp_path / "nothing-here")


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # reaped already by subprocess's own clean-up of dropped Popen objects


def test_the_pipeline_alone_is_started_at_the_configured_nice(tmp_path, monkeypatch):
    lowered: list[tuple[str, int]] = []
    stack = Stack(StackConfig(home=tmp_path, pipeline_nice=12), progress=lambda msg: None)
    monkeypatch.setattr(stack_mod, "lower_priority", lambda pid, nice: lowered.append((pid, nice)))
    for name in ("pipeline", "store-node-1"):
        # Stand-ins for the real commands: a process that exits at once.
        monkeypatch.setattr(stack, "command_for", lambda n: ("pipeline" if n == "pipeline" else "store-node",
                                                            ["true"], {}))
        comp = stack.start(name)
        _reap(comp.pid)
        assert (lowered[-1][0] == comp.pid) == (name == "pipeline")
    assert [nice for _, nice in lowered] == [12]
    stack.config = StackConfig(home=tmp_path, pipeline_nice=0)
    _reap(stack.start("pipeline").pid)
    assert len(lowered) == 1  # 0: the same priority as everything else


def test_routers_beyond_the_first_share_its_ports(tmp_path):
    two = Stack(StackConfig(home=tmp_path, routers=2, rest_port=8080, grpc_port=50051))
    assert two.router_names() == ["router", "router-2"]
    metrics = set()
    for name in two.router_names():
        role, command, addresses = two.command_for(name)
        assert role == "router" and {k: addresses[k] for k in ("rest", "grpc")} == {
            "rest": "http://127.0.0.1:8080", "grpc": "127.0.0.1:50051"}
        assert command[-8:-2] == ["--rest-port", "8080", "--grpc-port", "50051", "--metrics-port",
                                  command[-3]] and command[-2:] == ["--reuse-port", "true"]
        # Each process's counters on a port of its own: the shared REST port reaches one of them at random.
        assert addresses["metrics"] == f"http://127.0.0.1:{command[-3]}/metrics"
        metrics.add(addresses["metrics"])
    assert len(metrics) == 2
    one = Stack(StackConfig(home=tmp_path, routers=1))
    assert one.router_names() == ["router"]
    assert "--reuse-port" not in one.command_for("router")[1]  # alone, a busy port is an error, not shared
    # One more router (a test's) is started with ports of its own given as flags.
    assert one.command_for("router-2")[0] == "router"
    with pytest.raises(KeyError):
        one.command_for("routr")


def test_a_process_in_the_middle_of_exec_is_not_taken_for_dead(monkeypatch):
    """For a moment during exec() /proc/<pid>/cmdline is empty; start-up must not call that an exit."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        real = Path.read_bytes
        empty_reads = []

        def read_bytes(self):
            if self.name == "cmdline" and len(empty_reads) < 2:
                empty_reads.append(self)
                return b""
            return real(self)

        monkeypatch.setattr(Path, "read_bytes", read_bytes)
        assert stack_mod._pid_runs(child.pid, [sys.executable])
        assert len(empty_reads) == 2
        assert not stack_mod._pid_runs(child.pid, ["/usr/bin/something-else"])
    finally:
        child.kill()
        child.wait()
    monkeypatch.undo()
    assert not stack_mod._pid_runs(child.pid, [sys.executable])  # reaped: gone


def test_up_waits_for_the_pipeline_to_say_warm_and_reports_ready_anyway_after_its_bound(tmp_path, monkeypatch):
    import threading

    from pipeline.logs import WARM_LOG

    said: list[str] = []
    stack = Stack(StackConfig(home=tmp_path, warmup_timeout_s=1.0), progress=said.append)
    log = tmp_path / "pipeline.log"
    log.write_text("pipeline warm: an earlier run's line, before this start\n")
    since = log.stat().st_size
    stack.components["pipeline"] = Component("pipeline", "pipeline", 4242, ["python"], str(log))
    monkeypatch.setattr(Component, "alive", lambda self: True)

    # Not warm within the bound: up goes on, and says why freshness is not yet the usual.
    stack._wait_warm(since)
    assert "is not warm after 1s" in said[-1]

    # Warm: the wait ends at the line this run logged.
    said.clear()
    stack.config = StackConfig(home=tmp_path, warmup_timeout_s=30.0)
    def warm() -> None:
        with log.open("a") as f:
            f.write(f"INFO pipeline: {WARM_LOG}: …\n")

    timer = threading.Timer(0.3, warm)
    timer.start()
    stack._wait_warm(since)
    timer.join()
    assert not any("not warm" in m for m in said), said


def test_local_up_passes_the_standby_count_to_the_pipeline_and_starts_the_store_nodes_asked_for(tmp_path):
    from tools.cli import build_parser
    from tools.local.stack import config_from_args

    args = build_parser().parse_args(["local", "up", "--home", str(tmp_path), "--store-nodes", "4",
                                      "--standby-replicas", "2", "--store-port", "0"])
    stack = Stack(config_from_args(args))
    assert stack.store_node_names() == [f"store-node-{i}" for i in range(1, 5)]
    command = stack.command_for("pipeline")[1]
    assert command[command.index("--standby-replicas") + 1] == "2"


ORDERS = """
from pipeline.tables import source, sql_table

source("orders", schema="order_id STRING, customer STRING, amount DOUBLE")
sql_table(name="customer_totals", key="customer", source="orders",
          sql="SELECT customer, sum(amount) AS total FROM orders GROUP BY customer")
"""


def test_local_up_with_a_tables_file_runs_it_creates_its_topics_and_no_demo_producer(tmp_path):
    from tools.cli import build_parser
    from tools.local.stack import config_from_args

    path = tmp_path / "orders.py"
    path.write_text(ORDERS)
    args = build_parser().parse_args(["local", "up", "--home", str(tmp_path), "--tables-file", str(path),
                                      "--store-port", "0"])
    stack = Stack(config_from_args(args))
    assert stack.config.tables_file == str(path.resolve()) and not stack.config.demo
    command = stack.command_for("pipeline")[1]
    assert command[command.index("--tables-file") + 1] == str(path.resolve())
    assert [s.topic for s in stack.tables().sources.values()] == ["orders"]
    assert stack.status()["tables_file"] == str(path.resolve())
    # A copy of the demo's tables reads the demo producer's topic: the producer runs for it.
    from pipeline.settings import DEMO_TABLES_FILE

    copy = tmp_path / "mine.py"
    copy.write_text(DEMO_TABLES_FILE.read_text())
    args = build_parser().parse_args(["local", "up", "--home", str(tmp_path), "--tables-file", str(copy),
                                      "--store-port", "0"])
    assert config_from_args(args).demo


@pytest.mark.parametrize("body, says", [
    (None, "does not exist"),
    ("x = 1\n", "declares no table"),
    ("from pipeline.tables import source\nsource('a', schema='k STRING')\nboom(\n", "line 3: syntax error"),
])
def test_local_up_refuses_a_broken_tables_file_before_anything_starts_naming_file_and_line(tmp_path, capsys, body,
                                                                                          says):
    from tools import cli

    path = tmp_path / "tables.py"
    if body is not None:
        path.write_text(body)
    assert cli.main(["local", "up", "--home", str(tmp_path / "home"), "--tables-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "TABLES_FILE_ERROR" in err and str(path) in err and says in err, err
    assert not (tmp_path / "home").exists()  # nothing started, nothing written


def test_a_sentinel_stack_runs_a_replica_and_three_sentinels_and_points_every_component_at_them(tmp_path):
    config = StackConfig(home=tmp_path, redis_port=16379, redis_replica_port=16380,
                         sentinel_ports=(26381, 26382, 26383), redis_sentinel=True)
    stack = Stack(config)
    assert stack.sentinel_names() == ["redis-sentinel-1", "redis-sentinel-2", "redis-sentinel-3"]
    role, command, addresses = stack.command_for("redis-replica")
    assert role == "redis-replica" and command[-3:] == ["--replicaof", "127.0.0.1", "16379"]
    role, command, addresses = stack.command_for("redis-sentinel-2")
    assert role == "redis-sentinel" and addresses == {"address": "127.0.0.1:26382"}
    conf = (tmp_path / "sentinel" / "sentinel-26382.conf").read_text()
    assert "port 26382" in conf and "sentinel monitor freshroute 127.0.0.1 16379 2" in conf
    env = stack._env()
    assert env["FRESHROUTE_REDIS_SENTINELS"] == "127.0.0.1:26381,127.0.0.1:26382,127.0.0.1:26383"
    assert env["FRESHROUTE_REDIS_MASTER_NAME"] == "freshroute"
    assert stack.status()["redis"]["sentinels"] == env["FRESHROUTE_REDIS_SENTINELS"]
    assert "FRESHROUTE_REDIS_SENTINELS" not in Stack(StackConfig(home=tmp_path))._env()


def test_a_spread_stack_gives_each_store_node_and_the_routers_a_loopback_address_of_their_own(tmp_path):
    stack = Stack(StackConfig(home=tmp_path, spread=True, store_ports=(0, 0, 0), rest_port=0, grpc_port=0,
                              broker_port=0, redis_port=0).resolved())
    c = stack.config
    hosts = {name: host for name, (host, _) in stack.ports().items()}
    assert hosts["store-node-1"] == "127.0.0.11" and hosts["store-node-3"] == "127.0.0.13"
    assert hosts["router REST"] == hosts["router gRPC"] == "127.0.0.2" and hosts["broker"] == "127.0.0.1"
    role, command, addresses = stack.command_for("store-node-2")
    assert command[command.index("--host") + 1] == "127.0.0.12"
    assert addresses["address"] == f"127.0.0.12:{c.store_ports[1]}"
    assert stack.command_for("router")[1][stack.command_for("router")[1].index("--host") + 1] == "127.0.0.2"
    assert c.rest_url == f"http://127.0.0.2:{c.rest_port}" and c.grpc_address == f"127.0.0.2:{c.grpc_port}"


def test_a_stack_in_network_namespaces_places_each_component_in_its_own_on_the_usual_ports(tmp_path, monkeypatch):
    monkeypatch.setattr(stack_mod, "free_port", lambda host="": pytest.fail("no port is picked in a namespace"))
    stack = Stack(StackConfig(home=tmp_path, netns="frp1", store_ports=(0, 0, 0), rest_port=0, grpc_port=0,
                              broker_port=0, redis_port=0).resolved())
    c = stack.config
    assert c.places() == {"frp1-router": "10.77.0.2", "frp1-redis": "10.77.0.3", "frp1-pipeline": "10.77.0.4",
                          "frp1-store-node-1": "10.77.0.11", "frp1-store-node-2": "10.77.0.12",
                          "frp1-store-node-3": "10.77.0.13", "frp1-broker": "10.77.0.21",
                          "frp1-demo-producer": "10.77.0.5"}
    assert c.place_of("router-2") == c.place_of("router") == "frp1-router"
    assert c.store_ports == (7101, 7101, 7101) and c.bootstrap == "10.77.0.21:9092"
    assert c.redis_url == "redis://10.77.0.3:6379/0" and c.rest_url == "http://10.77.0.2:8080"
    _, command, addresses = stack.command_for("store-node-2")
    assert command[command.index("--host") + 1] == "10.77.0.12" and addresses["read_address"] == "10.77.0.12:7201"
    redis = stack.command_for("redis")[1]
    assert redis[redis.index("--protected-mode") + 1] == "no"  # only the stack's namespaces reach it
    assert stack.command_for("pipeline")[2]["metrics"] == "http://10.77.0.4:9100/metrics"


def test_sentinel_in_network_namespaces_gives_the_replica_and_each_sentinel_a_place_of_its_own(tmp_path):
    stack = Stack(StackConfig(home=tmp_path, netns="frp1", redis_sentinel=True, demo=False, store_ports=(0,),
                              rest_port=0, grpc_port=0, broker_port=0, redis_port=0).resolved())
    c = stack.config
    assert {k: v for k, v in c.places().items() if "redis" in k} == {
        "frp1-redis": "10.77.0.3", "frp1-redis-replica": "10.77.0.6", "frp1-redis-sentinel-1": "10.77.0.31",
        "frp1-redis-sentinel-2": "10.77.0.32", "frp1-redis-sentinel-3": "10.77.0.33"}
    assert c.redis_sentinels == "10.77.0.31:26379,10.77.0.32:26380,10.77.0.33:26381"
    replica = stack.command_for("redis-replica")[1]
    assert replica[replica.index("--replicaof") + 1:] == ["10.77.0.3", "6379"]
    assert replica[replica.index("--bind") + 1] == "10.77.0.6"
    assert stack.command_for("redis-sentinel-2")[2] == {"address": "10.77.0.32:26380"}


def test_a_process_entering_its_network_namespace_is_not_taken_for_dead():
    """`ip netns exec NS cmd` execs cmd: until it has, the pid still shows ip's own command line."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert stack_mod._pid_runs(child.pid, ["ip", "netns", "exec", "frp1-router", sys.executable, "-m", "x"])
        assert not stack_mod._pid_runs(child.pid, ["ip", "netns", "exec", "frp1-router", "/usr/bin/other"])
    finally:
        child.kill()
        child.wait()


def test_three_brokers_form_one_quorum_each_on_its_own_address_and_replicate_changelogs(tmp_path):
    stack = Stack(StackConfig(home=tmp_path, brokers=3, store_ports=(0, 0, 0), rest_port=0, grpc_port=0,
                              broker_port=0, redis_port=0).resolved())
    c = stack.config
    assert stack.broker_names() == ["broker", "broker-2", "broker-3"]
    assert c.bootstrap == ",".join(f"127.0.0.{20 + i}:{c.broker_port}" for i in (1, 2, 3))
    nodes = stack.broker_nodes()
    assert [n.node_id for n in nodes] == [1, 2, 3] and len({n.home for n in nodes}) == 3
    assert {name: host for name, (host, _) in stack.ports().items() if name.startswith("broker")} == {
        "broker": "127.0.0.21", "broker-2": "127.0.0.22", "broker-3": "127.0.0.23"}
    from tools.local.broker import Quorum, server_properties

    props = dict(line.split("=", 1) for line in server_properties(nodes[1], Quorum.of(c.cluster_id, nodes)).splitlines())
    assert props["node.id"] == "2" and props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == ",".join(f"{i}@127.0.0.{20 + i}:{c.broker_controller_port}"
                                                         for i in (1, 2, 3))
    assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.22:{c.broker_port}"
    assert props["offsets.topic.replication.factor"] == "3" and props["auto.create.topics.enable"] == "false"
    assert int(props["broker.session.timeout.ms"]) == 3000 > int(props["broker.heartbeat.interval.ms"]) * 4
    command = stack.command_for("pipeline")[1]
    assert command[command.index("--changelog-replication-factor") + 1] == "3"
    assert command[command.index("--changelog-min-insync-replicas") + 1] == "2"
    one = Stack(StackConfig(home=tmp_path, broker_port=0).resolved())
    assert one.broker_names() == ["broker"] and one.config.changelog_replication == (1, 1)


def test_a_store_node_listening_everywhere_must_say_what_to_dial():
    from freshroute.errors import ConfigError
    from freshroute.settings import load
    from store_node.settings import StoreNodeSettings

    with pytest.raises(ConfigError, match="advertise_host"):
        load(StoreNodeSettings, node_id="n1", host="0.0.0.0")
    assert load(StoreNodeSettings, node_id="n1", host="0.0.0.0", advertise_host="10.0.0.7").advertise_host == "10.0.0.7"


@pytest.mark.parametrize("failure", [RuntimeError("redis exited during start-up"), KeyboardInterrupt(),
                                     OSError("broker unreachable")])
def test_a_local_up_that_fails_part_way_stops_what_it_started(tmp_path, monkeypatch, failure, capsys):
    from tools.cli import build_parser
    from tools.local import stack as stack_mod

    stopped = []
    monkeypatch.setattr(stack_mod.Stack, "up", lambda self: (_ for _ in ()).throw(failure))
    monkeypatch.setattr(stack_mod.Stack, "down", lambda self: stopped.append(True))
    args = build_parser().parse_args(["local", "up", "--home", str(tmp_path), "--store-port", "0", "--rest-port", "0",
                                      "--grpc-port", "0", "--broker-port", "0", "--redis-port", "0"])
    if isinstance(failure, RuntimeError):
        assert stack_mod.dispatch(args) == 1 and "start-up failed: redis exited" in capsys.readouterr().err
    else:
        with pytest.raises(type(failure)):
            stack_mod.dispatch(args)
    assert stopped == [True]


def test_free_ports_are_below_the_ephemeral_range_distinct_and_bindable():
    import socket

    from tools.local.services import _ephemeral_low, free_port

    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(10_000 <= p < _ephemeral_low() for p in ports)  # outgoing connections never take them
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))


def _sleeper(stack: Stack, name: str, role: str, tmp_path: Path) -> Component:
    return stack._spawn(name, role, [sys.executable, "-c", "import time; time.sleep(60)"], {})


def test_a_component_that_dies_unasked_is_told_apart_from_one_stopped_or_signalled(tmp_path):
    import signal

    stack = Stack(StackConfig(home=tmp_path))
    try:
        for name in ("broker", "store-node-1", "store-node-2", "router"):
            _sleeper(stack, name, name.split("-")[0], tmp_path)
        stack.stop("router")
        stack.signal("store-node-1", signal.SIGKILL)
        os.kill(stack.components["store-node-2"].pid, signal.SIGKILL)  # from outside: a crash
        deadline = time.monotonic() + 10  # a loaded machine may take a while to deliver the kill
        while stack.components["store-node-2"].alive() and time.monotonic() < deadline:
            os.waitpid(stack.components["store-node-2"].pid, os.WNOHANG)
            time.sleep(0.01)
        assert [c.name for c in stack.died()] == ["store-node-2"]
        stack.start = lambda name: _sleeper(stack, name, "store", tmp_path)  # started again: watched again
        stack.start("store-node-1")
        assert [c.name for c in stack.died()] == ["store-node-2"]
    finally:
        stack.down()


def test_a_quorums_brokers_stop_together_so_none_waits_out_the_timeout_for_the_others(tmp_path, monkeypatch):
    stack = Stack(StackConfig(home=tmp_path, brokers=3))
    waits: list[tuple[str, ...]] = []
    real_stop = Stack.stop

    def stop(self, *names, timeout_s=15.0):
        waits.append(names)
        real_stop(self, *names, timeout_s=timeout_s)

    monkeypatch.setattr(Stack, "stop", stop)
    for name in stack.broker_names():
        _sleeper(stack, name, "broker", tmp_path)
    _sleeper(stack, "router", "router", tmp_path)
    stack.down()
    assert waits == [("router",), ("broker", "broker-2", "broker-3")]
    assert not any(c.alive() for c in stack.components.values())

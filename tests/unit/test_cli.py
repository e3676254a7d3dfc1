import pytest

from tools import cli
from freshroute.errors import ConfigError
from tools.local.stack import Component, Stack, StackConfig
from freshroute.settings import CommonSettings, load


def test_settings_errors_name_the_key():
    with pytest.raises(ConfigError) as e:
        load(CommonSettings, kafka_config="not-json-object")
    assert "kafka_config" in e.value.message


def test_settings_read_environment(monkeypatch):
    monkeypatch.setenv("FRESHROUTE_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    s = load(CommonSettings)
    assert s.kafka(**{"group.id": "g"}) == {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}


def test_every_component_has_a_subcommand():
    parser = cli.build_parser()
    for command in ("broker", "pipeline", "store-node", "router", "local", "lookup", "bench"):
        assert parser.parse_args([command] + (["t", "k"] if command == "lookup" else
                                              ["up"] if command == "local" else [])).command == command


def test_lookup_reports_unreachable_router(capsys):
    assert cli.main(["lookup", "sensor_stats", "sensor-1", "--router", "http://127.0.0.1:9"]) == 2
    assert "not reachable" in capsys.readouterr().err
    assert cli.main(["lookup", "sensor_stats", "sensor-1", "--grpc", "127.0.0.1:9"]) == 2
    assert "router at 127.0.0.1:9 is not reachable" in capsys.readouterr().err


@pytest.mark.parametrize("way", [["--router", "http://127.0.0.1:9"], ["--grpc", "127.0.0.1:9"],
                                 ["--direct", "--redis-url", "redis://127.0.0.1:9/0"]])
@pytest.mark.parametrize("args, field", [(["sensor_stats", "\udcff"], "key"),  # argv bytes that are not UTF-8
                                         (["\udcff", "k"], "table"),
                                         (["sensor_stats", "k", "--max-lag", "abc"], "max_lag"),
                                         (["sensor_stats", "k", "--min-position", "garbage"], "min_position")])
def test_lookup_arguments_are_checked_alike_on_every_way_before_anything_is_asked(capsys, way, args, field):
    import json

    assert cli.main(["lookup", *args, *way]) == 1  # not 2: nothing was found unreachable, nothing was asked
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["code"] == "INVALID_ARGUMENT" and error["field"] == field


def test_lookup_over_grpc_prints_the_rest_shape_and_errors_on_stderr(capsys):
    import asyncio
    import json
    import threading

    from router.grpc_server import PublicGrpc
    from router.settings import RouterSettings

    from .routing_support import part
    from .routing_support import windowed_cluster

    ready, done = threading.Event(), None
    port: list[int] = []

    async def serve() -> None:
        nonlocal done
        done = asyncio.Event()
        cluster = windowed_cluster(RouterSettings(grpc_port=0, hedge=False))
        front = PublicGrpc(cluster.settings, cluster.router)
        port.append(await front.start())
        ready.set()
        await done.wait()
        await front.stop(None)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    try:
        assert ready.wait(10)
        address = f"127.0.0.1:{port[0]}"
        assert cli.main(["lookup", "sensor_stats", "sensor-3", "--grpc", address]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["value"] == {"count": 3, "avg": 1.5} and out["partition"] == part("sensor-3")
        assert out["lag"] == {"offsets": 0, "ms": 0} and out["served_by"]["role"] in {"active", "standby"}
        assert cli.main(["lookup", "sensor_stats", "nope", "--grpc", address]) == 1
        assert json.loads(capsys.readouterr().err)["error"]["code"] == "KEY_NOT_FOUND"
        # A windowed table's windows, in the REST answer's shape; a key lookup of it names the windows route.
        assert cli.main(["lookup", "sensor_windows", "s3", "--grpc", address, "--from", "0", "--to", "20000"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["windows"] == [{"start": 0, "end": 10_000, "value": {"count": 3}, "final": True},
                                  {"start": 10_000, "end": 20_000, "value": {"count": 4}, "final": True}]
        assert out["watermark_ms"] == 25_000 and out["lag"] == {"offsets": 0, "ms": 0}
        assert cli.main(["lookup", "sensor_windows", "s3", "--grpc", address]) == 1
        assert json.loads(capsys.readouterr().err)["error"]["code"] == "WINDOWED_TABLE"
        with pytest.raises(SystemExit, match="--from and --to go together"):
            cli.main(["lookup", "sensor_windows", "s3", "--grpc", address, "--from", "0"])
        with pytest.raises(SystemExit, match="--last must be a duration"):
            cli.main(["lookup", "sensor_windows", "s3", "--grpc", address, "--last", "soon"])
    finally:
        loop.call_soon_threadsafe(done.set)
        thread.join(10)
        loop.close()


def test_bench_takes_its_own_options(tmp_path, capfd):
    assert cli.main(["bench", "--home", str(tmp_path), "--no-restore"]) == 2
    assert "no local stack recorded" in capfd.readouterr().err


def test_state_file_round_trip(tmp_path):
    cfg = StackConfig(home=tmp_path, store_ports=(1, 2))
    stack = Stack(cfg)
    stack.components["router"] = Component("router", "router", 999999, ["/bin/true"], "log", {"rest": "http://x"})
    stack.save()
    back = Stack.load(tmp_path)
    assert back.config == cfg
    assert back.components["router"].addresses == {"rest": "http://x"}
    assert not back.components["router"].alive()  # no such pid
    assert back.store_node_names() == ["store-node-1", "store-node-2"]


def test_resolved_config_picks_free_ports(tmp_path):
    cfg = StackConfig(home=tmp_path, broker_port=0, redis_port=0, rest_port=0, grpc_port=0, store_ports=(0, 0)).resolved()
    ports = [cfg.broker_port, cfg.redis_port, cfg.rest_port, cfg.grpc_port, *cfg.store_ports]
    assert all(p > 0 for p in ports)


def test_local_up_places_store_nodes_from_the_first_port_or_on_free_ports(tmp_path):
    from tools.local.stack import config_from_args

    parser = cli.build_parser()
    args = parser.parse_args(["local", "up", "--home", str(tmp_path), "--nodes", "4"])
    assert config_from_args(args).store_ports == (7101, 7102, 7103, 7104)
    args = parser.parse_args(["local", "up", "--home", str(tmp_path), "--store-port", "7201", "--nodes", "2"])
    assert config_from_args(args).store_ports == (7201, 7202)
    args = parser.parse_args(["local", "up", "--home", str(tmp_path), "--store-port", "0", "--rest-port", "0"])
    config = config_from_args(args)
    assert len(config.store_ports) == 3 and all(p > 0 for p in config.store_ports) and config.rest_port > 0


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path, monkeypatch, capsys):
    """`freshroute local status --json | head -1`: the closed pipe is an exit code, not a traceback."""
    sink = open(tmp_path / "out", "w")

    class ClosedPipe:
        def write(self, _: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            pass

        def fileno(self) -> int:
            return sink.fileno()

    monkeypatch.setattr("sys.stdout", ClosedPipe())
    assert cli.main(["local", "status", "--json", "--home", str(tmp_path / "home")]) == 1
    assert "Traceback" not in capsys.readouterr().err
    sink.close()


def test_a_kafka_config_file_reaches_the_kafka_config_from_a_flag_or_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "client.properties"
    path.write_text("# the cluster's listeners\nsecurity.protocol=SASL_SSL\n! a comment too\n"
                    "sasl.mechanism = SCRAM-SHA-512\nsocket.timeout.ms: 30000\n\nssl.ca.location=/etc/ca.pem\n")
    want = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "socket.timeout.ms": "30000",
            "ssl.ca.location": "/etc/ca.pem"}
    assert load(CommonSettings, kafka_config=str(path)).kafka(**{"group.id": "g"}) == {
        "bootstrap.servers": "127.0.0.1:9092", **want, "group.id": "g"}
    monkeypatch.setenv("FRESHROUTE_KAFKA_CONFIG", str(path))
    assert load(CommonSettings).kafka_config == want
    monkeypatch.setenv("FRESHROUTE_KAFKA_CONFIG", '{"linger.ms": 5}')
    assert load(CommonSettings).kafka_config == {"linger.ms": 5}


@pytest.mark.parametrize("body, says", [("security.protocol=SSL\nthis is not a property\n", r"line 2: expected name=value"),
                                        ("bootstrap.servers=10.0.0.1:9092\n", "bootstrap_servers"),
                                        (None, "cannot read")])
def test_a_bad_kafka_config_file_is_refused_naming_the_setting_file_and_line(tmp_path, body, says):
    path = tmp_path / "client.properties"
    if body is not None:
        path.write_text(body)
    with pytest.raises(ConfigError, match=f"kafka_config.*{says}") as e:
        load(CommonSettings, kafka_config=str(path))
    assert body is None or str(path) in e.value.message or "bootstrap" in e.value.message


BLOCK_SERVER = '''
import sys
SERVER = {"pyspark", "fastapi", "uvicorn", "rocksdict", "confluent_kafka", "pydantic", "pydantic_settings"}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in SERVER:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
'''


@pytest.mark.parametrize("command", [["local", "up"], ["router"], ["store-node"], ["pipeline"]])
def test_a_client_only_install_asked_for_a_server_part_names_the_install(tmp_path, command):
    """Without the server's dependencies (a child process that cannot import them): a clear error, no traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "sitecustomize.py").write_text(BLOCK_SERVER)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tools.cli", *command, *(["--home", str(tmp_path)] if
                                                                                command[0] == "local" else [])],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"`freshroute {command[0]}` needs the server install" in done.stderr
    assert "pip install 'freshroute[server]'" in done.stderr and "Traceback" not in done.stderr

"""Pipeline settings: defaults, environment, topic and checkpoint naming."""

from __future__ import annotations

from pathlib import Path

import pytest

from freshroute.errors import ConfigError
from freshroute.settings import kafka_logging, load
from pipeline.settings import DEMO_TABLES_FILE, PipelineSettings


def test_defaults(monkeypatch):
    for name in list(PipelineSettings.model_fields):
        monkeypatch.delenv(f"FRESHROUTE_{name.upper()}", raising=False)
    s = load(PipelineSettings)
    assert s.tables_file == DEMO_TABLES_FILE and DEMO_TABLES_FILE.name == "demo_tables.py"
    assert s.checkpoint_dir == Path(".freshroute/pipeline/checkpoints")
    assert (s.trigger_ms, s.changelog_partitions, s.shuffle_partitions) == (500, 8, 2)
    assert s.available_now is False and s.topic_prefix == "" and s.spark_master == "local[*]"


def test_environment_and_flags(monkeypatch):
    monkeypatch.setenv("FRESHROUTE_AVAILABLE_NOW", "true")
    monkeypatch.setenv("FRESHROUTE_TOPIC_PREFIX", "t123")
    s = load(PipelineSettings, trigger_ms="250", checkpoint_dir="/tmp/ck")
    assert s.available_now is True and s.trigger_ms == 250
    assert s.input_topic("readings") == "t123readings"
    assert s.changelog_topic("sensor_stats") == "t123sensor_stats-changelog"
    assert s.query_checkpoint("sensor_stats") == Path("/tmp/ck/sensor_stats")
    assert s.window_index("sensor_windows") == Path("/tmp/ck/sensor_windows.windows")


def test_wrong_value_fails_naming_the_key():
    with pytest.raises(ConfigError, match="changelog_partitions"):
        load(PipelineSettings, changelog_partitions="0")
    with pytest.raises(ConfigError, match="max_records_per_batch"):
        load(PipelineSettings, max_records_per_batch="lots")


def test_settings_are_frozen():
    s = load(PipelineSettings)
    with pytest.raises(Exception):
        s.trigger_ms = 1  # type: ignore[misc]


@pytest.mark.parametrize("trigger_ms", ["-1", "60001", "soon"])
def test_a_trigger_outside_its_range_fails_naming_it(trigger_ms):
    with pytest.raises(ConfigError, match="trigger_ms"):
        load(PipelineSettings, trigger_ms=trigger_ms)
    assert load(PipelineSettings, trigger_ms="60000").trigger_ms == 60_000
    assert load(PipelineSettings, trigger_ms="0").trigger_ms == 0


@pytest.mark.parametrize("trigger_ms", ["-5", "60001", "fast"])
def test_local_up_refuses_a_trigger_outside_its_range_before_starting_anything(trigger_ms, capsys):
    from tools.cli import main

    with pytest.raises(SystemExit) as e:
        main(["local", "up", "--trigger-ms", trigger_ms, "--home", "/nonexistent/never-created"])
    assert e.value.code == 2
    assert "--trigger-ms" in capsys.readouterr().err


@pytest.mark.parametrize("standbys", ["-1", "17", "two"])
def test_a_standby_count_outside_its_range_fails_naming_it(standbys):
    with pytest.raises(ConfigError, match="standby_replicas"):
        load(PipelineSettings, standby_replicas=standbys)
    assert load(PipelineSettings).standby_replicas == 1
    assert load(PipelineSettings, standby_replicas="0").standby_replicas == 0


@pytest.mark.parametrize("flags, says", [(["--store-nodes", "0"], "--store-nodes"),
                                         (["--standby-replicas", "-1"], "--standby-replicas"),
                                         (["--standby-replicas", "3"], "needs at least 4 store nodes")])
def test_local_up_refuses_standbys_it_cannot_place_before_starting_anything(flags, says, capsys, tmp_path):
    from tools.cli import main

    home = tmp_path / "never-created"
    try:
        code = main(["local", "up", *flags, "--home", str(home)])
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    assert code == 2
    assert says in capsys.readouterr().err
    assert not home.exists()


def test_changelog_replication_settings_and_the_topic_config_they_give():
    s = load(PipelineSettings)
    assert (s.changelog_replication_factor, s.changelog_min_insync_replicas) == (1, 1)
    compaction = {"cleanup.policy": "compact", "message.timestamp.type": "LogAppendTime", "segment.ms": "600000",
                  "min.cleanable.dirty.ratio": "0.5", "min.compaction.lag.ms": "600000"}
    assert s.changelog_config() == compaction
    s = load(PipelineSettings, changelog_replication_factor="3", changelog_min_insync_replicas="2",
             changelog_segment_ms="60000", changelog_min_cleanable_dirty_ratio="0.1",
             changelog_min_compaction_lag_ms="0")
    assert s.changelog_config() == {"cleanup.policy": "compact", "message.timestamp.type": "LogAppendTime",
                                    "segment.ms": "60000",
                                    "min.cleanable.dirty.ratio": "0.1", "min.compaction.lag.ms": "0",
                                    "min.insync.replicas": "2"}


def test_a_changelog_keeps_its_records_from_compaction_longer_than_a_replay_takes():
    assert load(PipelineSettings).replay_compaction_lag_ms == 600_000  # ten 1-minute intervals
    assert load(PipelineSettings, realtime_checkpoint_interval="5 minutes").replay_compaction_lag_ms == 3_000_000
    assert load(PipelineSettings, realtime_checkpoint_interval="5 seconds").replay_compaction_lag_ms == 600_000
    assert load(PipelineSettings, changelog_min_compaction_lag_ms="1000").replay_compaction_lag_ms == 1000
    with pytest.raises(ConfigError, match="changelog_min_insync_replicas 3 is above changelog_replication_factor 2"):
        load(PipelineSettings, changelog_replication_factor="2", changelog_min_insync_replicas="3")
    with pytest.raises(ConfigError, match="changelog_replication_factor"):
        load(PipelineSettings, changelog_replication_factor="0")


def test_a_replication_factor_above_the_broker_count_is_refused_naming_the_setting():
    from types import SimpleNamespace

    from pipeline.topics import check_replication

    class Admin:
        def list_topics(self, timeout):
            return SimpleNamespace(brokers={1: object(), 2: object(), 3: object()})

    assert check_replication(Admin(), 3) == 3
    with pytest.raises(ConfigError, match="changelog_replication_factor 4 is above the cluster's 3 broker") as e:
        check_replication(Admin(), 4)
    assert e.value.details == {"setting": "changelog_replication_factor", "brokers": 3}


def test_local_up_reads_its_kafka_config_file_before_starting_anything(tmp_path, capsys):
    from tools.cli import build_parser, main
    from tools.local.stack import Stack, config_from_args

    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol=SSL\nnot a property\n")
    home = tmp_path / "never-created"
    with pytest.raises(SystemExit) as e:
        main(["local", "up", "--kafka-config", str(bad), "--home", str(home)])
    assert e.value.code == 2 and "line 2: expected name=value" in capsys.readouterr().err and not home.exists()

    good = tmp_path / "good.properties"
    good.write_text("socket.timeout.ms=30000\n")
    args = build_parser().parse_args(["local", "up", "--kafka-config", str(good), "--home", str(home)])
    stack = Stack(config_from_args(args))
    assert stack._env()["FRESHROUTE_KAFKA_CONFIG"] == str(good.resolve())


def test_tools_outside_the_components_read_the_same_kafka_config(tmp_path, monkeypatch):
    from freshroute.settings import kafka_client_config

    path = tmp_path / "client.properties"
    path.write_text("socket.timeout.ms=30000\n")
    monkeypatch.setenv("FRESHROUTE_KAFKA_CONFIG", str(path))
    assert kafka_client_config("h:9092", **{"linger.ms": 5}) == {"bootstrap.servers": "h:9092",
                                                                 "socket.timeout.ms": "30000", "linger.ms": 5,
                                                                 **kafka_logging("freshroute.kafka")}
    monkeypatch.setenv("FRESHROUTE_KAFKA_CONFIG", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="FRESHROUTE_KAFKA_CONFIG: cannot read"):
        kafka_client_config("h:9092")


def test_a_spark_master_that_does_not_answer_is_refused_naming_the_setting():
    import socket

    from pipeline.session import check_spark_master

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # bound, never listening
        with pytest.raises(ConfigError, match=rf"spark_master: no Spark master answers at spark://127.0.0.1:{dead}"):
            check_spark_master(f"spark://127.0.0.1:{dead}", timeout_s=0.5)
        with socket.socket() as listening:
            listening.bind(("127.0.0.1", 0))
            listening.listen()
            check_spark_master(f"spark://127.0.0.1:{dead},127.0.0.1:{listening.getsockname()[1]}", timeout_s=0.5)
    check_spark_master("local[*]")
    with pytest.raises(ConfigError, match="not spark://HOST:PORT"):
        check_spark_master("spark://host:port")


def test_retain_previous_is_a_duration_of_an_hour_by_default():
    assert PipelineSettings().retain_previous_ms == 3_600_000
    assert PipelineSettings(retain_previous="30m").retain_previous_ms == 1_800_000
    with pytest.raises(ValueError, match="retain_previous must be a duration"):
        PipelineSettings(retain_previous="soon")

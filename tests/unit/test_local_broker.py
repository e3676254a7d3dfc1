"""The embedded broker's start checks: every way it cannot start is one line saying what to fix, before Java runs."""

from __future__ import annotations

import socket

import pytest

from tools.local import broker
from tools.local.broker import BrokerNode, BrokerSetupError, Quorum, new_cluster_id, prepare


@pytest.fixture
def jars(tmp_path):
    folder = tmp_path / "jars" / "broker"
    folder.mkdir(parents=True)
    (folder / "kafka_2.13-4.1.1.jar").write_bytes(b"")
    return tmp_path / "jars"


def node_in(tmp_path, port: int = 0) -> BrokerNode:
    from tools.local.services import free_port

    return BrokerNode(1, "127.0.0.1", port or free_port(), free_port(), tmp_path / "broker")


def formatted(node: BrokerNode, cluster_id: str, node_id: int = 1) -> None:
    node.log_dir.mkdir(parents=True)
    (node.log_dir / "meta.properties").write_text(f"version=1\ncluster.id={cluster_id}\nnode.id={node_id}\n")


def test_a_formatted_node_of_its_cluster_starts_as_kafka_with_its_config(tmp_path, jars):
    node = node_in(tmp_path)
    quorum = Quorum.of(new_cluster_id(), (node,))
    formatted(node, quorum.cluster_id)
    command = prepare(node, quorum, jars)
    assert command[-2:] == [broker.MAIN, str(node.config_file)] and command[command.index("-cp") + 1].endswith("/*")
    text = node.config_file.read_text()
    assert f"listeners=PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}" in text
    assert f"log.dirs={node.log_dir}" in text and "offsets.topic.replication.factor=1" in text


def test_storage_of_another_cluster_is_refused_naming_both_ids(tmp_path, jars):
    node = node_in(tmp_path)
    formatted(node, "someone-elses-cluster")
    with pytest.raises(BrokerSetupError, match="belongs to Kafka cluster someone-elses-cluster, not mine"):
        prepare(node, Quorum.of("mine", (node,)), jars)


def test_storage_of_another_node_is_refused(tmp_path, jars):
    node = node_in(tmp_path)
    formatted(node, "c", node_id=2)
    with pytest.raises(BrokerSetupError, match="is the storage of node 2, not node 1"):
        prepare(node, Quorum.of("c", (node,)), jars)


def test_a_directory_that_is_no_kafka_storage_is_refused(tmp_path, jars):
    node = node_in(tmp_path)
    node.log_dir.mkdir(parents=True)
    (node.log_dir / "notes.txt").write_text("mine")
    with pytest.raises(BrokerSetupError, match="holds files but no Kafka storage"):
        prepare(node, Quorum.of("c", (node,)), jars)


def test_damaged_storage_metadata_is_refused(tmp_path, jars):
    node = node_in(tmp_path)
    node.log_dir.mkdir(parents=True)
    (node.log_dir / "meta.properties").write_text("version=1\n")
    with pytest.raises(BrokerSetupError, match="names no cluster.id and node.id: the broker's data directory is damaged"):
        prepare(node, Quorum.of("c", (node,)), jars)


def test_a_taken_port_is_refused_naming_it(tmp_path, jars):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        node = node_in(tmp_path, port=taken.getsockname()[1])
        with pytest.raises(BrokerSetupError, match=f"the broker's port 127.0.0.1:{node.port} is taken"):
            prepare(node, Quorum.of("c", (node,)), jars)


def test_missing_jars_and_missing_java_say_how_to_get_them(tmp_path, monkeypatch):
    node = node_in(tmp_path)
    with pytest.raises(BrokerSetupError, match=r"Apache Kafka's jars are not in .*: resolve them with `mvn -f .*pom.xml"):
        prepare(node, Quorum.of("c", (node,)), tmp_path / "nothing")
    monkeypatch.setattr(broker.shutil, "which", lambda _name: None)
    with pytest.raises(BrokerSetupError, match="java is not installed"):
        prepare(node, Quorum.of("c", (node,)), tmp_path / "nothing")


def test_cluster_ids_are_kafkas_form_and_never_read_as_an_option():
    ids = {new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(len(i) == 22 and not i.startswith("-") for i in ids)

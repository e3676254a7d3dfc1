"""Apache Kafka as the embedded broker: KRaft mode, each node a combined broker and controller, data on disk.

The jars come from Maven through ``jvm/pom.xml`` (``./dev`` resolves them into ``.jvm/broker``). A node's
directory holds its ``server.properties`` and its log directory; storage is formatted on first start, so a
restarted node keeps every topic, record and committed offset. Everything that would make Java fail with a
stack trace (no Java, no jars, a port taken, a data directory of another cluster or of no Kafka at all) is
checked first and reported as one :class:`BrokerSetupError` line saying how to fix it.
"""

from __future__ import annotations

import base64
import errno
import os
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from freshroute import class_archive
from freshroute.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
# Where Maven put the JVM artifacts: the variable and default of the pipeline's `jars_dir` setting.
JARS = Path(os.environ.get("FRESHROUTE_JARS_DIR", REPO / ".jvm"))
LOG4J2 = Path(__file__).with_name("broker-log4j2.properties")
MAIN = "kafka.Kafka"
# The embedded broker's heap: the demo's topics are small, and the machine is shared with Spark.
HEAP = "-Xmx512m"


class BrokerSetupError(ConfigError):
    """The broker cannot start as configured; the message says what to change."""

    code = "BROKER_SETUP"


@dataclass(frozen=True)
class BrokerNode:
    """One node of a KRaft quorum: its id, client and controller listeners, and its directory."""

    node_id: int
    host: str
    port: int
    controller_port: int
    home: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def voter(self) -> str:
        return f"{self.node_id}@{self.host}:{self.controller_port}"

    @property
    def log_dir(self) -> Path:
        return self.home / "data"

    @property
    def config_file(self) -> Path:
        return self.home / "server.properties"


@dataclass(frozen=True)
class Quorum:
    """One cluster: its id (shared by every node's storage), its controller voters and its client addresses."""

    cluster_id: str
    voters: str  # "1@host:port,2@host:port", every node a voter
    bootstrap: str
    size: int

    @classmethod
    def of(cls, cluster_id: str, nodes: tuple[BrokerNode, ...]) -> "Quorum":
        return cls(cluster_id, ",".join(n.voter for n in nodes), ",".join(n.address for n in nodes), len(nodes))

    @classmethod
    def alone(cls, node: BrokerNode, cluster_id: str = "") -> "Quorum":
        """``node`` as a cluster of its own: of ``cluster_id``, else of the id its storage has, else of a new one."""
        return cls.of(cluster_id or cluster_id_of(node.home) or new_cluster_id(), (node,))


def new_cluster_id() -> str:
    """A cluster id in Kafka's form: a random UUID, URL-safe base64 without padding, never starting with "-"
    (as Kafka's own ``Uuid.randomUuid``: such an id reads as an option on a command line)."""
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()).startswith("-"):
        pass
    return cluster_id


def cluster_id_of(home: Path) -> str | None:
    """The cluster id a node's storage under ``home`` was formatted with; None if it never was."""
    meta = _meta_properties(home / "data")
    return None if meta is None else meta["cluster.id"]


def server_properties(node: BrokerNode, quorum: Quorum) -> str:
    """The node's configuration: loopback listeners, internal topics replicated as the quorum allows."""
    copies = min(3, quorum.size)
    settings = {
        "process.roles": "broker,controller",
        "node.id": node.node_id,
        "controller.quorum.voters": quorum.voters,
        "listeners": f"PLAINTEXT://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{node.host}:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": node.log_dir,
        "offsets.topic.replication.factor": copies,
        "transaction.state.log.replication.factor": copies,
        "transaction.state.log.min.isr": max(1, copies - 1),
        "share.coordinator.state.topic.replication.factor": copies,
        "share.coordinator.state.topic.min.isr": max(1, copies - 1),
        # A topic is made on purpose, with its partitions and policy, never by a client that names it.
        "auto.create.topics.enable": "false",
        "num.partitions": 4,
        "group.initial.rebalance.delay.ms": 0,
        # The cleaner looks for compactable changelog segments every few seconds rather than every 15 s.
        "log.cleaner.backoff.ms": 5000,
        "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
        "log.cleaner.threads": 1,
        # A node that stops heartbeating is fenced, and its partitions led elsewhere, after 3 s rather than 9
        # (six heartbeats missed in a row): the pipeline and the store nodes wait on its partitions until then.
        "broker.heartbeat.interval.ms": 500,
        "broker.session.timeout.ms": 3000,
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def java_binary() -> str:
    java = shutil.which("java")
    if java is None:
        raise BrokerSetupError("java is not installed: the broker is Apache Kafka and needs Java 17 or later "
                               "(`./dev up` installs openjdk-17-jre-headless)", setting="java")
    return java


def classpath(jars: Path = JARS) -> str:
    folder = jars / "broker"
    if not any(folder.glob("kafka_2.13-*.jar")):
        raise BrokerSetupError(f"Apache Kafka's jars are not in {folder}: resolve them with "
                               f"`mvn -f {REPO / 'jvm' / 'pom.xml'} package` (`./dev up` does)", setting="jars")
    return f"{folder}/*"


def archive(jars: Path = JARS) -> Path:
    """The broker's class archive (:mod:`freshroute.class_archive`) for these jars, made or not."""
    return class_archive.archive_path(jars / "class-archive", "kafka-broker",
                                      [j.name for j in (jars / "broker").glob("*.jar")])


def _meta_properties(log_dir: Path) -> dict[str, str] | None:
    """The formatted storage's identity, None when the directory was never formatted."""
    meta = log_dir / "meta.properties"
    if not meta.exists():
        return None
    try:
        lines = meta.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise BrokerSetupError(f"{meta} cannot be read ({e}): the broker's data directory is damaged; move "
                               f"{log_dir} away to start an empty broker", setting="data_dir") from None
    values = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    if "cluster.id" not in values or "node.id" not in values:
        raise BrokerSetupError(f"{meta} names no cluster.id and node.id: the broker's data directory is damaged; "
                               f"move {log_dir} away to start an empty broker", setting="data_dir")
    return values


def _check_port_free(host: str, port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                return  # the address of a network namespace of its own (a partition harness's): nothing else there
            raise BrokerSetupError(f"{what} port {host}:{port} is taken ({e.strerror}): stop what uses it or pick "
                                   "another port", setting="port") from None


def prepare(node: BrokerNode, quorum: Quorum, jars: Path = JARS, java_options: list[str] | None = None) -> list[str]:
    """Check everything a start needs, write the config, format new storage; returns the command that runs the node,
    which maps the broker's class archive unless ``java_options`` say otherwise."""
    java = java_binary()
    cp = classpath(jars)
    mapped = class_archive.mapping(archive(jars))
    _check_port_free(node.host, node.port, "the broker's")
    _check_port_free(node.host, node.controller_port, "the controller's")
    node.home.mkdir(parents=True, exist_ok=True)
    node.config_file.write_text(server_properties(node, quorum))
    meta = _meta_properties(node.log_dir)
    if meta is None:
        if node.log_dir.exists() and any(node.log_dir.iterdir()):
            raise BrokerSetupError(f"{node.log_dir} holds files but no Kafka storage (no meta.properties): not a "
                                   "broker data directory; give an empty or a broker's own directory",
                                   setting="data_dir")
        _format(java, cp, node, quorum, mapped)
    elif meta["cluster.id"] != quorum.cluster_id:
        raise BrokerSetupError(f"{node.log_dir} belongs to Kafka cluster {meta['cluster.id']}, not "
                               f"{quorum.cluster_id}: give that cluster id, or move the directory away to start "
                               "an empty broker", setting="cluster_id")
    elif meta["node.id"] != str(node.node_id):
        raise BrokerSetupError(f"{node.log_dir} is the storage of node {meta['node.id']}, not node {node.node_id}",
                               setting="node_id")
    return [java, *(mapped if java_options is None else java_options), HEAP, "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile=file:{LOG4J2}", "-cp", cp, MAIN,
            str(node.config_file)]


def _format(java: str, cp: str, node: BrokerNode, quorum: Quorum, archive_options: list[str]) -> None:
    done = subprocess.run([java, *archive_options, f"-Dlog4j2.configurationFile=file:{LOG4J2}", "-cp", cp,
                           "kafka.tools.StorageTool",
                           "format", f"--cluster-id={quorum.cluster_id}", f"--config={node.config_file}",
                           "--ignore-formatted"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()
        raise BrokerSetupError(f"formatting {node.log_dir} failed: {last[-1] if last else done.returncode}",
                               setting="data_dir")

"""The systems ``loadtest.peers`` measures: freshroute's ``./dev up`` stack, and each peer as two instances of its
application, built the first time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadtest.consumer_lag import GroupLag
    from loadtest.freshness import InputLag
    from tools.local.stack import Stack

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FAUST_VERSION = "0.15.3"
UVLOOP_VERSION = "0.23.0"
TABLE = "sensor_stats"


@dataclass
class Freshroute:
    """The ``./dev up`` stack, measured through its router."""

    stack: "Stack"
    name: str = "freshroute"

    @property
    def url(self) -> str:
        return self.stack.config.rest_url

    @property
    def grpc_get(self) -> str | None:
        """Its gRPC ``Router.Get`` (the peers serve lookups over HTTP only)."""
        return f"http://{self.stack.config.grpc_address}/freshroute.v1.Router/Get"

    @property
    def serving(self) -> list[str]:
        """Its own components: the broker, Redis and the demo producer serve the peers too and keep running."""
        return ["pipeline", *self.stack.store_node_names(), *self.stack.router_names()]

    def roots(self) -> dict[str, int]:
        from loadtest.footprint import stack_roots

        shared = {*self.stack.broker_names(), "demo-producer"}
        return {n: pid for n, pid in stack_roots(self.stack).items() if n not in shared}

    def alive(self) -> bool:
        return all(self.stack.components[n].alive() for n in self.serving)

    def kill_one(self) -> str:
        self.stack.signal("store-node-2", signal.SIGKILL)
        return "store-node-2"

    def lag(self) -> "InputLag":
        """Every table's input lag as ``/v1/tables`` says it (the pipeline computes the demo's three tables)."""
        from loadtest.freshness import InputLag

        return InputLag(self.url)


@dataclass
class Peer:
    """Two instances of a peer's app, each an HTTP door to the whole table; ``group`` is its consumer group."""

    name: str
    commands: list[list[str]]  # one per instance
    ports: list[int]
    bootstrap: str
    topic: str
    group: str
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)
    logs: Path = Path(tempfile.gettempdir())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    grpc_get: str | None = None  # the peers' applications serve lookups over HTTP only

    def roots(self) -> dict[str, int]:
        return {f"{self.name}-{i}": proc.pid for i, proc in self.procs.items()}

    def alive(self) -> bool:
        return all(proc.poll() is None for proc in self.procs.values())

    def kill_one(self) -> str:
        self.kill(1)
        return f"{self.name}-1"

    def lag(self) -> "GroupLag":
        """Its consumer group's committed offsets behind the input's end: how far it says it has processed."""
        from loadtest.consumer_lag import GroupLag

        return GroupLag(self.bootstrap, self.group, self.topic, TABLE)

    def start(self) -> None:
        for i, command in enumerate(self.commands):
            log = open(self.logs / f"{self.name}-{i}.log", "ab")
            self.procs[i] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.logs,
                                             start_new_session=True)

    def kill(self, i: int) -> None:
        os.killpg(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def kafka_streams_classpath(say) -> str:
    """The Kafka Streams app's classpath, built with Maven when missing or older than its sources."""
    project = HERE / "kafka_streams"
    jar = project / "target" / "peer-kafka-streams-0.1.0.jar"
    sources = [project / "pom.xml", *project.joinpath("src").rglob("*.java")]
    if not jar.exists() or any(s.stat().st_mtime > jar.stat().st_mtime for s in sources):
        say("building the Kafka Streams peer with Maven (loadtest/peers/kafka_streams) …")
        subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(project / "pom.xml"), "package"],
                       check=True)
    return f"{jar}:{project / 'target' / 'lib'}/*"


def faust_python(say) -> Path:
    """A Python with faust-streaming and uvloop, in a virtual environment of its own (made the first time)."""
    venv = REPO / ".freshroute" / "peers" / "faust-venv"
    python = venv / "bin" / "python"
    if (not python.exists()
            or subprocess.run([str(python), "-c", "import faust, uvloop"], capture_output=True).returncode):
        say(f"installing faust-streaming {FAUST_VERSION} and uvloop {UVLOOP_VERSION} into {venv} …")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"faust-streaming=={FAUST_VERSION}",
                        f"uvloop=={UVLOOP_VERSION}"], check=True)
    return python


def peers(bootstrap: str, topic: str, partitions: int, logs: Path, names: list[str], say) -> list[Peer]:
    """The peers among ``names``, each with a consumer group of its own that starts at the input's end."""
    from tools.local.services import free_port

    run = uuid.uuid4().hex[:8]
    out = []
    if "kafka-streams" in names:
        classpath, ports, group = kafka_streams_classpath(say), [free_port(), free_port()], f"peers-ks-{run}"
        out.append(Peer("kafka-streams", [
            ["java", "-Xmx512m", "-cp", classpath, "io.freshroute.peers.SensorStats", bootstrap, topic, group,
             str(logs / f"ks-state-{i}"), str(port)] for i, port in enumerate(ports)], ports, bootstrap, topic, group,
            logs=logs))
    if "faust" in names:
        python, ports, group = faust_python(say), [free_port(), free_port()], f"peers-faust-{run}"
        out.append(Peer("faust", [
            [str(python), str(HERE / "faust_app.py"), bootstrap, topic, str(partitions), group,
             str(logs / f"faust-data-{i}"), str(port)] for i, port in enumerate(ports)], ports, bootstrap, topic, group,
            logs=logs))
    return out

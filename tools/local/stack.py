"""The embedded local stack: broker, Redis, pipeline, store nodes, router and a demo producer.

``freshroute local up`` starts every component as its own process on loopback, shows
progress, waits until a demo key can be looked up through the router, and records each
process's pid, role and addresses in ``.freshroute/local/state.json`` under the working
directory, so that ``status``, ``down`` and tests can find, stop or kill one component.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import orjson

from freshroute.errors import ConfigError
from freshroute.metadata.tables import MAX_STANDBY_REPLICAS
from freshroute.redis_location import RedisLocation, parse_sentinels
from tools.local.broker import BrokerNode, Quorum
from tools.local.services import free_port, wait_for_port
from freshroute.proc import lower_priority

if TYPE_CHECKING:
    from tools.local.secure import StackSecrets
    from pipeline.tables import TablesDefinition

STATE_FILE = "state.json"
NETNS_EXEC = ["ip", "netns", "exec"]
NETNS_SUBNET = "10.77.0"  # the /24 of a stack in network namespaces: private, and only inside them
# What each step of `up` takes at most on an idle 2-core machine, in seconds (the pipeline's steps from its launch,
# so they overlap the others'): `up` says when one took longer, and the suite fails a stack whose step took twice as
# long. Measured: docs/benchmarks.md.
STEP_BUDGETS_S = {"broker": 10.0, "redis": 3.0, "store nodes": 10.0, "routers": 10.0,
                  "pipeline to its tables registered": 30.0, "pipeline to its first changelog records": 40.0,
                  "pipeline warm": 60.0}


class Step(NamedTuple):
    """One step of `up` and how long it took."""

    name: str
    seconds: float

    @property
    def budget_s(self) -> float:
        return STEP_BUDGETS_S[self.name]


class NoLocalStack(ConfigError):
    """No stack is recorded in the directory given."""

    code = "NO_LOCAL_STACK"


@dataclass(frozen=True)
class StackConfig:
    """Where the local stack lives and which ports it uses (0 = pick a free port)."""

    home: Path = Path(".freshroute/local")
    host: str = "127.0.0.1"
    broker_port: int = 19092
    # Apache Kafka nodes, each a broker and a KRaft controller; more than one: each on a loopback address of
    # its own (127.0.0.21, .22, …), changelogs replicated three ways.
    brokers: int = 1
    # Changelog segments close this often, so that Kafka's cleaner compacts them within a demo.
    changelog_segment_ms: int = 60_000
    broker_controller_port: int = 0
    cluster_id: str = ""
    redis_port: int = 16379
    rest_port: int = 8080
    grpc_port: int = 50051
    store_ports: tuple[int, ...] = (7101, 7102, 7103)
    namespace: str = "freshroute"
    topic_prefix: str = ""
    trigger_ms: int = 500
    pipeline_mode: str = "realtime"  # the pipeline's pipeline_mode: realtime or microbatch
    # The pipeline's spark_jit. A local stack's input is a demo's or a test's: the optimising compiler's minutes of
    # work at start (about 50 s of CPU of two cores) cost more than it saves; the bench's peak-rate figures ask
    # for "tiered". (The broker stays tiered: on the client compiler it costs 0.1 cores more at rest.)
    spark_jit: str = "client"
    # The pipeline is a batch job sharing the machine with the serving processes: it yields
    # the CPU to lookups (nice), which on a small machine are made of process wake-ups.
    pipeline_nice: int = 5
    # Router processes sharing the REST and gRPC ports (SO_REUSEPORT): one event loop and
    # its grpc threads use about one core at saturation, so on a 2-core machine two serve
    # more than one.
    routers: int = 2
    standby_replicas: int = 1
    # Every component in a network namespace of its own, ``<netns>-<place>`` (the routers share one), on an address of
    # NETNS_SUBNET, the namespaces joined by a bridge: the partition harness (loadtest.partitions) makes them and cuts
    # the links between them. "": the host's own network.
    netns: str = ""
    # Redis Sentinel: a primary (redis_port), a replica and three sentinels, and every component
    # finds the primary through them.
    # Each store node on a loopback address of its own (127.0.0.11, .12, …) and the routers on
    # 127.0.0.2: nothing may assume that it shares a host with another component.
    spread: bool = False
    # The pipeline on a Spark standalone cluster: a master and a worker started from the PySpark
    # installation (web UIs on free ports), instead of Spark inside the pipeline process.
    spark_cluster: bool = False
    spark_master_port: int = 0
    spark_master_ui_port: int = 0
    # Routers with TLS and an auth file, store nodes with TLS and the cluster secret: secrets made afresh
    # by `up` under home/secure.
    secure: bool = False
    # A librdkafka properties file every Kafka client of the stack reads ("": none).
    kafka_config: str = ""
    redis_sentinel: bool = False
    redis_replica_port: int = 0
    sentinel_ports: tuple[int, ...] = (0, 0, 0)
    # The tables the pipeline runs ("": the demo's, pipeline/demo_tables.py); `up` creates their sources' topics.
    tables_file: str = ""
    demo_rate: float = 50.0
    demo_sensors: int = 100
    demo_duration_s: float = 3600.0
    demo: bool = True
    startup_timeout_s: float = 300.0
    # How long `up` waits for the pipeline to say it is warm before it reports ready anyway.
    warmup_timeout_s: float = 90.0

    def resolved(self) -> "StackConfig":
        """Replace 0 ports by free ones, so tests can run stacks side by side; in namespaces of their own, where
        nothing else listens, by the usual ones."""
        from tools.local.broker import new_cluster_id

        def pick(port: int, usual: int, host: str = self.host) -> int:
            return port or self.port(host, usual)

        return replace(self, home=self.home.resolve(), broker_port=pick(self.broker_port, 9092),
                       broker_controller_port=pick(self.broker_controller_port, 9093),
                       cluster_id=self.cluster_id or new_cluster_id(),
                       redis_port=pick(self.redis_port, 6379), redis_replica_port=pick(self.redis_replica_port, 6380),
                       sentinel_ports=tuple(pick(p, 26379 + i) for i, p in enumerate(self.sentinel_ports)),
                       spark_master_port=pick(self.spark_master_port, 7077),
                       spark_master_ui_port=pick(self.spark_master_ui_port, 8079),
                       rest_port=pick(self.rest_port, 8080, self.router_host),
                       grpc_port=pick(self.grpc_port, 50051, self.router_host),
                       store_ports=tuple(pick(p, 7101, self.node_host(i)) for i, p in enumerate(self.store_ports, 1)))

    def port(self, host: str, usual: int) -> int:
        """A port for a component's own listener (metrics, read port): the usual one alone in a namespace."""
        return usual if self.netns else free_port(host)

    def node_host(self, i: int) -> str:
        """The address store node ``i`` (from 1) binds and advertises."""
        if self.netns:
            return f"{NETNS_SUBNET}.{10 + i}"
        return f"127.0.0.{10 + i}" if self.spread else self.host

    @property
    def router_host(self) -> str:
        if self.netns:
            return f"{NETNS_SUBNET}.2"
        return "127.0.0.2" if self.spread else self.host

    @property
    def redis_host(self) -> str:
        return f"{NETNS_SUBNET}.3" if self.netns else self.host

    @property
    def redis_replica_host(self) -> str:
        return f"{NETNS_SUBNET}.6" if self.netns else self.host

    def sentinel_host(self, i: int) -> str:
        """The address sentinel ``i`` (from 1) binds."""
        return f"{NETNS_SUBNET}.{30 + i}" if self.netns else self.host

    @property
    def pipeline_host(self) -> str:
        return f"{NETNS_SUBNET}.4" if self.netns else self.host

    def broker_host(self, i: int) -> str:
        """The address broker ``i`` (from 1) binds and advertises."""
        if self.netns:
            return f"{NETNS_SUBNET}.{20 + i}"
        return f"127.0.0.{20 + i}" if self.brokers > 1 else self.host

    def place_of(self, name: str) -> str:
        """The network namespace component ``name`` runs in (with ``netns``): its own; the routers share one."""
        return f"{self.netns}-{'router' if name.startswith('router') else name}"

    def places(self) -> dict[str, str]:
        """Every namespace of the stack (with ``netns``) and its address."""
        brokers = ["broker", *(f"broker-{i}" for i in range(2, self.brokers + 1))]
        return {self.place_of("router"): self.router_host, self.place_of("redis"): self.redis_host,
                self.place_of("pipeline"): self.pipeline_host,
                **{self.place_of(f"store-node-{i}"): self.node_host(i) for i in range(1, len(self.store_ports) + 1)},
                **{self.place_of(name): self.broker_host(i) for i, name in enumerate(brokers, 1)},
                **({self.place_of("demo-producer"): f"{NETNS_SUBNET}.5"} if self.demo else {}),
                **({self.place_of("redis-replica"): self.redis_replica_host,
                    **{self.place_of(f"redis-sentinel-{i}"): self.sentinel_host(i)
                       for i in range(1, len(self.sentinel_ports) + 1)}} if self.redis_sentinel else {})}

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.broker_host(i)}:{self.broker_port}" for i in range(1, self.brokers + 1))

    @property
    def changelog_replication(self) -> tuple[int, int]:
        """Copies of each changelog partition, and how many must hold a change before it is acknowledged."""
        return (3, 2) if self.brokers >= 3 else (1, 1)

    @property
    def redis_url(self) -> str:
        return f"redis://{self.redis_host}:{self.redis_port}/0"

    @property
    def spark_master_url(self) -> str:
        return f"spark://{self.host}:{self.spark_master_port}"

    @property
    def spark_master_ui(self) -> str:
        return f"http://{self.host}:{self.spark_master_ui_port}"

    @property
    def redis_sentinels(self) -> str:
        return ",".join(f"{self.sentinel_host(i)}:{p}" for i, p in enumerate(self.sentinel_ports, 1)) \
            if self.redis_sentinel else ""

    def redis_location(self) -> RedisLocation:
        """Where the stack's metadata store is: the primary, or whichever Redis the sentinels name now."""
        from tools.local.services import SENTINEL_MASTER_NAME

        if not self.redis_sentinel:
            return RedisLocation(self.redis_url)
        return RedisLocation(self.redis_url, parse_sentinels(self.redis_sentinels), SENTINEL_MASTER_NAME)

    @property
    def rest_url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.router_host}:{self.rest_port}"

    @property
    def grpc_address(self) -> str:
        return f"{self.router_host}:{self.grpc_port}"


@dataclass
class Component:
    """One process of the stack as recorded in the state file."""

    name: str
    role: str
    pid: int
    command: list[str]
    log: str
    addresses: dict[str, str] = field(default_factory=dict)

    def alive(self) -> bool:
        return _pid_runs(self.pid, self.command)


def _pid_runs(pid: int, command: list[str]) -> bool:
    """True if ``pid`` still runs the command we started (guards against pid reuse)."""
    # Started in a network namespace: `ip netns exec NS` execs the command itself, so the pid shows either.
    entering = command[:3] == NETNS_EXEC
    if entering:
        command = command[4:]
    for _ in range(50):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
                return False
        except OSError:
            return False
        if cmdline:
            if entering and cmdline.split(b"\0")[:3] == [w.encode() for w in NETNS_EXEC]:
                return True
            if command[0].endswith("/spark-class"):
                # A shell script that execs a JVM: the main class names the process in both.
                return command[1].encode() in cmdline.split(b"\0")
            # redis-server rewrites its title ("redis-server 127.0.0.1:port"), so compare the start.
            return cmdline.split(b"\0")[0].decode(errors="replace").startswith(command[0])
        # A process in the middle of exec() shows no command line for a moment: look again.
        time.sleep(0.002)
    return False


class Stack:
    """A running (or recorded) local stack rooted at ``config.home``."""

    def __init__(self, config: StackConfig, progress: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.components: dict[str, Component] = {}
        self._progress = progress or (lambda _msg: None)
        self._t0 = time.monotonic()
        self._let_go: set[str] = set()  # components this object stopped or signalled, so not found dead
        self.steps: list[Step] = []  # of the last `up`

    # --- state file -------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.config.home / STATE_FILE

    def save(self) -> None:
        self.config.home.mkdir(parents=True, exist_ok=True)
        doc = {"config": {**asdict(self.config), "home": str(self.config.home)},
               "components": [asdict(c) for c in self.components.values()], "steps": [list(s) for s in self.steps]}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        os.replace(tmp, self.state_path)

    @classmethod
    def load(cls, home: Path, progress: Callable[[str], None] | None = None) -> "Stack":
        """The stack recorded under ``home``; :class:`NoLocalStack` if there is none."""
        try:
            doc = orjson.loads((home / STATE_FILE).read_bytes())
        except FileNotFoundError:
            raise NoLocalStack(f"no local stack recorded under {home}: start one with `freshroute local up`",
                               home=str(home)) from None
        cfg = doc["config"]
        cfg["home"] = Path(cfg["home"])
        cfg["store_ports"] = tuple(cfg["store_ports"])
        cfg["sentinel_ports"] = tuple(cfg.get("sentinel_ports", ()))
        stack = cls(StackConfig(**cfg), progress)
        for c in doc["components"]:
            stack.components[c["name"]] = Component(**c)
        stack.steps = [Step(*step) for step in doc.get("steps", [])]
        return stack

    # --- processes --------------------------------------------------------------------
    def _say(self, msg: str) -> None:
        self._progress(f"[{time.monotonic() - self._t0:6.1f}s] {msg}")

    def _step(self, name: str, started: float) -> None:
        step = Step(name, round(time.monotonic() - started, 1))
        self.steps.append(step)
        if step.seconds > step.budget_s:
            self._say(f"  {name} took {step.seconds:.1f}s, over its {step.budget_s:.0f}s budget (a busy machine?)")

    def over_budget(self, factor: float = 1.0) -> list[Step]:
        """The steps of the last `up` that took longer than ``factor`` times their budget."""
        return [step for step in self.steps if step.seconds > factor * step.budget_s]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"FRESHROUTE_BOOTSTRAP_SERVERS": self.config.bootstrap,
                    "FRESHROUTE_REDIS_URL": self.config.redis_url,
                    "FRESHROUTE_NAMESPACE": self.config.namespace,
                    "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"})
        if self.config.spark_cluster:
            from tools.local.services import spark_daemon_options

            env["SPARK_DAEMON_JAVA_OPTS"] = spark_daemon_options()
        if self.config.kafka_config:
            env["FRESHROUTE_KAFKA_CONFIG"] = self.config.kafka_config
        location = self.config.redis_location()
        if location.by_sentinel:
            env.update({"FRESHROUTE_REDIS_SENTINELS": self.config.redis_sentinels,
                        "FRESHROUTE_REDIS_MASTER_NAME": location.master_name})
        return env

    def _spawn(self, name: str, role: str, command: list[str], addresses: dict[str, str]) -> Component:
        log_path = self._log_path(name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            # A session of its own: the stack outlives `local up`, and a signal to one
            # component never reaches the others.
            # In a namespace by `ip netns exec`, which execs the command: the pid is the component's.
            if self.config.netns:
                command = [*NETNS_EXEC, self.config.place_of(name), *command]
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self._env(), cwd=os.getcwd(), start_new_session=True)
        if role == "pipeline" and self.config.pipeline_nice:
            why_not = lower_priority(proc.pid, self.config.pipeline_nice)
            if why_not:
                self._say(f"the pipeline runs at normal priority ({why_not})")
        comp = Component(name, role, proc.pid, command, str(log_path), addresses)
        self.components[name] = comp
        self._let_go.discard(name)
        self.save()
        return comp

    def _log_path(self, name: str) -> Path:
        return self.config.home / "logs" / f"{name}.log"

    def _freshroute(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "tools.cli", *args]

    def command_for(self, name: str) -> tuple[str, list[str], dict[str, str]]:
        """Role, command line and addresses of a named component (for start and restart)."""
        c = self.config
        if name in self.broker_names():
            from tools.local.broker import prepare

            nodes = self.broker_nodes()
            node = nodes[self.broker_names().index(name)]
            return "broker", prepare(node, Quorum.of(c.cluster_id, nodes)), {"address": node.address,
                                                                             "bootstrap": c.bootstrap}
        if name == "redis":
            from tools.local.services import redis_command

            data = c.home / "redis"
            data.mkdir(parents=True, exist_ok=True)
            return "redis", redis_command(c.redis_port, data, c.redis_host, protected=not c.netns), {"url": c.redis_url}
        if name == "redis-replica":
            from tools.local.services import redis_replica_command

            data = c.home / "redis-replica"
            data.mkdir(parents=True, exist_ok=True)
            return "redis-replica", redis_replica_command(
                c.redis_replica_port, data, f"{c.redis_host}:{c.redis_port}", c.redis_replica_host,
                protected=not c.netns), {"address": f"{c.redis_replica_host}:{c.redis_replica_port}"}
        if name.startswith("redis-sentinel-"):
            from tools.local.services import redis_sentinel_command

            i = int(name.rsplit("-", 1)[1])
            host, port = c.sentinel_host(i), c.sentinel_ports[i - 1]
            return "redis-sentinel", redis_sentinel_command(port, c.home / "sentinel", f"{c.redis_host}:{c.redis_port}",
                                                            host), {"address": f"{host}:{port}"}
        if name == "spark-master":
            from tools.local.services import spark_master_command

            return "spark-master", spark_master_command(c.host, c.spark_master_port, c.spark_master_ui_port), {
                "url": c.spark_master_url, "web_ui": c.spark_master_ui}
        if name.startswith("spark-worker"):
            from tools.local.services import spark_worker_command

            ui = free_port(c.host)
            return "spark-worker", spark_worker_command(c.spark_master_url, c.host, ui, c.home / "spark" / name), {
                "master": c.spark_master_url, "web_ui": f"http://{c.host}:{ui}"}
        if name == "pipeline":
            # Metrics ports are picked afresh at each start: nothing dials them but whoever reads the state file.
            metrics = c.port(c.pipeline_host, 9100)
            cluster = ["--spark-master", c.spark_master_url] if c.spark_cluster else []
            tables = ["--tables-file", c.tables_file] if c.tables_file else []
            return "pipeline", self._freshroute(
                "pipeline", "--checkpoint-dir", str(c.home / "pipeline" / "checkpoints"),
                "--trigger-ms", str(c.trigger_ms), "--pipeline-mode", c.pipeline_mode, "--spark-jit", c.spark_jit,
                "--topic-prefix", c.topic_prefix,
                "--standby-replicas", str(c.standby_replicas), "--metrics-host", c.pipeline_host,
                "--changelog-replication-factor", str(c.changelog_replication[0]),
                "--changelog-min-insync-replicas", str(c.changelog_replication[1]),
                # Compaction that runs within a demo: segments cleaned once a tenth of their records are superseded.
                "--changelog-segment-ms", str(c.changelog_segment_ms), "--changelog-min-cleanable-dirty-ratio", "0.1",
                "--metrics-port", str(metrics), *cluster, *tables), {"metrics": f"http://{c.pipeline_host}:{metrics}/metrics"}
        if name.startswith("store-node-"):
            i = int(name.rsplit("-", 1)[1])
            port = c.store_ports[i - 1]
            node_id = f"node-{i}"
            host = c.node_host(i)
            metrics = c.port(host, 9100)
            secured: list[str] = []
            if c.secure:
                from tools.local.secure import node_certificate

                s = self._secrets()
                cert = node_certificate(s, node_id, host)
                secured = ["--tls-cert", str(cert.cert), "--tls-key", str(cert.key),
                           "--cluster-secret-file", str(s.cluster_secret_file)]
            read = c.port(host, 7201)
            return "store-node", self._freshroute(
                "store-node", "--node-id", node_id, "--host", host, "--port", str(port), "--read-port", str(read),
                "--metrics-port", str(metrics), "--data-dir", str(c.home / "data" / node_id), *secured), {
                    "node_id": node_id, "address": f"{host}:{port}", "read_address": f"{host}:{read}",
                    "metrics": f"http://{host}:{metrics}/metrics"}
        if name == "router" or name.startswith("router-"):  # one past --routers needs ports of its own, as flags
            shared = ["--reuse-port", "true"] if c.routers > 1 else []
            # Each process's own metrics: /metrics on the shared REST port reaches one process at random.
            metrics = c.port(c.router_host, 9100 + (1 if name == "router" else int(name.rsplit("-", 1)[1])))
            secured = []
            if c.secure:
                s = self._secrets()
                secured = ["--auth-file", str(s.auth_file), "--tls-cert", str(s.router_cert),
                           "--tls-key", str(s.router_key), "--cluster-ca", str(s.ca),
                           "--cluster-secret-file", str(s.cluster_secret_file)]
            return "router", self._freshroute(
                "router", "--host", c.router_host, "--rest-port", str(c.rest_port), "--grpc-port", str(c.grpc_port),
                "--metrics-port", str(metrics), *shared, *secured), {
                    "rest": c.rest_url, "grpc": c.grpc_address, "metrics": f"http://{c.router_host}:{metrics}/metrics"}
        if name == "demo-producer":
            return "demo-producer", [sys.executable, "-m", "tools.local.demo", "--bootstrap", c.bootstrap,
                                     "--topic", f"{c.topic_prefix}readings", "--rate", str(c.demo_rate),
                                     "--sensors", str(c.demo_sensors), "--duration-s", str(c.demo_duration_s)], {}
        raise KeyError(f"no component named {name!r}")

    def _secrets(self) -> "StackSecrets":
        from tools.local.secure import load_secrets

        s = load_secrets(self.config.home)
        assert s is not None, "secrets are made by up() before any component starts"
        return s

    def start(self, name: str, *extra_args: str) -> Component:
        """Start (or restart) one component by name; ``extra_args`` override its settings flags."""
        role, command, addresses = self.command_for(name)
        return self._spawn(name, role, [*command, *extra_args], addresses)

    def ports(self) -> dict[str, tuple[str, int]]:
        """Every listening component's (host, port)."""
        c = self.config
        ports = {"redis": (c.redis_host, c.redis_port)}
        if c.redis_sentinel:
            ports["redis-replica"] = (c.redis_replica_host, c.redis_replica_port)
            ports.update({n: (c.sentinel_host(i), p)
                          for i, (n, p) in enumerate(zip(self.sentinel_names(), c.sentinel_ports), 1)})
        ports.update({name: (n.host, n.port) for name, n in zip(self.broker_names(), self.broker_nodes())})
        ports.update({"router REST": (c.router_host, c.rest_port), "router gRPC": (c.router_host, c.grpc_port)})
        nodes = zip(self.store_node_names(), c.store_ports)
        ports.update({n: (c.node_host(i), p) for i, (n, p) in enumerate(nodes, 1)})
        return ports

    def broker_names(self) -> list[str]:
        """``broker``, then ``broker-2`` … : the nodes of the Kafka quorum."""
        return ["broker", *(f"broker-{i}" for i in range(2, self.config.brokers + 1))]

    def broker_nodes(self) -> tuple[BrokerNode, ...]:
        c = self.config
        return tuple(BrokerNode(i, c.broker_host(i), c.broker_port, c.broker_controller_port, c.home / "broker" / name)
                     for i, name in enumerate(self.broker_names(), 1))

    def router_names(self) -> list[str]:
        """``router``, then ``router-2`` … : processes sharing the router's ports."""
        return ["router", *(f"router-{i}" for i in range(2, self.config.routers + 1))]

    def sentinel_names(self) -> list[str]:
        return [f"redis-sentinel-{i}" for i in range(1, len(self.config.sentinel_ports) + 1)]

    def store_node_names(self) -> list[str]:
        return [f"store-node-{i}" for i in range(1, len(self.config.store_ports) + 1)]

    def add_store_node(self, port: int = 0, timeout_s: float = 60.0) -> str:
        """Start one more store node (scale out) and return its component name once it listens.

        It takes the next name (``store-node-{N+1}``) and, with ``port`` 0, the port after the
        highest one in use if that is free, else any free port. The assignor gives it its share
        of replicas; they restore before it takes actives over.
        """
        c = self.config
        host = c.node_host(len(c.store_ports) + 1)
        if not port:
            after = max(c.store_ports, default=7100) + 1
            port = after if after < 65536 and not _port_open(host, after) else free_port(host)
        self.config = replace(c, store_ports=(*c.store_ports, port))
        name = self.store_node_names()[-1]
        comp = self.start(name)
        self._wait_own(comp, lambda: _port_open(host, port), timeout_s, f"was not listening after {timeout_s:.0f}s",
                       interval_s=0.1)
        self._say(f"{name} ({comp.addresses['node_id']}) on {comp.addresses['address']}  pid {comp.pid}")
        return name

    def _check_tables(self, tables_file: str) -> None:
        """Spark builds every table of the file over an empty input (:mod:`pipeline.analysis`) before anything starts:
        a missing column or broken SQL is refused in seconds, naming the file and the table."""
        from pipeline.tables import TablesFileError

        started = time.monotonic()
        self._say(f"checking the tables of {tables_file} with Spark …")
        done = subprocess.run([sys.executable, "-m", "pipeline.analysis", tables_file], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            refused = [line for line in done.stderr.splitlines() if line.startswith("freshroute: ")]
            message = refused[-1].split(": ", 2)[-1] if refused else (done.stderr.strip().splitlines() or ["?"])[-1]
            raise TablesFileError(message, path=tables_file)
        self._say(f"  every table builds ({time.monotonic() - started:.1f}s)")

    def up(self) -> "Stack":
        """Start every component in dependency order and wait until lookups work."""
        from tools.local.demo import ensure_topic
        from tools.local.services import wait_for_port as wait

        c = self.config
        # In namespaces of its own nothing else listens (what answers there is the partition harness's proxies).
        busy = [] if c.netns else [f"{name} {host}:{port}" for name, (host, port) in self.ports().items()
                                   if _port_open(host, port)]
        if busy:
            raise ConfigError(f"already in use: {', '.join(busy)} (pick other ports with flags: --rest-port, "
                              f"--grpc-port, --broker-port, --redis-port, --store-port)", setting="ports")
        if c.tables_file:
            self._check_tables(c.tables_file)
        # Every `up` is a fresh demo: the broker's topics, the pipeline's checkpoints and the replica stores
        # go together (a restarted component keeps its own with `local start`).
        for stale in (c.home / "broker", c.home / "pipeline", c.home / "data", c.home / "secure"):
            shutil.rmtree(stale, ignore_errors=True)
        if c.secure:
            from tools.local.secure import make_secrets

            make_secrets(c.home, (c.router_host,))
            self._say(f"secure: a throwaway CA, certificates, a cluster secret and tokens in {c.home / 'secure'}")
        self.save()
        self.steps = []
        started = time.monotonic()
        for name in self.broker_names():
            comp = self.start(name)
        self._wait_alive(comp, lambda: _brokers_up(c.bootstrap, c.brokers), 90)
        self._step("broker", started)
        self._say(f"Apache Kafka (KRaft, {c.brokers} node{'s' if c.brokers > 1 else ''}) on {c.bootstrap}  "
                  f"pid {', '.join(str(self.components[n].pid) for n in self.broker_names())}")
        started = time.monotonic()
        comp = self.start("redis")
        wait(c.redis_host, c.redis_port, 15, None)
        self._step("redis", started)
        self._say(f"redis on {c.redis_url}  pid {comp.pid}")
        if c.redis_sentinel:
            self._start_sentinels()
        if c.spark_cluster:
            comp = self.start("spark-master")
            self._wait_alive(comp, lambda: _http_get(f"{c.spark_master_ui}/json") is not None, 60)
            self._say(f"spark master on {c.spark_master_url} (web UI {c.spark_master_ui})  pid {comp.pid}")
            self.add_spark_worker()
        tables = self.tables()
        for topic in sorted({src.topic for src in tables.sources.values()}):
            ensure_topic(c.bootstrap, f"{c.topic_prefix}{topic}", replication_factor=c.changelog_replication[0])
        if c.demo:
            comp = self.start("demo-producer")
            self._say(f"demo producer → topic {c.topic_prefix}readings at {c.demo_rate:g} readings/s  pid {comp.pid}")
        pipeline_log = self._log_path("pipeline")
        pipeline_since = pipeline_log.stat().st_size if pipeline_log.exists() else 0
        comp = self.start("pipeline")
        pipeline_started = time.monotonic()
        self._say(f"pipeline (PySpark) starting at nice {c.pipeline_nice}  pid {comp.pid}")
        started = time.monotonic()
        for name in self.store_node_names():
            comp = self.start(name)
        for name in self.store_node_names():
            comp = self.components[name]
            host, port = comp.addresses["address"].rsplit(":", 1)
            self._wait_alive(comp, lambda: _port_open(host, int(port)), 60)
            self._say(f"{name} ({comp.addresses['node_id']}) on {comp.addresses['address']}  pid {comp.pid}")
        self._step("store nodes", started)
        started = time.monotonic()
        for name in self.router_names():
            log = self._log_path(name)
            since = log.stat().st_size if log.exists() else 0
            comp = self.start(name)
            # The ports answer once any router listens: each one is also waited for by its
            # own start-up line (logged once both its ports are bound).
            self._wait_alive(comp, lambda: self.http_ok("/healthz") and _logged(comp, "router serving", since), 60)
            self._say(f"{name} REST {c.rest_url}  gRPC {c.grpc_address}  pid {comp.pid}")
        self._step("routers", started)
        tick = lambda waited: self._say(f"  … still waiting ({waited:.0f}s): Spark takes 10–60 s to start")  # noqa: E731
        if c.tables_file:
            names = sorted(tables.tables)
            self._say(f"waiting for the pipeline to register {', '.join(names)} from {c.tables_file} …")
            # Registered is ready: the pipeline warms up on the input it is given, which may not exist yet.
            self._wait_alive(self.components["pipeline"], lambda: self._served_tables() >= set(names),
                             c.startup_timeout_s, tick=tick)
            self._step("pipeline to its tables registered", pipeline_started)
            topics = sorted(f"{c.topic_prefix}{src.topic}" for src in tables.sources.values())
            self._say(f"{', '.join(names)} registered: produce to {', '.join(topics)} and look your keys up")
        elif c.demo:
            self._say("waiting for the first changelog records to reach the store nodes …")
            self._wait_alive(self.components["pipeline"],
                             lambda: self.http_ok("/v1/tables/sensor_stats/keys/sensor-1"), c.startup_timeout_s, tick=tick)
            self._step("pipeline to its first changelog records", pipeline_started)
            started = time.monotonic()
            if self._wait_warm(pipeline_since):
                self._step("pipeline warm", started)
            self._say(f"demo data is served: lookups are ready ({time.monotonic() - self._t0:.1f}s)")
        self.save()
        return self

    def tables(self) -> "TablesDefinition":
        """What the pipeline runs: the tables file's declarations (the demo's without one)."""
        from pipeline.settings import DEMO_TABLES_FILE
        from pipeline.tables_file import load_tables

        return load_tables(self.config.tables_file or DEMO_TABLES_FILE)

    def _served_tables(self) -> set[str]:
        """The tables the router lists (none while it cannot say)."""
        body = self.http_get("/v1/tables")
        return {t["name"] for t in orjson.loads(body)["tables"]} if body else set()

    def http_get(self, path: str) -> bytes | None:
        """The router's answer to ``path`` when it is a 200, else None — as the admin over TLS, on a secure stack."""
        c = self.config
        if not c.secure:
            return _http_get(f"{c.rest_url}{path}")
        import ssl

        from tools.local.secure import ADMIN, load_secrets

        s = load_secrets(c.home)
        return _http_get(f"{c.rest_url}{path}", {"Authorization": f"Bearer {s.tokens[ADMIN]}"},
                         ssl.create_default_context(cafile=str(s.ca))) if s is not None else None

    def http_ok(self, path: str) -> bool:
        """Whether the router answers ``path`` with 200."""
        return self.http_get(path) is not None

    def _secure_status(self) -> dict[str, Any]:
        if not self.config.secure:
            return {}
        from tools.local.secure import load_secrets

        s = load_secrets(self.config.home)
        return {"secure": s.to_dict()} if s is not None else {}

    def spark_workers(self) -> list[str]:
        return [n for n in self.components if n == "spark-worker" or n.startswith("spark-worker-")]

    def add_spark_worker(self, timeout_s: float = 60.0) -> str:
        """Start one more Spark worker (``spark-worker``, then ``spark-worker-2`` …); returns its name once the
        master counts it alive."""
        import json

        c = self.config
        before = len(self.spark_workers())
        name = "spark-worker" if before == 0 else f"spark-worker-{before + 1}"
        comp = self.start(name)

        def registered() -> bool:
            try:
                with urllib.request.urlopen(f"{c.spark_master_ui}/json", timeout=2) as r:
                    doc = json.load(r)
            except (urllib.error.URLError, OSError, ValueError):
                return False
            return any(w.get("state") == "ALIVE" and w.get("webuiaddress") == comp.addresses["web_ui"]
                       for w in doc.get("workers", []))

        self._wait_own(comp, registered, timeout_s, f"did not register with {c.spark_master_url} in {timeout_s:.0f}s")
        self._say(f"{name} registered with {c.spark_master_url} (web UI {comp.addresses['web_ui']})  pid {comp.pid}")
        return name

    def _start_sentinels(self) -> None:
        """A replica of the primary and three sentinels; ready once they could fail over."""
        import redis

        c = self.config
        comp = self.start("redis-replica")
        self._wait_alive(comp, lambda: _port_open(c.redis_replica_host, c.redis_replica_port), 15)
        for name in self.sentinel_names():
            self.start(name)
        for name in self.sentinel_names():
            comp = self.components[name]
            host, port = comp.addresses["address"].rsplit(":", 1)
            self._wait_alive(comp, lambda: _port_open(host, int(port)), 15)
        primary = redis.Redis(host=c.redis_host, port=c.redis_port, socket_timeout=1)
        location = c.redis_location()

        def can_fail_over() -> bool:
            # The replica is in sync and every sentinel knows the replica and the other sentinels.
            try:
                if primary.info("replication").get("connected_slaves", 0) < 1:
                    return False
                for host, port in location.sentinels:
                    master = redis.Redis(host=host, port=port, socket_timeout=1).sentinel_master(location.master_name)
                    if int(master.get("num-slaves", 0)) < 1 or int(master.get("num-other-sentinels", 0)) < 2:
                        return False
                return True
            except redis.RedisError:
                return False

        self._wait_alive(self.components["redis"], can_fail_over, 30)
        self._say(f"redis replica on {c.redis_replica_host}:{c.redis_replica_port}, sentinels on {c.redis_sentinels} "
                  f"(master {location.master_name!r})")

    def _wait_warm(self, since: int) -> bool:
        """Until the pipeline's batches take their steady time: freshness right after `up` is then the usual. Whether
        it got there in ``warmup_timeout_s``."""
        from pipeline.logs import WARM_LOG

        pipeline = self.components["pipeline"]
        self._say("waiting for the pipeline to warm up (its Real-time tasks to run, its micro-batches to take their "
                  "steady time) …")
        try:
            self._wait_alive(pipeline, lambda: _logged(pipeline, WARM_LOG, since), self.config.warmup_timeout_s,
                             tick=lambda waited: self._say(f"  … still warming up ({waited:.0f}s)"))
            return True
        except TimeoutError:
            self._say(f"  the pipeline is not warm after {self.config.warmup_timeout_s:.0f}s (a busy machine, or a "
                      f"long trigger): lookups work, and freshness improves over the next minutes")
            return False

    @staticmethod
    def _wait_own(comp: Component, ready: Callable[[], bool], timeout_s: float, not_ready: str,
                  interval_s: float = 0.2) -> None:
        """Until ``ready()``, watching only ``comp``: others may be down on purpose (a failover drill)."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if not comp.alive():
                raise RuntimeError(f"{comp.name} exited during start-up; see {comp.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{comp.name} {not_ready}; see {comp.log}")
            time.sleep(interval_s)

    def _wait_alive(self, comp: Component, ready: Callable[[], bool], timeout_s: float,
                    tick: Callable[[float], None] | None = None) -> None:
        start = time.monotonic()
        last_tick = start
        while time.monotonic() - start < timeout_s:
            if ready():
                return
            for other in self.components.values():
                if not other.alive() and other.role != "demo-producer":
                    raise RuntimeError(f"{other.name} exited during start-up; see {other.log}")
            if tick and time.monotonic() - last_tick > 10:
                last_tick = time.monotonic()
                tick(last_tick - start)
            time.sleep(0.2)
        raise TimeoutError(f"{comp.name} was not ready after {timeout_s:.0f}s; see {comp.log}")

    def signal(self, name: str, sig: int) -> None:
        """Send a signal to one component we started and the processes it started (kill -9, SIGSTOP, SIGCONT …):
        each runs in a session of its own, so its process group is the component (a pipeline's JVM included)."""
        comp = self.components[name]
        if comp.alive():
            if sig != signal.SIGCONT:
                self._let_go.add(name)
            try:
                os.killpg(comp.pid, sig)
            except ProcessLookupError:  # not a group leader (recorded by an older version): the process alone
                os.kill(comp.pid, sig)

    def discard(self) -> None:
        """End a throwaway stack at once: kill -9 every component (its process group) and reap it.

        A stack thrown away with its directory (a test's, the partition harness's) gains nothing by :meth:`down`'s
        orderly stop — the routers first, store nodes draining and handing their actives over, Spark and the brokers
        shutting down cleanly — which takes 5–20 s; ``local down`` keeps that order for the stacks people use.
        """
        for name in self.components:
            self.signal(name, signal.SIGKILL)
        for comp in self.components.values():
            try:
                os.waitpid(comp.pid, 0)
            except ChildProcessError:  # not ours to reap (started by another Stack object) or reaped already
                for _ in range(200):  # 10 s at most: SIGKILL has nothing to wait for
                    if not comp.alive():
                        break
                    time.sleep(0.05)

    def stop(self, *names: str, timeout_s: float = 15.0) -> None:
        """Stop components together: SIGTERM to each, then SIGKILL to any still running after ``timeout_s``."""
        comps = [self.components[n] for n in names if self.components[n].alive()]
        self._let_go.update(names)
        for comp in comps:
            os.kill(comp.pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
            os.kill(comp.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while any(c.alive() for c in comps) and time.monotonic() < deadline:
            time.sleep(0.1)
        for comp in comps:
            if comp.alive():
                os.kill(comp.pid, signal.SIGKILL)
            _reap(comp.pid)

    def down(self) -> None:
        """Stop every component, newest first (the router before the nodes before Kafka); a quorum's brokers
        together, since one stopping alone waits for a controller majority the others' stopping removes."""
        brokers = [n for n in self.broker_names() if n in self.components]
        for name in reversed(list(self.components)):
            if name not in brokers:
                self.stop(name)
                self._say(f"stopped {name}")
        if brokers:
            self.stop(*brokers)
            self._say(f"stopped {', '.join(brokers)}")
        self.save()

    def died(self) -> list[Component]:
        """Components that stopped running without this object stopping or signalling them."""
        return [c for n, c in self.components.items() if n not in self._let_go and not c.alive()]

    def status(self) -> dict[str, Any]:
        c = self.config
        return {
            "home": str(c.home),
            "broker": {"bootstrap": c.bootstrap},
            "redis": {"url": c.redis_url, **({"sentinels": c.redis_sentinels,
                                              "master_name": c.redis_location().master_name}
                                             if c.redis_sentinel else {})},
            "router": {"rest": c.rest_url, "grpc": c.grpc_address, **self._secure_status()},
            "tables_file": c.tables_file or None,
            "components": [{"name": x.name, "role": x.role, "pid": x.pid, "alive": x.alive(), "log": x.log,
                            **x.addresses} for x in self.components.values()],
        }


def _logged(comp: Component, text: str, since: int) -> bool:
    """Whether the component's log holds ``text`` past byte ``since`` (logs are appended to across runs)."""
    try:
        with open(comp.log, "rb") as f:
            f.seek(since)
            return text.encode() in f.read()
    except OSError:
        return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _brokers_up(bootstrap: str, brokers: int) -> bool:
    from tools.local.services import wait_for_broker

    try:
        wait_for_broker(bootstrap, 1.0, brokers=brokers)
        return True
    except (TimeoutError, RuntimeError):
        return False


def _port_open(host: str, port: int) -> bool:
    try:
        wait_for_port(host, port, 0.01)
        return True
    except TimeoutError:
        return False


def _http_get(url: str, headers: dict[str, str] | None = None, context: Any = None) -> bytes | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=1,
                                    context=context) as r:
            return r.read() if r.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


# --- CLI -------------------------------------------------------------------------------
def config_from_args(args: argparse.Namespace) -> StackConfig:
    """The stack ``local up`` starts: the flags' ports, with 0 replaced by free ones."""
    if args.standby_replicas >= args.store_nodes:
        raise ConfigError(f"--standby-replicas {args.standby_replicas} needs at least {args.standby_replicas + 1} "
                          f"store nodes (an active and each standby on a node of its own): give --store-nodes "
                          f"{args.standby_replicas + 1} or more", setting="standby_replicas")
    store_ports = tuple(args.store_port + i if args.store_port else 0 for i in range(args.store_nodes))
    tables_file, demo = "", not args.no_demo
    if args.tables_file:
        from pipeline.tables_file import load_tables

        # Refused before anything starts, naming the file and line; the demo producer writes the demo's input, so
        # it runs only for a file that reads that topic (an edited copy of the demo's tables).
        definition = load_tables(args.tables_file)
        tables_file = str(Path(args.tables_file).resolve())
        demo = demo and any(src.topic == "readings" for src in definition.sources.values())
    return StackConfig(home=Path(args.home), rest_port=args.rest_port, grpc_port=args.grpc_port,
                       broker_port=args.broker_port, brokers=args.brokers, redis_port=args.redis_port,
                       store_ports=store_ports,
                       trigger_ms=args.trigger_ms, pipeline_mode=args.pipeline_mode, spark_jit=args.spark_jit,
                       pipeline_nice=args.pipeline_nice,
                       routers=args.routers,
                       standby_replicas=args.standby_replicas, redis_sentinel=args.redis_sentinel,
                       kafka_config=str(Path(args.kafka_config).resolve()) if args.kafka_config else "",
                       spread=args.spread, spark_cluster=args.spark_cluster, secure=args.secure,
                       tables_file=tables_file, demo_rate=args.demo_rate, demo=demo).resolved()


def _count(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``lo..hi``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{n} is outside {lo}..{hi}")
        return n
    return parse


def _kafka_config(text: str) -> str:
    """``--kafka-config``: read and checked before anything starts."""
    from freshroute.settings import read_kafka_properties

    try:
        read_kafka_properties(Path(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _trigger_ms(text: str) -> int:
    """``--trigger-ms``: the pipeline's own bounds, checked before anything starts."""
    from pipeline.settings import MAX_TRIGGER_MS

    try:
        ms = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of milliseconds") from None
    if not 0 <= ms <= MAX_TRIGGER_MS:
        raise argparse.ArgumentTypeError(f"{ms} is outside 0..{MAX_TRIGGER_MS} ms (0: batches back to back)")
    return ms


def add_arguments(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="Start the whole stack with demo data (or your tables) and wait until lookups work.")
    up.add_argument("--home", default=".freshroute/local")
    up.add_argument("--rest-port", type=int, default=8080, help="0 picks a free port (so do the other ports)")
    up.add_argument("--grpc-port", type=int, default=50051)
    up.add_argument("--broker-port", type=int, default=19092)
    up.add_argument("--brokers", type=_count(1, 9), default=StackConfig.brokers, metavar="N",
                    help="Kafka nodes (KRaft quorum); 3 or more replicate changelogs three ways, each node on a "
                         "loopback address of its own (127.0.0.21, …)")
    up.add_argument("--redis-port", type=int, default=16379)
    up.add_argument("--store-port", type=int, default=7101,
                    help="the first store node's gRPC port; the next nodes take the ports after it")
    up.add_argument("--store-nodes", "--nodes", dest="store_nodes", type=_count(1, 64), default=3, metavar="M",
                    help="store node processes (1-64)")
    up.add_argument("--standby-replicas", type=_count(0, MAX_STANDBY_REPLICAS),
                    default=StackConfig.standby_replicas, metavar="N",
                    help="standbys of each partition besides its active; needs at least N+1 store nodes")
    up.add_argument("--routers", type=int, default=StackConfig.routers, choices=range(1, 9), metavar="1-8",
                    help="router processes sharing the REST and gRPC ports")
    up.add_argument("--trigger-ms", type=_trigger_ms, default=StackConfig.trigger_ms,
                    help="the pipeline's micro-batch interval: lower is fresher and costs more CPU")
    up.add_argument("--pipeline-mode", choices=("realtime", "microbatch"), default=StackConfig.pipeline_mode,
                    help="how the pipeline runs tables that do not say: Spark's Real-time Mode, or micro-batches")
    up.add_argument("--spark-jit", choices=("client", "tiered", "auto"), default=StackConfig.spark_jit,
                    help="the pipeline's JIT: client starts in about half the time; tiered costs less a row at "
                         "high rates, after minutes of compiling")
    up.add_argument("--pipeline-nice", type=int, default=StackConfig.pipeline_nice, choices=range(0, 20),
                    metavar="0-19", help="the pipeline's CPU priority: it yields to lookups (0: the same priority)")
    up.add_argument("--kafka-config", type=_kafka_config, metavar="FILE",
                    help="librdkafka properties file (name=value lines) for every Kafka client of the stack")
    up.add_argument("--secure", action="store_true",
                    help="routers with TLS and tokens: a throwaway CA, certificates and two tokens (a reader of "
                         "sensor_stats, an admin) under the stack's home, shown by `local status --json`")
    up.add_argument("--spark-cluster", action="store_true",
                    help="run the pipeline on a Spark standalone cluster: a master and a worker on loopback")
    up.add_argument("--spread", action="store_true",
                    help="each store node on a loopback address of its own (127.0.0.11, …), the routers on 127.0.0.2")
    up.add_argument("--redis-sentinel", action="store_true",
                    help="run Redis as a primary, a replica and three sentinels; components follow failovers")
    up.add_argument("--tables-file", metavar="FILE",
                    help="your tables instead of the demo's (see docs/tables.md): `up` creates their sources' "
                         "topics and waits until the pipeline has registered every table")
    up.add_argument("--demo-rate", type=float, default=50.0)
    up.add_argument("--no-demo", action="store_true",
                    help="no demo producer (with --tables-file it runs only if the file reads the `readings` topic)")
    up.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops the stack")
    st = sub.add_parser("status", help="List every component with pid, role and addresses.")
    st.add_argument("--home", default=".freshroute/local")
    st.add_argument("--json", action="store_true")
    dn = sub.add_parser("down", help="Stop every component of the stack.")
    dn.add_argument("--home", default=".freshroute/local")
    add = sub.add_parser("add-node", help="Start one more store node (scale out); prints its name.")
    add.add_argument("--home", default=".freshroute/local")
    add.add_argument("--port", type=int, default=0, help="gRPC port (default: the next one after the highest)")
    again = sub.add_parser("start", help="Start a stopped or killed component again with its recorded settings.")
    again.add_argument("name", help="component name, as `local status` lists it (e.g. broker, store-node-2)")
    again.add_argument("--home", default=".freshroute/local")
    rm = sub.add_parser("stop", help="Stop one component with SIGTERM (a store node drains first).")
    rm.add_argument("name", help="component name, as `local status` lists it (e.g. store-node-4)")
    rm.add_argument("--home", default=".freshroute/local")


def dispatch(args: argparse.Namespace) -> int:
    home = Path(args.home)
    say = lambda m: print(m, flush=True)  # noqa: E731
    if args.local_command == "up":
        if (home / STATE_FILE).exists() and any(c.alive() for c in Stack.load(home).components.values()):
            print(f"a local stack is already running from {home}; `freshroute local down` first", file=sys.stderr)
            return 1
        config = config_from_args(args)
        if config.kafka_config:
            os.environ["FRESHROUTE_KAFKA_CONFIG"] = config.kafka_config  # for up's own clients (topic creation)
        stack = Stack(config, say)
        try:
            stack.up()
        except (RuntimeError, TimeoutError) as e:
            print(f"start-up failed: {e}", file=sys.stderr)
            stack.down()
            return 1
        except BaseException:  # anything else part-way (Ctrl-C, a broker error): stop what was started
            stack.down()
            raise
        _print_examples(config)
        if args.foreground:
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                stack.down()
        return 0
    try:
        stack = Stack.load(home, say)
    except NoLocalStack as e:
        print(e.message, file=sys.stderr)
        return 1
    if args.local_command == "status":
        st = stack.status()
        if args.json:
            print(orjson.dumps(st, option=orjson.OPT_INDENT_2).decode())
        else:
            for comp in st["components"]:
                extra = " ".join(f"{k}={v}" for k, v in comp.items() if k not in {"name", "role", "pid", "alive", "log"})
                print(f"{comp['name']:<16} {'up' if comp['alive'] else 'DOWN':<5} pid {comp['pid']:<8} {extra}")
        return 0
    if args.local_command == "down":
        stack.down()
        return 0
    if args.local_command == "add-node":
        try:
            print(stack.add_store_node(args.port))
        except (RuntimeError, TimeoutError) as e:
            print(f"the new store node did not start: {e}", file=sys.stderr)
            return 1
        return 0
    if args.local_command == "start":
        if args.name not in stack.components:
            print(f"no component named {args.name!r}; `freshroute local status` lists them", file=sys.stderr)
            return 1
        if stack.components[args.name].alive():
            print(f"{args.name} is running already (pid {stack.components[args.name].pid})", file=sys.stderr)
            return 1
        comp = stack.start(args.name)
        say(f"started {args.name}  pid {comp.pid}")
        return 0
    if args.local_command == "stop":
        if args.name not in stack.components:
            print(f"no component named {args.name!r}; `freshroute local status` lists them", file=sys.stderr)
            return 1
        stack.stop(args.name)
        stack.save()
        say(f"stopped {args.name}")
        return 0
    return 2


def _print_examples(c: StackConfig) -> None:
    if c.secure:
        from tools.local.secure import ADMIN, READER, load_secrets

        s = load_secrets(c.home)
        assert s is not None
        tls = f"--cacert {s.ca}"
        namespace = f" --namespace {c.namespace}" if c.namespace != "freshroute" else ""
        print(f"""
freshroute is up, with TLS and tokens (secrets in {s.dir}). Try:

  READER={s.tokens[READER]}   # may read sensor_stats
  ADMIN={s.tokens[ADMIN]}    # may read every table and see the cluster
  curl -s {tls} -H "Authorization: Bearer $READER" {c.rest_url}/v1/tables/sensor_stats/keys/sensor-1
  curl -s {tls} -H "Authorization: Bearer $READER" {c.rest_url}/v1/tables/area_counts/keys/cabin   # 403
  curl -s {tls} -H "Authorization: Bearer $ADMIN" {c.rest_url}/v1/cluster
  .venv/bin/freshroute lookup sensor_stats sensor-1 --router {c.rest_url} --ca {s.ca} --token="$READER"
  .venv/bin/freshroute lookup sensor_stats sensor-1 --grpc {c.grpc_address} --ca {s.ca} --token="$READER"
  .venv/bin/freshroute lookup sensor_stats sensor-1 --direct --redis-url {c.redis_url}{namespace} --ca {s.ca} --cluster-secret-file {s.cluster_secret_file}

  Console: {c.rest_url}/console   (it asks for a token: $ADMIN's sees the cluster; the browser will warn that
           the stack's throwaway CA is not one it trusts, {s.ca})
  .venv/bin/freshroute local status --json      .venv/bin/freshroute local down
""", flush=True)
        return
    if c.tables_file:
        print(f"""
freshroute is up with the tables of {c.tables_file}. Produce JSON values to their sources' topics
(bootstrap {c.bootstrap}), then:

  curl -s {c.rest_url}/v1/tables
  curl -s {c.rest_url}/v1/tables/TABLE/keys/KEY
  .venv/bin/freshroute lookup TABLE KEY

  Console: {c.rest_url}/console      OpenAPI docs: {c.rest_url}/docs
  .venv/bin/freshroute local status      .venv/bin/freshroute local down
""", flush=True)
        return
    print(f"""
freshroute is up. Try:

  curl -s {c.rest_url}/v1/tables
  curl -s {c.rest_url}/v1/tables/sensor_stats/keys/sensor-1
  curl -s '{c.rest_url}/v1/tables/sensor_stats/keys/sensor-1?max_lag=0'
  curl -s {c.rest_url}/v1/tables/sensor_stats/keys/sensor-1/metadata
  curl -s {c.rest_url}/v1/cluster
  .venv/bin/freshroute lookup sensor_stats sensor-1
  .venv/bin/freshroute lookup sensor_stats sensor-1 --grpc {c.grpc_address}
  .venv/bin/freshroute lookup sensor_windows sensor-1 --last 1m    # its 10 s windows of the last minute

  Console: {c.rest_url}/console      OpenAPI docs: {c.rest_url}/docs
  .venv/bin/freshroute local status      .venv/bin/freshroute local down
""", flush=True)

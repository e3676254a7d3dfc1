"""Start the external services of the embedded stack: Apache Kafka, redis-server and Spark standalone.

Both bind to loopback only. Each start waits until the service answers, so that callers
(the local stack, integration tests) can use it at once.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


# Ports handed out by this process: two components given the same port before either binds it would collide.
_GIVEN: set[int] = set()
_LOWEST = 10_000


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (Linux's default range starts at 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free right now on ``host``, below the kernel's ephemeral range and never handed out before.

    Not one the OS picks (bind to 0): that comes from the ephemeral range, where any outgoing
    connection — a Kafka or Redis client of another component — may take it in the seconds before
    the component it was given to binds it.
    """
    high = _ephemeral_low()
    if high - _LOWEST > 1_000:
        rng = random.Random()
        for _ in range(500):
            port = rng.randrange(_LOWEST, high)
            if port in _GIVEN:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _GIVEN.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a kernel with an unusual range
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Block until a TCP connect to host:port succeeds; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[0]} exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s:.0f}s")


@dataclass(frozen=True)
class Service:
    """An external service process this stack started."""

    name: str
    proc: subprocess.Popen
    address: str

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)


def start_broker(home: Path, port: int | None = None, host: str = "127.0.0.1", timeout_s: float = 60.0) -> Service:
    """Start a one-node Apache Kafka (KRaft) with its storage under ``home`` and wait until it serves metadata.

    A ``home`` that holds a node's storage already is restarted with everything it kept.
    """
    from tools.local.broker import BrokerNode, Quorum, prepare

    node = BrokerNode(1, host, port or free_port(host), free_port(host), home)
    quorum = Quorum.alone(node)
    command = prepare(node, quorum)
    with open(home / "broker.log", "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    wait_for_broker(quorum.bootstrap, timeout_s, proc)
    return Service("broker", proc, quorum.bootstrap)


def wait_for_broker(bootstrap: str, timeout_s: float, proc: subprocess.Popen | None = None,
                    brokers: int = 1) -> None:
    """Block until ``brokers`` brokers are registered behind ``bootstrap``; fail early if ``proc`` exits."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    for address in bootstrap.split(",")[:brokers]:  # listening first: a client's refused connects log errors
        host, port = address.rsplit(":", 1)
        wait_for_port(host, int(port), max(0.1, deadline - time.monotonic()), proc)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the broker exited with {proc.returncode} during start-up")
        try:
            if len(admin.list_topics(timeout=1).brokers) >= brokers:
                return
        except Exception:  # noqa: BLE001 — not answering yet
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no Kafka broker answered at {bootstrap} within {timeout_s:.0f}s")
        time.sleep(0.2)


def redis_server_binary() -> str:
    path = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(path).exists():
        raise RuntimeError("redis-server is not installed (the README's set-up command installs it)")
    return path


def redis_command(port: int, data_dir: Path, host: str = "127.0.0.1", protected: bool = True) -> list[str]:
    """Soft state only: no persistence, so a restarted Redis starts empty, as it would after a loss. Unprotected only
    where nothing but the stack can reach it (a private network namespace's address): protected, Redis refuses every
    client that is not on loopback."""
    return [redis_server_binary(), "--bind", host, "--port", str(port), "--save", "", "--appendonly", "no",
            "--dir", str(data_dir), "--protected-mode", "yes" if protected else "no"]


def spark_class() -> str:
    """The PySpark installation's own ``bin/spark-class``: what starts a standalone master or worker."""
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not path.exists():
        raise RuntimeError(f"{path} is missing: PySpark is installed without its launch scripts")
    return str(path)


def spark_daemon_options() -> str:
    """JVM options of a standalone master or worker: they run on PySpark's classpath, as the driver does, and map
    its class archive (:mod:`freshroute.class_archive`) when there is one."""
    from pipeline.session import archive_options
    from pipeline.settings import PipelineSettings

    return archive_options(PipelineSettings().jars_dir).strip()


def spark_master_command(host: str, port: int, webui_port: int) -> list[str]:
    return [spark_class(), "org.apache.spark.deploy.master.Master", "--host", host, "--port", str(port),
            "--webui-port", str(webui_port)]


def spark_worker_command(master_url: str, host: str, webui_port: int, work_dir: Path, cores: int = 32,
                         memory: str = "2g") -> list[str]:
    """A standalone worker offering ``cores`` task slots: the pipeline's Real-time queries hold a task per input and
    shuffle partition for their life, mostly waiting for records (the demo's: 22), so slots are not CPU cores here."""
    work_dir.mkdir(parents=True, exist_ok=True)
    return [spark_class(), "org.apache.spark.deploy.worker.Worker", master_url, "--host", host,
            "--webui-port", str(webui_port), "--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir)]


SENTINEL_MASTER_NAME = "freshroute"


def redis_replica_command(port: int, data_dir: Path, primary: str, host: str = "127.0.0.1",
                          protected: bool = True) -> list[str]:
    """A replica of ``primary`` (HOST:PORT), for Sentinel to promote when the primary dies."""
    primary_host, primary_port = primary.rsplit(":", 1)
    return [*redis_command(port, data_dir, host, protected), "--replicaof", primary_host, primary_port]


def redis_sentinel_command(port: int, data_dir: Path, primary: str, host: str = "127.0.0.1",
                           quorum: int = 2, down_after_ms: int = 1000) -> list[str]:
    """A sentinel watching ``primary`` as ``SENTINEL_MASTER_NAME``, from a config file of its own (it rewrites it)."""
    primary_host, primary_port = primary.rsplit(":", 1)
    conf = data_dir / f"sentinel-{port}.conf"
    data_dir.mkdir(parents=True, exist_ok=True)
    # Loopback time scales: a dead primary is declared down after a second, and a failover that
    # stalls is retried after five.
    conf.write_text("\n".join([
        f"bind {host}", f"port {port}", f"dir {data_dir}", "protected-mode no",
        f"sentinel monitor {SENTINEL_MASTER_NAME} {primary_host} {primary_port} {quorum}",
        f"sentinel down-after-milliseconds {SENTINEL_MASTER_NAME} {down_after_ms}",
        f"sentinel failover-timeout {SENTINEL_MASTER_NAME} 5000",
        f"sentinel parallel-syncs {SENTINEL_MASTER_NAME} 1", ""]))
    sentinel = shutil.which("redis-sentinel")  # Debian's redis-sentinel package; the same server in sentinel mode
    return [sentinel, str(conf)] if sentinel else [redis_server_binary(), str(conf), "--sentinel"]


def start_redis(log_dir: Path, port: int | None = None, host: str = "127.0.0.1", timeout_s: float = 10.0) -> Service:
    """Start redis-server on loopback without persistence and wait until it answers PING."""
    import redis

    port = port or free_port(host)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / "redis.log", "ab")
    proc = subprocess.Popen(redis_command(port, log_dir, host), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    wait_for_port(host, port, timeout_s, proc)
    url = f"redis://{host}:{port}/0"
    redis.Redis.from_url(url).ping()
    return Service("redis", proc, url)

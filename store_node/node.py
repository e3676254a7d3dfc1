"""One store node process: wiring, start-up, and a graceful stop.

Three threads of work: the asyncio event loop serves gRPC reads; the changelog tailer's
thread applies records and owns the replicas' stores; the membership thread talks to Redis
(heartbeats, assignor lease, assignment). ``run(settings)`` blocks until SIGTERM/SIGINT,
then drains: announce draining (health NOT_SERVING, the assignor moves the node's actives
to their standbys), keep answering for ``drain_timeout_ms``, stop the server, leave the
cluster, close every store cleanly.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import logging
import os
import signal
from pathlib import Path
from typing import IO, Any, Mapping

import grpc

from freshroute.errors import ConfigError
from freshroute.lag import now_ms
from freshroute.metadata.store import MetadataStore
from store_node.access import ClusterSecret
from store_node.changelog import ChangelogTailer
from store_node.input_ends import InputEndsWatcher
from store_node.membership import Membership
from store_node.replica import Clock, Replica
from store_node.read_port import ReadPort
from store_node.read_port_front import ReadDoor, start_read_port
from store_node.service import HealthReporter, StoreNodeService, create_server
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)


class StoreNode:
    """The replicas this node hosts, and its place in the cluster."""

    def __init__(self, settings: StoreNodeSettings, clock: Clock = now_ms) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.tailer = ChangelogTailer(settings, clock)
        self.health = HealthReporter(self.ready)
        self.membership: Membership | None = None
        self.input_ends: InputEndsWatcher | None = None
        self.draining = False
        self._clock = clock
        self._dir_lock: IO[bytes] | None = None

    @property
    def serving(self) -> Mapping[tuple[str, int], Replica]:
        """Hosted replicas by (table, partition): an immutable snapshot, swapped on every change."""
        return self.tailer.serving

    def ready(self) -> bool:
        """Serving: following an assignment, not draining, and no hosted replica still restoring."""
        return not self.draining and self.tailer.assignment_applied and \
            not any(rep.restoring for rep in self.serving.values())

    def open(self, timeout_s: float = 30.0) -> None:
        """Claim the data directory and start tailing (nothing is assigned yet)."""
        root = self.settings.replica_root
        self._dir_lock = _lock_dir(root)
        self.tailer.start()
        if not self.tailer.started.wait(timeout_s) or self.tailer.failed:
            raise RuntimeError("the changelog tailer did not start; see the log above")

    def join(self, address: str, read_address: str | None = None) -> None:
        """Start heartbeating as ``address`` (gRPC) and ``read_address`` (read port), following the assignment."""
        metadata = MetadataStore.at(self.settings.redis(), self.settings.namespace)
        self.membership = membership = Membership(self.settings, metadata, address, self.tailer.reports,
                                                  self.tailer.set_desired, self._clock, read_address)
        membership.start()
        self.input_ends = InputEndsWatcher(self.settings, metadata, lambda: membership.holds_lease,
                                           lambda: membership.tables)
        self.input_ends.start()

    def drain(self) -> None:
        self.draining = True
        if self.membership is not None:
            self.membership.drain()

    def close(self) -> None:
        if self.input_ends is not None:
            self.input_ends.stop()
        if self.membership is not None:
            self.membership.stop()
        self.tailer.stop()
        if self._dir_lock is not None:
            self._dir_lock.close()
            self._dir_lock = None


def _lock_dir(root: Path) -> IO[bytes]:
    """The data directory, made if need be and locked: two nodes sharing one would corrupt each other."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"data_dir {root} is a file, not a directory", setting="data_dir", path=str(root))
    try:
        root.mkdir(parents=True, exist_ok=True)
        f = open(root / ".lock", "ab")
    except OSError as e:
        raise ConfigError(f"data_dir {root} cannot hold replica stores: {e.strerror or e}", setting="data_dir",
                          path=str(root)) from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ConfigError(f"data_dir {root} is in use by another store node", setting="data_dir") from None
    return f


async def serve(settings: StoreNodeSettings, stop: asyncio.Event | None = None) -> None:
    """Run a node until ``stop`` is set (or SIGTERM/SIGINT when ``stop`` is None), then drain and close."""
    loop = asyncio.get_running_loop()
    # Before anything listens: a broken file stops the start, naming its setting.
    secret = ClusterSecret(settings.cluster_secret_file)
    grpc_tls, read_tls = settings.server_tls(("h2",)), settings.server_tls()
    read_door: ReadDoor | None = None
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # New secrets and certificates for new connections; those open stay as they are.
        reloads = [x.reload for x in (secret, grpc_tls, read_tls) if x is not None]
        reloads.append(lambda: read_door.reloaded() if read_door is not None else None)
        loop.add_signal_handler(signal.SIGHUP, lambda: [reload() for reload in reloads])
    node = StoreNode(settings)
    await loop.run_in_executor(None, node.open)
    server: grpc.aio.Server | None = None
    metrics: Any = None
    health_task: asyncio.Task | None = None
    try:
        service = StoreNodeService(node)
        server, port = create_server(settings, service, node.health, secret, grpc_tls)
        await node.health.update()
        await server.start()
        # A restore allocates an object per changelog record, thousands per poll: frozen, the
        # start-up objects are not traced by every collection, and a higher threshold lets a
        # batch die by reference counting before a collection promotes it.
        gc.freeze()
        gc.set_threshold(10_000)
        read_door = await start_read_port(ReadPort(node), settings.host, settings.read_port, secret, read_tls,
                                          settings.read_port_front)
        read_port = read_door.port
        if settings.metrics_port is not None:
            from freshroute.prometheus import serve_metrics
            from store_node.metrics import ReplicaCollector

            metrics = serve_metrics(ReplicaCollector(settings.node_id, lambda: node.serving, now_ms), settings.host,
                                    settings.metrics_port)
            log.info("store node %s metrics on http://%s:%d/metrics", settings.node_id,
                     settings.advertise_host or settings.host, metrics.server_address[1])
        host = settings.advertise_host or settings.host
        address, read_address = f"{host}:{port}", f"{host}:{read_port}"
        log.info("store node %s serving on %s, read port %s on the %s front (data in %s)%s%s", settings.node_id,
                 address, read_address, read_door.front, settings.replica_root, " over TLS" if grpc_tls else "",
                 " to peers with the cluster secret" if settings.cluster_secret_file else "")
        print(f"store-node {settings.node_id} listening on {address}, read port {read_address}", flush=True)
        await loop.run_in_executor(None, node.join, address, read_address)
        health_task = asyncio.create_task(node.health.run())
        await stop.wait()
        log.info("store node %s draining", settings.node_id)
        node.draining = True
        await node.health.update()
        await loop.run_in_executor(None, node.drain)
        await asyncio.sleep(settings.drain_timeout_ms / 1000)
    finally:
        if health_task is not None:
            health_task.cancel()
        if metrics is not None:
            metrics.shutdown()
        if read_door is not None:
            read_door.close()
        if server is not None:
            await server.stop(grace=1.0)
        await loop.run_in_executor(None, node.close)
        log.info("store node %s stopped", settings.node_id)


def configure_logging() -> None:
    """Plain line logs on stderr, unless the embedding process configured logging already."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=os.environ.get("FRESHROUTE_LOG_LEVEL", "INFO").upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run(settings: StoreNodeSettings) -> None:
    """Run one store node until SIGTERM/SIGINT (blocking); the CLI's ``store-node`` command."""
    import uvloop

    configure_logging()
    # uvloop: the read port's transports cost a fraction of asyncio's own per frame.
    uvloop.run(serve(settings))

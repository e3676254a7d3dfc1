"""A router over two in-memory store nodes, for the unit tests of everything that routes: REST, gRPC, the client."""

import httpx
import orjson

from freshroute.lag import now_ms
from freshroute.keys import partition_for, serialize_key
from freshroute.metadata.roles import Role
from freshroute.metadata.tables import TableSpec
from freshroute.windows import WATERMARK_KEY, tumbling, watermark_value, window_key
from freshroute.routing.fake import InMemoryStoreClient, fake_snapshot
from freshroute.routing.snapshot import FixedSnapshot, Snapshot
from router.rest.app import create_app
from router.routing import Router
from router.settings import RouterSettings

TABLE = "sensor_stats"
SPEC = TableSpec(TABLE, f"{TABLE}-changelog", 4, "sensor_id", {"count": "long", "avg": "double"}, 1)
KEYS = [f"sensor-{i}" for i in range(24)]


def part(key):
    return partition_for(serialize_key(key), SPEC.partitions)


class Cluster:
    """Two fake nodes; n1 active for even partitions, n2 for odd; every key on both."""

    def __init__(self, settings=None, tables=(SPEC,)):
        self.settings = settings or RouterSettings(request_timeout_ms=500, attempt_timeout_ms=200, hedge=False)
        self.store = InMemoryStoreClient()
        self.n1 = self.store.add_node("n1")
        self.n2 = self.store.add_node("n2")
        for p in range(SPEC.partitions):
            for node, active in ((self.n1, p % 2 == 0), (self.n2, p % 2 == 1)):
                node.host(TABLE, p, role=Role.ACTIVE if active else Role.STANDBY, applied=100, end=100)
        for i, key in enumerate(KEYS):
            for node in (self.n1, self.n2):
                node.replicas[(TABLE, part(key))].data[serialize_key(key)] = orjson.dumps({"count": i, "avg": i / 2})
        self.tables = list(tables)
        self.metadata = FixedSnapshot(Snapshot())
        self.refresh()
        self.router = Router(self.settings, self.metadata, self.store)

    def refresh(self):
        self.metadata.current = fake_snapshot(self.store, self.tables, now_ms())

    def node_for(self, key, role):
        p = part(key)
        return self.n1 if (p % 2 == 0) == (role is Role.ACTIVE) else self.n2

    def client(self, **kw):
        app = create_app(self.settings, self.router, **kw)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router")


def strictly_ordered(cluster, key):
    """Make the active strictly fresher than the standby so it is always tried first."""
    standby = cluster.node_for(key, Role.STANDBY)
    standby.replicas[(TABLE, part(key))].end += 1
    cluster.refresh()
    return cluster.node_for(key, Role.ACTIVE), standby


def retries(cluster, reason):
    return cluster.router.metrics.registry.get_sample_value("freshroute_router_retries_total", {"reason": reason}) or 0


WINDOWED = "sensor_windows"
W = tumbling("10s", grace="5s", retention="1m")
WSPEC = TableSpec(WINDOWED, f"{WINDOWED}-changelog", 4, "sensor", {"count": "bigint"}, 1, window=W)
S = 1000


def wpart(key: str) -> int:
    return partition_for(serialize_key(key), WSPEC.partitions)


def windowed_cluster(settings: RouterSettings | None = None, watermark: int = 25 * S) -> Cluster:
    """Sensors s0..s5 with windows at 0, 10 s, 20 s (count = sensor number + start / 10 s) on both nodes."""
    cluster = Cluster(settings, tables=(SPEC, WSPEC))
    for p in range(WSPEC.partitions):
        for node, active in ((cluster.n1, p % 2 == 0), (cluster.n2, p % 2 == 1)):
            r = node.host(WINDOWED, p, role=Role.ACTIVE if active else Role.STANDBY, applied=100, end=100)
            r.data[WATERMARK_KEY] = watermark_value(watermark)
    for i in range(6):
        key = f"s{i}"
        for start in (0, 10 * S, 20 * S):
            for node in (cluster.n1, cluster.n2):
                node.replicas[(WINDOWED, wpart(key))].data[window_key(key.encode(), start)] = \
                    orjson.dumps({"count": i + start // (10 * S)})
    cluster.refresh()
    return cluster

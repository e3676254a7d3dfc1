"""A router over two in-memory store nodes, for the unit tests of everything that routes: REST, gRPC, the client."""

import httpx
import orjson

from freshroute.freshness import now_ms
from freshroute.keys import partition_for, serialize_key
from freshroute.metadata import Role, TableSpec
from freshroute.routing.fake import InMemoryStoreClient, fake_snapshot
from freshroute.routing.snapshot import FixedSnapshot, Snapshot
from router.rest import create_app
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

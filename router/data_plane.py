"""The compiled lookup path (``native/dataplane``), wired into the router process: it owns the REST port (and the gRPC
port, with the gRPC front on), answers key lookups and ``Router.Get`` on threads of its own, and sends every other
request and call to the Python fronts on loopback ports.

The Python side keeps the control plane: at every metadata refresh it pushes the routing view (:func:`~freshroute.routing.compiled_view.snapshot_doc`:
the tables the path serves, every replica's latest lag) and it counts the path's lookups into the router's metrics at
a scrape. The path answers key lookups (also after a write token, waiting for its events), a key's windows and reads
as of a time (in milliseconds); what it does not serve — a bound of the input's lag, a wait for a position, a refusal
of a write token, a time in RFC 3339, a versions or metadata route, a
table of JSON or bytes keys, a read no replica the view trusts can answer at the first try (or the hedge's), every
refusal but a 401 — it relays to the Python path, which answers it with every rule of :mod:`freshroute.routing`.
Where the path cannot be used at all (not built; client certificates required, which it does not take yet) the
Python fronts serve the ports themselves, as they did before the path existed. With TLS, the
path terminates it (rustls, from the files :class:`freshroute.tls.ServerTLS` loaded) and the Python fronts behind it
speak plain HTTP on loopback.

When the router authenticates, the path judges a lookup's bearer token by the principals :class:`router.auth.Guard`
loaded, pushed with the tables each may read as the guard judged them (:func:`principals_doc`); a rated principal's
lookups spend reads the control plane leases for the path from the principal's shared bucket ahead of its demand
(:meth:`DataPlane.lease`). A table not judged for the principal, a lease spent, an unusual header: the Python path.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from typing import Any, Callable, Iterable, Iterator

import orjson
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from freshroute.metadata.table_versions import logical_of
from freshroute.routing.compiled_view import policy_doc, snapshot_doc
from freshroute.routing.counts import LookupCounts
from freshroute.routing.policy import RoutingPolicy
from freshroute.routing.snapshot import Snapshot
from router.auth import Guard, Principals
from router.handover import Inbox, ProtocolFactory
from freshroute.tls import ServerTLS
from router.metrics import RouterMetrics
from router.rate_limit import LEASE_S
from router.settings import RouterSettings

log = logging.getLogger(__name__)


def why_not(settings: RouterSettings, tls: ServerTLS | None = None) -> str | None:
    """Why this router serves REST from its Python front alone (None: the compiled path serves it); ``tls``: the REST
    port's certificate, as loaded."""
    if settings.data_plane != "compiled":
        return "data_plane is python"
    if settings.tls_client_ca is not None:
        return "the router requires client certificates (tls_client_ca), which the compiled path does not take yet"
    if settings.cluster_cert is not None and settings.cluster_ca is None:
        return "store nodes are trusted by the system's CAs (cluster_cert without cluster_ca), which the compiled " \
               "path does not read"
    try:
        from freshroute_dataplane import cluster_tls_problem, tls_problem
    except ImportError:
        return "the compiled path is not built here (native/dataplane: ./dev builds it)"
    problem = tls_problem(tls.pem[0], tls.pem[1]) if tls is not None else None
    if problem is not None:
        return f"rustls cannot serve tls_cert and tls_key: {problem}"
    cluster = cluster_files(settings)
    problem = cluster_tls_problem(*cluster) if cluster is not None else None
    if problem is not None:
        return f"rustls cannot reach store nodes with these files: {problem}"
    return None


def cluster_files(settings: RouterSettings) -> tuple[bytes, bytes | None, bytes | None] | None:
    """The PEM files the router reaches store nodes over TLS with (cluster_ca, cluster_cert, cluster_key), or None."""
    if settings.cluster_ca is None:
        return None
    cert, key = settings.cluster_cert, settings.cluster_key
    return (settings.cluster_ca.read_bytes(), cert.read_bytes() if cert is not None else None,
            (key or cert).read_bytes() if cert is not None else None)


def config_doc(settings: RouterSettings, policy: RoutingPolicy, keep_alive_s: float) -> str:
    """The routing policy's settings the compiled path follows (:func:`policy_doc`), the cluster secret it presents to
    store nodes, how long it keeps an idle connection (the Python front's keep-alive timeout) and whether it
    authenticates, as JSON."""
    return orjson.dumps({**policy_doc(policy, settings.node_access().secret), "keep_alive_s": keep_alive_s,
                         "authenticates": settings.auth_file is not None}).decode()


def principals_doc(principals: Principals, tables: Iterable[str]) -> bytes:
    """The principals the compiled path judges tokens by, as JSON: each token's SHA-256, the ``tables`` (of those the
    routing view names) the guard lets it read, and its rate."""
    tables = sorted(tables)
    return orjson.dumps({"principals": [
        {"name": p.name, "token_sha256": digest, "tables": [t for t in tables if p.may_read(t)],
         "rate": None if p.rate is None else {"reads_per_s": p.rate.reads_per_s, "burst": p.rate.burst}}
        for digest, p in principals.by_token_hash.items()]})


class DataPlane:
    """The compiled REST front of this process: started on the REST port's socket, fed each snapshot, counted in the
    router's metrics, stopped."""

    def __init__(self, settings: RouterSettings, metrics: RouterMetrics, guard: Guard | None = None,
                 tls: ServerTLS | None = None) -> None:
        from freshroute_dataplane import Front

        self.settings = settings
        self.policy = RoutingPolicy.from_settings(settings)
        self.guard, self.tls = guard, tls
        self._make = Front
        self._front: Any = None
        self._tables: frozenset[str] = frozenset()
        self._leasing: asyncio.Task[None] | None = None
        self._inbox: Inbox | None = None
        metrics.lookups.counts(fill=self._fill)
        metrics.registry.register(_PathCollector(self))

    def start(self, rest: socket.socket, python_port: int, keep_alive_s: float, snap: Snapshot,
              grpc: tuple[socket.socket, int] | None = None,
              protocol: Callable[[], ProtocolFactory | None] | None = None) -> None:
        """Serve the REST port (``rest``, listening) on the path's threads; ``python_port``: the Python front's, whose
        keep-alive timeout the path's idle connections keep too; ``grpc``: the gRPC port (listening) and the Python
        gRPC front's loopback port, when the path serves gRPC too; ``protocol``: the Python front's protocol for a
        connection (None until it has started), which adopts the sockets of the plain connections the path hands
        over (without it, they are spliced through to ``python_port``). Called on the event loop the leases are kept
        on."""
        if protocol is not None:
            self._inbox = Inbox()
            self._inbox.start(protocol)
        self._front = self._make(rest.fileno(), python_port, config_doc(self.settings, self.policy, keep_alive_s),
                                 None if grpc is None else (grpc[0].fileno(), grpc[1]),
                                 None if self._inbox is None else self._inbox.path_end)
        cluster = cluster_files(self.settings)
        if cluster is not None:
            self._front.cluster_tls(*cluster)
        self.on_snapshot(snap)
        self.reloaded()
        if self.guard is not None:
            self._leasing = asyncio.get_running_loop().create_task(self.lease(), name="compiled-path-leases")
        self._front.start(self.settings.data_plane_threads)

    def on_snapshot(self, snap: Snapshot) -> None:
        if self._front is None:
            return
        self._front.update(snapshot_doc(snap, self.policy))
        if self.guard is None:
            return
        # By the names reads give: a version's own table (t-v2) is read as its table's, also once version 1 is retired.
        tables = frozenset(logical_of(n)[0] for n in snap.tables)
        if tables != self._tables:
            self._tables = tables
            self.on_principals()

    def on_principals(self) -> None:
        """Push the guard's principals (at the start, after the auth file is reloaded, when the tables change)."""
        if self._front is not None and self.guard is not None:
            self._front.principals(principals_doc(self.guard.principals, self._tables))

    def reloaded(self) -> None:
        """Push the principals and the certificate in force (at the start, and after SIGHUP reloaded them)."""
        self.on_principals()
        if self._front is not None and self.tls is not None:
            try:
                self._front.tls(*self.tls.pem[:2])
            except ValueError as e:
                log.error("TLS files not reloaded by the compiled path, its previous certificate stays in use: %s", e)

    async def lease(self) -> None:
        """Keep each rated principal's reads on the path leased a little ahead of its demand there: about
        ``LEASE_S`` of it, asked for every half of that, from the shared bucket the Python path draws on too."""
        assert self.guard is not None
        guard, interval = self.guard, LEASE_S / 2
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            elapsed, last = max(now - last, 1e-3), now
            rates = {p.name: p.rate for p in guard.principals.by_token_hash.values() if p.rate is not None}
            for name, (left, asked) in self._front.rates().items():
                rate = rates.get(name)
                if rate is None or not asked:
                    continue
                ahead = math.ceil(asked / elapsed * LEASE_S)
                if left >= ahead:
                    continue
                try:
                    granted = await guard.rates.lease(name, rate, max(1, min(2 * ahead - left, int(rate.burst // 2))))
                except Exception:  # noqa: BLE001 — the Python path admits the principal's reads meanwhile
                    log.exception("a lease for the compiled path failed; principal %r is admitted by the Python path",
                                  name)
                    continue
                if granted:
                    self._front.grant(name, granted)

    def stop(self, grace_s: float) -> None:
        """Stop accepting; connections close once idle or after ``grace_s``."""
        if self._leasing is not None:
            self._leasing.get_loop().call_soon_threadsafe(self._leasing.cancel)
        if self._front is not None:
            self._front.stop(grace_s)
        if self._inbox is not None and self._inbox.loop is not None:
            self._inbox.loop.call_soon_threadsafe(self._inbox.close)

    def counts(self) -> dict[str, Any]:
        """What the path has counted so far (``Front.counts``); empty before it starts."""
        return self._front.counts() if self._front is not None else {}

    def _fill(self, mine: LookupCounts) -> None:
        c = self.counts()
        if c:
            for (outcome, role), n in c["lookups"].items():
                mine.lookups[(outcome, role)] = n
            mine.buckets[:] = c["buckets"]
            mine.sum_s = c["sum_s"]
            mine.retries["hedge"] = c["hedges"]
            mine.retries["after"] = c["after_retries"]


class _PathCollector(Collector):
    """Requests the compiled path left to the Python path, and the connections it accepted."""

    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    def collect(self) -> Iterator[Metric]:
        c = self._plane.counts()
        requests = CounterMetricFamily("freshroute_router_compiled_path_handoffs", "REST requests the compiled path "
                                       "relayed to the Python path (relayed) and connections it handed over whole, "
                                       "their sockets adopted by the Python front (adopted) or spliced through to it "
                                       "(handed_over: TLS); gRPC calls it relayed to the Python gRPC front "
                                       "(grpc_relayed)", labels=["how"])
        requests.add_metric(["relayed"], c.get("relayed", 0))
        requests.add_metric(["handed_over"], c.get("handed_over", 0))
        requests.add_metric(["adopted"], c.get("adopted", 0))
        requests.add_metric(["grpc_relayed"], c.get("grpc_relayed", 0))
        yield requests
        connections = CounterMetricFamily("freshroute_router_compiled_path_connections", "connections the compiled "
                                          "path accepted, by port", labels=["port"])
        connections.add_metric(["rest"], c.get("connections", 0))
        connections.add_metric(["grpc"], c.get("grpc_connections", 0))
        yield connections

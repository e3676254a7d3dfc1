"""The store node's gRPC service: what is not a read.

Reads have one door, the read port (:mod:`store_node.read_port`). gRPC stays for what needs a
standard protocol rather than speed: ``Status`` (every replica's lag and counters, for tools
and tests), the standard health service that orchestrators probe, and reflection (grpcurl).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from freshroute.lag import now_ms
from freshroute.wire import replica_status_message
from proto import store_pb2, store_pb2_grpc
from store_node.read_port import HostedReplicas

if TYPE_CHECKING:
    from freshroute.tls import ServerTLS
    from store_node.access import ClusterSecret
    from store_node.settings import StoreNodeSettings

SERVICE_NAME = store_pb2.DESCRIPTOR.services_by_name["StoreNode"].full_name


class StoreNodeService(store_pb2_grpc.StoreNodeServicer):
    """The node's status over gRPC: every hosted replica's lag and counters."""

    def __init__(self, node: HostedReplicas, clock: Callable[[], int] = now_ms) -> None:
        self._node = node
        self._node_id = node.node_id
        self._clock = clock

    async def Status(self, request: store_pb2.StatusRequest, context) -> store_pb2.NodeStatus:
        now = self._clock()
        out = store_pb2.NodeStatus(node=self._node_id, draining=self._node.draining)
        for key, rep in sorted(self._node.serving.items()):
            out.replicas.append(replica_status_message(self._node_id, rep.role, rep.state, *rep.lag.figures(now),
                                                       rep.failure))
            out.tables.append(f"{key[0]}/{key[1]}")
            c = rep.counters
            out.counters.append(store_pb2.ReplicaCounters(records_applied=c.records_applied,
                                                          records_skipped=c.records_skipped,
                                                          restores=c.restores, resumed_from=c.resumed_from))
        return out


class HealthReporter:
    """Keeps the standard health service in step with the node: NOT_SERVING while restoring or draining."""

    def __init__(self, ready: Callable[[], bool], period_s: float = 0.2) -> None:
        self.servicer = health.aio.HealthServicer()
        self._ready = ready
        self._period = period_s
        self._last: int | None = None

    async def run(self) -> None:
        while True:
            await self.update()
            await asyncio.sleep(self._period)

    async def update(self) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if self._ready() else \
            health_pb2.HealthCheckResponse.NOT_SERVING
        if status != self._last:
            self._last = status
            await self.servicer.set("", status)
            await self.servicer.set(SERVICE_NAME, status)


def create_server(settings: "StoreNodeSettings", service: StoreNodeService, health: HealthReporter,
                  secret: "ClusterSecret | None" = None, tls: "ServerTLS | None" = None) -> tuple[grpc.aio.Server, int]:
    """Wire the gRPC server (``service``, the node's health service, reflection) and bind it; port 0 picks one.

    With ``secret`` holding secrets every call but health checks must present one; with ``tls`` the port speaks
    only TLS."""
    interceptors = [secret.interceptor()] if secret is not None and secret.required else []
    server = grpc.aio.server(interceptors=interceptors,
                             options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 16 << 20),
                                      ("grpc.max_send_message_length", 64 << 20)])
    store_pb2_grpc.add_StoreNodeServicer_to_server(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    address = f"{settings.host}:{settings.port}"
    if tls is not None:
        from freshroute.tls import grpc_server_credentials

        port = server.add_secure_port(address, grpc_server_credentials(tls))
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {settings.host}:{settings.port}")
    return server, port

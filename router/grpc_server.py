"""The router's public gRPC port, wired: a grpc.aio server with the Router service, health and server reflection,
behind the gRPC front (:mod:`router.transports.grpc_front`) or on its own, as the settings ask.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from freshroute.errors import ConfigError
from freshroute.tls import ServerTLS
from proto import router_pb2, router_pb2_grpc
from router.auth import Guard
from router.grpc_get import RouterGetCalls
from router.grpc_servicer import RouterServicer
from router.routing import Router
from router.settings import RouterSettings
from router.transports.grpc_front import GrpcFront

SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name


def create_grpc_server(settings: RouterSettings, router: Router, guard: Guard | None = None,
                       relay_key: str | None = None) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server (not started) with Router, health and reflection, bound to ``settings.grpc_port``.

    Call from a running event loop. Returns the bound port, so ``grpc_port=0`` lets the OS pick.
    """
    loop = asyncio.get_running_loop()
    # Without reuse_port, a second router on the same port fails to start rather than
    # silently sharing it.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1 if settings.reuse_port else 0)])
    router_pb2_grpc.add_RouterServicer_to_server(RouterServicer(router, guard, relay_key), server)

    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    pending: set[asyncio.Task[None]] = set()

    def on_ready(ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            task = loop.create_task(health.set(name, status))
            pending.add(task)
            task.add_done_callback(pending.discard)

    router.add_ready_listener(on_ready)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{settings.host}:{settings.grpc_port}")
    if not port:
        raise RuntimeError(f"cannot bind gRPC to {settings.host}:{settings.grpc_port}")
    return server, port


class PublicGrpc:
    """The router's public gRPC port as the settings ask: the front (``Router.Get`` in place, every other
    call relayed to a grpc.aio server on a port only this process knows of), or grpc.aio alone.

    ``behind_compiled_path``: the compiled path owns the public port (and its TLS) and relays to the front, which
    then listens in plain HTTP/2 on a loopback port of its own.
    """

    def __init__(self, settings: RouterSettings, router: Router, guard: Guard | None = None,
                 tls: ServerTLS | None = None, behind_compiled_path: bool = False) -> None:
        self.front: GrpcFront | None = None
        if tls is not None and not settings.grpc_front:
            raise ConfigError("TLS on the gRPC port needs grpc_front (the default): set grpc_front true",
                              setting="grpc_front")
        if settings.grpc_front:
            inner = settings.model_copy(update={"host": "127.0.0.1", "grpc_port": 0, "reuse_port": False})
            # Relayed calls carry their authorization metadata, and the client certificate's subject vouched
            # for by a key only this process knows: the inner servicer checks them.
            relay_key = secrets.token_urlsafe(24)
            self._server, inner_port = create_grpc_server(inner, router, guard, relay_key)
            public = inner if behind_compiled_path else settings
            self.front = GrpcFront(RouterGetCalls(router, guard), f"127.0.0.1:{inner_port}", public.host,
                                   public.grpc_port, public.reuse_port,
                                   tls.context if tls and not behind_compiled_path else None, relay_key)
        else:
            self._server, self.port = create_grpc_server(settings, router, guard)

    @property
    def connections(self) -> set[Any]:
        """The front's open connections (none without the front)."""
        return self.front.connections if self.front is not None else set()

    async def start(self) -> int:
        """Start serving; returns the public port."""
        await self._server.start()
        if self.front is not None:
            self.port = await self.front.start()
        return self.port

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; calls in flight get ``grace`` seconds."""
        if self.front is not None:
            await self.front.stop(grace)
            await self._server.stop(None)
        else:
            await self._server.stop(grace)

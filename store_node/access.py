"""Who a store node serves: peers presenting the cluster secret (when it has one), on either port.

The read port checks the first batch of each connection (``store_node.read_port``); gRPC checks
each call's metadata in an interceptor, before any handler runs. The standard health service
stays open, as orchestrators probe it. Client certificates (``tls_client_ca``) are checked by
the TLS handshake itself, before either. SIGHUP rereads the file (:meth:`ClusterSecret.reload`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Awaitable, Callable

import grpc

from freshroute.cluster_access import SECRET_METADATA, SecretCheck, read_secrets
from freshroute.errors import ConfigError

log = logging.getLogger(__name__)

REFUSAL = "the cluster secret is missing or wrong"
_OPEN = ("/grpc.health.v1.Health/",)


class ClusterSecret:
    """The secrets a node accepts, from ``path`` (None: every peer is served)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.check = SecretCheck(read_secrets(path) if path is not None else ())

    @property
    def required(self) -> bool:
        return self.check.required

    def admits(self, presented: str | bytes) -> bool:
        return self.check.admits(presented)

    def reload(self) -> bool:
        """Read the file again; a broken file is refused with an error logged, and the old secrets kept."""
        if self.path is None:
            return True
        try:
            self.check = SecretCheck(read_secrets(self.path))
        except ConfigError as e:
            log.error("cluster secrets not reloaded, the previous ones stay in use: %s", e.message)
            return False
        log.info("cluster secrets reloaded from %s", self.path)
        return True

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return _SecretInterceptor(self)


class _SecretInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, secret: ClusterSecret) -> None:
        self._secret = secret

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_OPEN):
            return handler
        presented = next((v for k, v in details.invocation_metadata or () if k == SECRET_METADATA), "")
        if self._secret.admits(presented):
            return handler
        log.warning("gRPC %s refused: %s", details.method, REFUSAL)
        return _refusing(handler)


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)


async def _refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
    yield  # an async generator, as a streaming handler must be


async def _refuse_streamed(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
    # The caller's first message read before the refusal: refused while still writing it, grpc-core's client may
    # report INTERNAL ("Internal error from Core") instead of the refusal.
    await context.read()
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
    yield


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that answers UNAUTHENTICATED and runs nothing."""
    codec = {"request_deserializer": handler.request_deserializer,
             "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_refuse_streamed, **codec)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_refuse, **codec)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_refuse_stream, **codec)
    return grpc.unary_unary_rpc_method_handler(_refuse, **codec)

"""Typed settings of the router process (flags and ``FRESHROUTE_*`` environment variables)."""

from __future__ import annotations

from pathlib import Path

from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import Field, create_model, field_validator, model_validator

from freshroute.routing.policy import RoutingPolicy
from freshroute.settings import ServingSettings, embedded

if TYPE_CHECKING:
    from freshroute.cluster_access import NodeAccess


class _RouterProcess(ServingSettings):
    """Where the router listens and how it reads the metadata; :class:`RouterSettings` adds the routing settings."""

    host: str = Field(default="127.0.0.1", description="interface for REST and gRPC")
    rest_port: int = Field(default=8080, ge=0, le=65535, description="REST port (0 = let the OS pick)")
    grpc_port: int = Field(default=50051, ge=0, le=65535, description="gRPC port (0 = let the OS pick)")
    grpc_front: bool = Field(default=True, description="answer Router.Get on the gRPC connection itself (HTTP/2 on "
                             "the event loop) and relay every other call to grpc.aio; false: grpc.aio serves the port")
    rest_fast_path: bool = Field(default=True, description="answer key lookups on the REST connection itself "
                                 "(HTTP/1.1 on the event loop); off: uvicorn's own protocol serves every request")
    data_plane: Literal["compiled", "python"] = Field(
        default="compiled", description="compiled: the REST port's key lookups (and, with grpc_front, the gRPC port's "
        "Router.Get) are answered by the compiled path (native/dataplane) on threads of its own, everything else by "
        "the Python fronts behind it; python: the Python fronts serve the ports (also where the compiled path is not "
        "built, or with tls_client_ca)")
    data_plane_threads: int = Field(default=1, ge=1, le=64, description="threads of the compiled path, each "
                                    "accepting on the REST port and the gRPC port")
    auth_file: Path | None = Field(default=None, description="principals, their token hashes, tables and rates "
                                   "(YAML or JSON; see docs/security.md); reloaded on SIGHUP; unset: no "
                                   "authentication")
    cluster_ca: Path | None = Field(default=None, description="PEM CA certificate(s) that signed the store nodes' "
                                    "certificates: with it, the router reaches store nodes over TLS")
    cluster_cert: Path | None = Field(default=None, description="PEM certificate the router presents to store nodes "
                                      "that require client certificates (their tls_client_ca)")
    cluster_key: Path | None = Field(default=None, description="PEM private key of cluster_cert")
    reuse_port: bool = Field(default=False, description="bind both ports with SO_REUSEPORT, so that several router "
                             "processes on one machine share them (Linux spreads connections across them)")
    metrics_port: int | None = Field(default=None, ge=0, le=65535, description="also serve this process's Prometheus "
                                     "/metrics on a port of its own (0 = a free one): with reuse_port, /metrics on "
                                     "the shared REST port answers from whichever process took the connection")

    # A refresh that suddenly finds no tables or no nodes is taken for a restarted (empty)
    # Redis and ignored for redis_reset_grace_ms, while store nodes and the pipeline
    # republish their soft state.
    refresh_ms: int = Field(default=150, ge=10, description="rebuild the metadata snapshot from Redis this often")
    redis_timeout_ms: int = Field(default=500, ge=10, description="timeout of one metadata read from Redis")
    redis_reset_grace_ms: int = Field(default=5000, ge=0,
                                      description="how long an emptied Redis is not believed")

    graceful_shutdown_s: float = Field(default=5.0, ge=0.0, description="time in-flight requests get on SIGTERM")
    log_level: str = Field(default="INFO", description="logging level")

    @field_validator("table_bounds", mode="before", check_fields=False)
    @classmethod
    def _json_table_bounds(cls, value: Any) -> Any:
        # A flag arrives as a JSON string (the environment variable is decoded by pydantic-settings).
        if isinstance(value, (str, bytes)):
            try:
                return orjson.loads(value) if value else {}
            except orjson.JSONDecodeError as e:
                raise ValueError(f"not JSON: {e}") from None
        return value

    @model_validator(mode="after")
    def _cluster_files_together(self) -> "_RouterProcess":
        if (self.cluster_cert is None) != (self.cluster_key is None):
            raise ValueError("cluster_cert and cluster_key go together: give both, or neither")
        return self

    def node_access(self) -> "NodeAccess":
        """How this router reaches store nodes (a bad file fails naming its setting)."""
        from freshroute.cluster_access import NodeAccess
        from freshroute.tls import ClientTLS

        tls = ClientTLS(self.cluster_ca, self.cluster_cert, self.cluster_key,
                        ("cluster_ca", "cluster_cert", "cluster_key"))
        return NodeAccess.of(self.cluster_secret_file, tls)


# Every routing setting (deadlines, hedging, freshness tolerances, limits, table_bounds), as RoutingPolicy declares it.
RouterSettings = create_model("RouterSettings", __base__=_RouterProcess, __module__=__name__,
                              __doc__="Where the router listens, how often it refreshes metadata, and how it "
                                      "retries, hedges and judges freshness (freshroute.routing.policy).",
                              **embedded(RoutingPolicy))

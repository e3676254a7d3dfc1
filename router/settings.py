"""Typed settings of the router process (flags and ``FRESHROUTE_*`` environment variables)."""

from __future__ import annotations

from pathlib import Path

from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from freshroute.settings import ServingSettings

if TYPE_CHECKING:
    from freshroute.cluster_access import NodeAccess


class TableBound(BaseModel):
    """A table's default freshness bound; ``None`` means no limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_lag: int | None = Field(default=None, ge=0)
    max_staleness_ms: int | None = Field(default=None, ge=0)


class RouterSettings(ServingSettings):
    """Where the router listens, how often it refreshes metadata, and how it retries and hedges.

    ``table_bounds`` overrides a table's default bound as the pipeline registered it, e.g.
    ``FRESHROUTE_TABLE_BOUNDS='{"sensor_stats": {"max_lag": null, "max_staleness_ms": 5000}}'``.
    A request's own ``max_lag`` / ``max_staleness_ms`` override both.
    """

    host: str = Field(default="127.0.0.1", description="interface for REST and gRPC")
    rest_port: int = Field(default=8080, ge=0, le=65535, description="REST port (0 = let the OS pick)")
    grpc_port: int = Field(default=50051, ge=0, le=65535, description="gRPC port (0 = let the OS pick)")
    grpc_front: bool = Field(default=True, description="answer Router.Get on the gRPC connection itself (HTTP/2 on "
                             "the event loop) and relay every other call to grpc.aio; false: grpc.aio serves the port")
    rest_fast_path: bool = Field(default=True, description="answer key lookups on the REST connection itself "
                                 "(HTTP/1.1 on the event loop); off: uvicorn's own protocol serves every request")
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
    node_expiry_ms: int = Field(default=1200, ge=100, description="a node whose heartbeat is older is dead "
                                                                  "(the store nodes' node_expiry_ms)")
    redis_timeout_ms: int = Field(default=500, ge=10, description="timeout of one metadata read from Redis")
    redis_reset_grace_ms: int = Field(default=5000, ge=0,
                                      description="how long an emptied Redis is not believed")

    request_timeout_ms: int = Field(default=2000, ge=1, description="overall deadline of one lookup")
    attempt_timeout_ms: int = Field(default=500, ge=1,
                                    description="after this, a slow replica is joined by the next one")
    scan_timeout_ms: int = Field(default=5000, ge=1, description="overall deadline of one scan page")

    # Hedging: a second replica is asked when the first is slower than the recent
    # hedge_quantile of attempt latencies (clamped to [hedge_min_ms, attempt_timeout_ms]).
    hedge: bool = Field(default=True, description="hedge slow lookups to a second replica")
    hedge_quantile: float = Field(default=0.95, gt=0.0, lt=1.0, description="latency quantile that triggers a hedge")
    hedge_min_ms: float = Field(default=5.0, ge=0.0, description="never hedge sooner than this")
    hedge_budget: float = Field(default=0.1, ge=0.0, le=1.0,
                                description="at most this many hedges per lookup on average")

    # A replica whose lag the router saw longer ago than view_trust_ms is never excluded
    # by that old view: the store node enforces the bound itself.
    freshness_tolerance_offsets: int = Field(default=0, ge=0,
                                             description="lag differences up to this count as equally fresh")
    freshness_tolerance_ms: int = Field(default=0, ge=0,
                                        description="staleness differences up to this count as equally fresh")
    view_trust_ms: int = Field(default=1000, ge=0, description="older lag views never exclude a replica")
    failure_backoff_ms: int = Field(default=1000, ge=0,
                                    description="a replica that just failed is tried last for this long")

    table_bounds: dict[str, TableBound] = Field(
        default={}, description='per-table default bounds, JSON: {"table": {"max_lag": n, "max_staleness_ms": n}}')

    batch_max_keys: int = Field(default=1000, ge=1, description="most keys in one batchGet")
    scan_default_limit: int = Field(default=100, ge=1, description="scan page size when none is given")
    scan_max_limit: int = Field(default=1000, ge=1, description="largest scan page")
    max_windows: int = Field(default=10_000, ge=1, le=1_000_000,
                             description="most windows one windows lookup may span (from..to over the window slide)")

    graceful_shutdown_s: float = Field(default=5.0, ge=0.0, description="time in-flight requests get on SIGTERM")
    log_level: str = Field(default="INFO", description="logging level")

    @field_validator("table_bounds", mode="before")
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
    def _cluster_files_together(self) -> "RouterSettings":
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

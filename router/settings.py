"""Typed settings of the router process (flags and ``FRESHROUTE_*`` environment variables)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from freshroute.settings import CommonSettings


class TableBound(BaseModel):
    """A table's default freshness bound; ``None`` means no limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_lag: int | None = Field(default=None, ge=0)
    max_staleness_ms: int | None = Field(default=None, ge=0)


class RouterSettings(CommonSettings):
    """Where the router listens, how often it refreshes metadata, and how it retries and hedges.

    ``table_bounds`` overrides a table's default bound as the pipeline registered it, e.g.
    ``FRESHROUTE_TABLE_BOUNDS='{"sensor_stats": {"max_lag": null, "max_staleness_ms": 5000}}'``.
    A request's own ``max_lag`` / ``max_staleness_ms`` override both.
    """

    host: str = "127.0.0.1"
    rest_port: int = Field(default=8080, ge=0, le=65535)
    grpc_port: int = Field(default=50051, ge=0, le=65535)  # 0 = let the OS pick

    # Metadata: rebuilt whole from Redis this often; a node whose last heartbeat is older
    # than node_expiry_ms is dead. A refresh that suddenly finds no tables or no nodes is
    # taken for a restarted (empty) Redis and ignored for redis_reset_grace_ms, while the
    # store nodes and the pipeline republish their soft state.
    refresh_ms: int = Field(default=150, ge=10)
    node_expiry_ms: int = Field(default=2000, ge=100)
    redis_timeout_ms: int = Field(default=500, ge=10)
    redis_reset_grace_ms: int = Field(default=5000, ge=0)

    # Deadlines: one overall per request, one per attempt on a replica.
    request_timeout_ms: int = Field(default=2000, ge=1)
    attempt_timeout_ms: int = Field(default=500, ge=1)
    scan_timeout_ms: int = Field(default=5000, ge=1)

    # Hedging: a second replica is asked when the first is slower than the recent
    # hedge_quantile of attempt latencies (clamped to [hedge_min_ms, attempt_timeout_ms]),
    # at most hedge_budget extra requests per request on average.
    hedge: bool = True
    hedge_quantile: float = Field(default=0.95, gt=0.0, lt=1.0)
    hedge_min_ms: float = Field(default=5.0, ge=0.0)
    hedge_budget: float = Field(default=0.1, ge=0.0, le=1.0)

    # Selection: replicas whose lag is within these of the freshest count as equally
    # fresh and share load; a replica whose lag the router saw longer ago than
    # view_trust_ms is never excluded by that old view (the store enforces the bound);
    # a replica that just failed goes to the back of the line for failure_backoff_ms.
    freshness_tolerance_offsets: int = Field(default=0, ge=0)
    freshness_tolerance_ms: int = Field(default=0, ge=0)
    view_trust_ms: int = Field(default=1000, ge=0)
    failure_backoff_ms: int = Field(default=1000, ge=0)

    table_bounds: dict[str, TableBound] = {}

    batch_max_keys: int = Field(default=1000, ge=1)
    scan_default_limit: int = Field(default=100, ge=1)
    scan_max_limit: int = Field(default=1000, ge=1)

    graceful_shutdown_s: float = Field(default=5.0, ge=0.0)
    log_level: str = "INFO"

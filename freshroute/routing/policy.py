"""The routing settings, declared once: deadlines, hedging, freshness tolerances and limits of one routing core.

A client passes a :class:`RoutingPolicy`; the router's settings embed every field of it (flags
``--request-timeout-ms``, variables ``FRESHROUTE_REQUEST_TIMEOUT_MS``), each with the description and limits
written here or, for ``node_expiry_ms``, with the heartbeats (:class:`freshroute.heartbeats.NodeExpiry`), which a
store node embeds too. Standard library only: the client installs without pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from freshroute.declared import setting
from freshroute.heartbeats import NodeExpiry
from freshroute.routing.attempts import AttemptPolicy


@dataclass(frozen=True)
class TableBound:
    """A table's default freshness bound; ``None`` means no limit."""

    max_lag: int | None = None
    max_staleness_ms: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_lag", "max_staleness_ms"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be a whole number ≥ 0 or null, not {value!r}")


@dataclass(frozen=True)
class RoutingPolicy(NodeExpiry):
    """How one routing core (the router's, or a client's) waits, hedges, judges freshness and limits requests, and
    when it takes a node for dead (``node_expiry_ms``, as every reader of heartbeats does)."""

    request_timeout_ms: int = setting(2000, "overall deadline of one lookup", ge=1)
    attempt_timeout_ms: int = setting(500, "after this, a slow replica is joined by the next one", ge=1)
    scan_timeout_ms: int = setting(5000, "overall deadline of one scan page", ge=1)
    # Hedging: a second replica is asked when the first is slower than the recent hedge_quantile
    # of attempt latencies (clamped to [hedge_min_ms, attempt_timeout_ms]).
    hedge: bool = setting(True, "hedge slow lookups to a second replica")
    hedge_quantile: float = setting(0.95, "latency quantile that triggers a hedge", gt=0.0, lt=1.0)
    hedge_min_ms: float = setting(5.0, "never hedge sooner than this", ge=0.0)
    hedge_budget: float = setting(0.1, "at most this many hedges per lookup on average", ge=0.0, le=1.0)
    freshness_tolerance_offsets: int = setting(0, "lag differences up to this count as equally fresh", ge=0)
    freshness_tolerance_ms: int = setting(0, "staleness differences up to this count as equally fresh", ge=0)
    # A replica whose lag was seen longer ago than this is never excluded by that old view: the
    # store node enforces the bound itself.
    view_trust_ms: int = setting(1000, "older lag views never exclude a replica", ge=0)
    failure_backoff_ms: int = setting(1000, "a replica that just failed is tried last for this long", ge=0)
    batch_max_keys: int = setting(1000, "most keys in one batchGet", ge=1)
    scan_default_limit: int = setting(100, "scan page size when none is given", ge=1)
    scan_max_limit: int = setting(1000, "largest scan page", ge=1)
    max_windows: int = setting(10_000, "most windows one windows lookup may span (from..to over the window slide)",
                               ge=1, le=1_000_000)
    table_bounds: Mapping[str, TableBound] = setting(
        dict, 'per-table default bounds over the ones the pipeline registered, JSON: '
              '{"table": {"max_lag": n, "max_staleness_ms": n}}; a request\'s own bound overrides both')

    @classmethod
    def from_settings(cls, settings: Any) -> "RoutingPolicy":
        """The policy named by a settings object that embeds it (the router's)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    def attempt_policy(self) -> AttemptPolicy:
        return AttemptPolicy(self.attempt_timeout_ms, self.hedge, self.hedge_quantile, self.hedge_min_ms,
                             self.hedge_budget)


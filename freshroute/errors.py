"""One error hierarchy for every role; each leaf says how it travels over HTTP and gRPC.

Retryable errors mean "another replica, or the same one a little later, may answer";
fatal errors mean the request itself is wrong. One FastAPI handler and one gRPC abort
helper in the router translate them; nothing else maps errors.
"""

from __future__ import annotations

from typing import Any

import grpc


class FreshrouteError(Exception):
    """Root of every error freshroute raises on purpose."""

    code = "INTERNAL"
    http_status = 500
    grpc_status = grpc.StatusCode.INTERNAL
    retryable = False

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_body(self) -> dict[str, Any]:
        """The machine-readable error body shared by REST and gRPC trailers."""
        return {"error": {"code": self.code, "message": self.message, **self.details}}


class RetryableError(FreshrouteError):
    """Another replica, or a later attempt, may succeed."""

    retryable = True
    code = "UNAVAILABLE"
    http_status = 503
    grpc_status = grpc.StatusCode.UNAVAILABLE


class FatalError(FreshrouteError):
    """The request cannot succeed as asked; retrying elsewhere will not help."""


class InvalidArgument(FatalError):
    code = "INVALID_ARGUMENT"
    http_status = 400
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class TableNotFound(FatalError):
    code = "TABLE_NOT_FOUND"
    http_status = 404
    grpc_status = grpc.StatusCode.NOT_FOUND


class KeyNotFound(FatalError):
    code = "KEY_NOT_FOUND"
    http_status = 404
    grpc_status = grpc.StatusCode.NOT_FOUND


class ReplicaUnavailable(RetryableError):
    """A replica could not be reached, or does not (or no longer does) host the partition."""

    code = "REPLICA_UNAVAILABLE"


class ReplicaTooStale(RetryableError):
    """The replica is behind the caller's bound; a fresher replica may answer."""

    code = "REPLICA_TOO_STALE"


class NoReplicaWithinBound(RetryableError):
    """No live replica of the partition meets the caller's bound (details carry the freshest lag seen)."""

    code = "NO_REPLICA_WITHIN_BOUND"


class LookupTimeout(RetryableError):
    code = "TIMEOUT"
    http_status = 504
    grpc_status = grpc.StatusCode.DEADLINE_EXCEEDED


class StoreCorrupt(FatalError):
    """A local replica's RocksDB could not be opened or read; it must be rebuilt from the changelog."""

    code = "STORE_CORRUPT"


class ConfigError(FatalError):
    """A setting is missing or wrong; the message names the key."""

    code = "CONFIG_ERROR"

"""One error hierarchy for every role; each class has a code and the HTTP and gRPC statuses it travels with.

Retryable errors mean "another replica, or the same one a little later, may answer";
fatal errors mean the request itself is wrong. One FastAPI handler and one gRPC decorator
in the router translate them, each reading the statuses here (the gRPC one by its
name, so this package carries no transport library); nothing else maps errors.
"""

from __future__ import annotations

from typing import Any


class FreshrouteError(Exception):
    """Root of every error freshroute raises on purpose."""

    code = "INTERNAL"
    http_status = 500
    grpc_status = "INTERNAL"  # a grpc.StatusCode name
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
    grpc_status = "UNAVAILABLE"


class FatalError(FreshrouteError):
    """The request cannot succeed as asked; retrying elsewhere will not help."""


class InvalidArgument(FatalError):
    code = "INVALID_ARGUMENT"
    http_status = 400
    grpc_status = "INVALID_ARGUMENT"


class WindowedTable(InvalidArgument):
    """A key or scan lookup of a windowed table: its rows are windows, read through the windows lookups."""

    code = "WINDOWED_TABLE"


class NotWindowedTable(InvalidArgument):
    """A windows lookup of a table that has no windows."""

    code = "NOT_WINDOWED_TABLE"


class TableNotVersioned(InvalidArgument):
    """A read as of a time, or of a key's versions, on a table that keeps only its latest values."""

    code = "TABLE_NOT_VERSIONED"


class TableNotFound(FatalError):
    code = "TABLE_NOT_FOUND"
    http_status = 404
    grpc_status = "NOT_FOUND"


class TableVersionNotFound(TableNotFound):
    """A table version asked for by number that the table does not have, or no longer serves (failed, retired)."""

    code = "TABLE_VERSION_NOT_FOUND"


class NoPreviousTableVersion(FatalError):
    """A rollback of a table that serves the only version it keeps."""

    code = "NO_PREVIOUS_TABLE_VERSION"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class TableVersionNotReady(FatalError):
    """A switch to a version that has not caught up with its input yet (``--force`` switches all the same)."""

    code = "TABLE_VERSION_NOT_READY"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class TableDeployInProgress(FatalError):
    """A new table version while another is still building: one builds at a time (it takes the pipeline's spare
    task slots)."""

    code = "TABLE_DEPLOY_IN_PROGRESS"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class KeyNotFound(FatalError):
    code = "KEY_NOT_FOUND"
    http_status = 404
    grpc_status = "NOT_FOUND"


class VersionNotRetained(FatalError):
    """A read as of a time before the versioned table's history: its versions then have expired."""

    code = "VERSION_NOT_RETAINED"
    http_status = 404
    grpc_status = "NOT_FOUND"


class ReplicaUnavailable(RetryableError):
    """A replica could not be reached, or does not (or no longer does) host the partition."""

    code = "REPLICA_UNAVAILABLE"


class NoReplicaWithinBound(RetryableError):
    """No live replica of the partition meets the caller's bound (details carry the freshest lag seen)."""

    code = "NO_REPLICA_WITHIN_BOUND"


class NotYetVisible(RetryableError):
    """A lookup ``after`` a write token found no replica whose answer includes those events within its wait
    (details say how far the table is behind the token)."""

    code = "NOT_YET_VISIBLE"


class WriteRejected(FatalError):
    """A lookup ``after`` a write token waits for an event the pipeline rejected as bad input: it will never be in
    the table (details carry the pipeline's reason)."""

    code = "WRITE_REJECTED"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class LookupTimeout(RetryableError):
    code = "TIMEOUT"
    http_status = 504
    grpc_status = "DEADLINE_EXCEEDED"


class StoreCorrupt(FatalError):
    """A local replica's RocksDB could not be opened or read; it must be rebuilt from the changelog."""

    code = "STORE_CORRUPT"


class Unauthenticated(FatalError):
    """No credentials, or credentials no principal holds (never echoed back)."""

    code = "UNAUTHENTICATED"
    http_status = 401
    grpc_status = "UNAUTHENTICATED"


class PermissionDenied(FatalError):
    """The principal may not read this (the same answer whether the table exists or not)."""

    code = "PERMISSION_DENIED"
    http_status = 403
    grpc_status = "PERMISSION_DENIED"


class RateLimited(RetryableError):
    """The principal is over its rate; ``retry_after_s`` says when a read will be admitted again."""

    code = "RATE_LIMITED"
    http_status = 429
    grpc_status = "RESOURCE_EXHAUSTED"


class ConfigError(FatalError):
    """A setting is missing or wrong; the message names the key."""

    code = "CONFIG_ERROR"


class ClientClosed(FatalError):
    """A client was used after it was closed."""

    code = "CLIENT_CLOSED"


class ForeignError(FreshrouteError):
    """An error known only by its code and HTTP status: one this build has no class for (a newer peer's), or a web
    framework's (an unknown route, a method not allowed). Made by :func:`foreign`."""

    def __init__(self, code: str, http_status: int, message: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.code = code
        self.http_status = http_status
        self.grpc_status = {404: "NOT_FOUND", 405: "UNIMPLEMENTED"}.get(http_status, self.grpc_status)


class ForeignRetryableError(ForeignError, RetryableError):
    """A foreign error with a status our retryable errors travel with (502, 503, 504)."""


def foreign(code: str, http_status: int, message: str, **details: Any) -> ForeignError:
    """The error a code this build does not know stands for, retryable as its HTTP status says."""
    cls = ForeignRetryableError if http_status in (502, 503, 504) else ForeignError
    return cls(code, http_status, message, **details)


def _leaves(cls: type[FreshrouteError]) -> list[type[FreshrouteError]]:
    return [cls, *(leaf for sub in cls.__subclasses__() for leaf in _leaves(sub))]


def from_body(body: Any, http_status: int = 500) -> FreshrouteError:
    """The typed error an error body (REST JSON, or a gRPC trailer) stands for; unknown codes keep their status."""
    doc = body.get("error") if isinstance(body, dict) else None
    if not isinstance(doc, dict):
        return FreshrouteError(f"unexpected answer (HTTP {http_status})")
    details = {k: v for k, v in doc.items() if k not in ("code", "message")}
    code, message = str(doc.get("code", "INTERNAL")), str(doc.get("message", ""))
    cls = next((c for c in _leaves(FreshrouteError)
                if c.code == code and c is not RetryableError and not issubclass(c, ForeignError)), None)
    if cls is None:
        return foreign(code, http_status, message, **details)
    return cls(message, **details)

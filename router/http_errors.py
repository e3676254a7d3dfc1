"""The one translation of errors to HTTP: status and JSON body from the error's class, and the headers it calls for."""

from __future__ import annotations

import logging

import orjson
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from freshroute.errors import FreshrouteError, InvalidArgument, RateLimited, Unauthenticated, foreign
from router.auth import WWW_AUTHENTICATE

log = logging.getLogger("freshroute.router.rest")


def as_freshroute_error(exc: BaseException) -> FreshrouteError:
    """Any exception as the project's error: ours as is, framework ones mapped, the rest INTERNAL."""
    if isinstance(exc, FreshrouteError):
        return exc
    if isinstance(exc, RequestValidationError):
        return InvalidArgument("invalid request", errors=[
            {"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", "")} for e in exc.errors()])
    if isinstance(exc, StarletteHTTPException):
        return foreign({404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR"),
                       exc.status_code, str(exc.detail))
    log.error("unexpected error serving a request", exc_info=exc)
    return FreshrouteError("internal error")


def error_response(exc: BaseException) -> tuple[int, bytes]:
    """(HTTP status, JSON body) of a request that failed with ``exc``."""
    err = as_freshroute_error(exc)
    return err.http_status, orjson.dumps(err.to_body())


def error_headers(exc: BaseException) -> dict[str, str]:
    """Headers an error's status calls for: how to authenticate (401), when to come back (429)."""
    if isinstance(exc, Unauthenticated):
        return {"www-authenticate": WWW_AUTHENTICATE}
    if isinstance(exc, RateLimited):
        return {"retry-after": str(exc.details.get("retry_after_s", 1))}
    return {}

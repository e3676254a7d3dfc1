"""Errors as the public gRPC API answers them: the status code comes from the error's class, and the trailing
metadata ``freshroute-error`` carries the same JSON body REST returns.

Both ways of serving a call translate here — the Router servicer through :func:`answers_errors` (every error
leaves through :func:`abort`), and the gRPC front's ``Router.Get`` through :func:`error_status`.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from typing import Any, AsyncIterator, Callable, NoReturn

import grpc

from freshroute.errors import FreshrouteError

log = logging.getLogger("freshroute.router.grpc")

ERROR_TRAILER = "freshroute-error"


def grpc_status(exc: FreshrouteError) -> grpc.StatusCode:
    """The gRPC status an error travels with (its class names it)."""
    return grpc.StatusCode[exc.grpc_status]


def error_status(exc: BaseException) -> tuple[grpc.StatusCode, str, str]:
    """The single translation of errors to gRPC: (status from the error class, message, JSON body for the trailer)."""
    if not isinstance(exc, FreshrouteError):
        log.error("unexpected error serving a gRPC call", exc_info=exc)
        exc = FreshrouteError("internal error")
    # Metadata values must be ASCII; the JSON body escapes anything else.
    body = json.dumps(exc.to_body(), ensure_ascii=True, separators=(",", ":"), default=str)
    return grpc_status(exc), exc.message, body


def answers_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """A Router method whose every error leaves through :func:`abort` (a unary one or a stream)."""
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except Exception as e:  # noqa: BLE001 — every error leaves through abort()
                await abort(context, e)
        return stream

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except Exception as e:  # noqa: BLE001 — every error leaves through abort()
            await abort(context, e)
    return unary


async def abort(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """Ends a grpc.aio call with ``exc`` as :func:`error_status` translates it."""
    status, message, body = error_status(exc)
    await context.abort(status, message, trailing_metadata=((ERROR_TRAILER, body),))
    raise AssertionError("context.abort returned")  # pragma: no cover — abort always raises

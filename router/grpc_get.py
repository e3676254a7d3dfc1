"""``Router.Get``, answered the same whichever server carries it: the grpc.aio servicer
(:class:`router.grpc_servicer.RouterServicer`), or the gRPC front in place (:class:`RouterGetCalls`, what the
front knows as :class:`router.transports.GetCalls`).
"""

from __future__ import annotations

from typing import Any

import grpc

from freshroute.bound import NO_BOUND, Bound
from freshroute.routing.history import parse_time
from freshroute.routing.results import key_not_found
from proto import router_pb2
from router.auth import Guard
from router.bound_message import bound_of_message
from router.grpc_errors import ERROR_TRAILER, error_status
from router.grpc_messages import as_of_response, get_response, input_lag_message
from router.routing import Router


def parse_request_bound(router: Router, request: Any) -> Bound:
    """The request's bound (counted as an invalid lookup if malformed, as on REST)."""
    return router.parsed(bound_of_message, request.bound) if request.HasField("bound") else NO_BOUND


async def answer_get(router: Router, request: router_pb2.GetRequest) -> router_pb2.GetResponse:
    """``Router.Get``, whichever server carries it; errors are raised, for the caller to translate."""
    if request.bound.HasField("as_of"):
        return await _answer_as_of(router, request)
    bound = parse_request_bound(router, request)
    table = router.resolved(request.table, bound)  # the version read: its answer, input lag and format
    result = await router.get(table, request.key, bound)
    if not result.found:
        raise key_not_found(result, router.input_lag(table))
    response = get_response(result, request.typed_values, router.value_format(table))
    lag = input_lag_message(router, table)
    if lag is not None:
        response.input_lag.CopyFrom(lag)
    return response


async def _answer_as_of(router: Router, request: router_pb2.GetRequest) -> router_pb2.GetResponse:
    """A Get with ``Bound.as_of``: the version valid then (a versioned table's)."""
    as_of = router.parsed(parse_time, "as_of", request.bound.as_of)
    bound = parse_request_bound(router, request)
    table = router.resolved(request.table, bound)
    answer = await router.history.as_of(table, request.key, as_of, bound)
    if answer.version is None or not answer.lookup.found:
        raise answer.not_found(router.input_lag(table))
    response = as_of_response(answer, request.typed_values, router.value_format(table))
    lag = input_lag_message(router, table)
    if lag is not None:
        response.input_lag.CopyFrom(lag)
    return response


class RouterGetCalls:
    """``Router.Get`` for the gRPC front: the servicer's answer and error translation, without grpc.aio."""

    def __init__(self, router: Router, guard: Guard | None = None) -> None:
        self._router = router
        self._guard = guard

    async def get(self, request: router_pb2.GetRequest, authorization: bytes | None,
                  subject: str | None = None) -> router_pb2.GetResponse:
        if self._guard is not None:
            await self._guard.table(authorization, request.table, subject)
        return await answer_get(self._router, request)

    def status(self, exc: BaseException) -> tuple[grpc.StatusCode, str, tuple[tuple[bytes, bytes], ...]]:
        code, message, body = error_status(exc)
        return code, message, ((ERROR_TRAILER.encode(), body.encode()),)

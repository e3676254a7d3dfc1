"""The REST app of the router (FastAPI), documented in OpenAPI: every resource's routes, one error handler, one
admission.

Every route is a FastAPI route, so ``/docs`` and ``/openapi.json`` describe them all. Each request is admitted
once, by :class:`Admission`, from the route :mod:`router.rest.routes` parses from its raw path. Results become
bodies by their own ``to_dict`` (:mod:`freshroute.routing.results`), errors by :mod:`router.http_errors`.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from freshroute.errors import FreshrouteError
from router.auth import Guard
from router.http_errors import error_headers, error_response
from router.openapi import HTTP_REFUSALS
from router.rest import cluster, console, keys, ops, scans, tables
from router.rest.routes import JSON, KeyHandlers, admit, route_of
from router.routing import Router
from router.settings import RouterSettings


async def handle_error(request: Request, exc: Exception) -> Response:
    """The single exception handler of the app (every error class is routed here)."""
    status, body = error_response(exc)
    # A 405 says which methods the resource has (RFC 9110 §15.5.6); Starlette names them in Allow.
    headers = exc.headers if isinstance(exc, StarletteHTTPException) else error_headers(exc)
    return Response(body, status, headers=headers or None, media_type=JSON)


class Admission:
    """ASGI middleware: parses each request's raw path once into its route (kept in ``scope["state"]["route"]``)
    and, with a guard, admits the caller for it — its principal in ``scope["state"]["principal"]`` — or answers
    the refusal."""

    def __init__(self, app: ASGIApp, guard: Guard | None) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            route = route_of(scope.get("raw_path") or scope["path"].encode())
            state = scope.setdefault("state", {})
            state["route"] = route
            if self.guard is not None:
                headers = scope.get("headers", ())
                authorization = next((v for k, v in headers if k == b"authorization"), None)
                # The client certificate's subject, as the ASGI TLS extension carries it.
                subject = ((scope.get("extensions") or {}).get("tls") or {}).get("client_cert_name")
                try:
                    state["principal"] = await admit(self.guard, route, authorization, subject)
                except Exception as e:  # noqa: BLE001 — the same translation as every other route
                    status, body = error_response(e)
                    await send({"type": "http.response.start", "status": status, "headers": [
                        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                        *((k.encode(), v.encode()) for k, v in error_headers(e).items())]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)


def create_app(settings: RouterSettings, router: Router, *, guard: Guard | None = None) -> FastAPI:
    """The REST app over ``router``, which its process has wired and runs (``router.main``)."""
    app = FastAPI(title="freshroute router", version="1.0", responses=HTTP_REFUSALS,
                  description="Key lookups on stream-materialized tables, served by the freshest replica "
                              "within the caller's staleness bound.")
    for exc_class in (FreshrouteError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_class, handle_error)
    if guard is None and settings.auth_file is not None:
        guard = Guard(settings.auth_file)
    app.add_middleware(Admission, guard=guard)
    app.state.router = router
    # Each resource adds its routes to the app itself: FastAPI matches an included router's routes through a layer of
    # its own on every request, which cost about 22 µs a request.
    tables.routes(app, router)
    keys.routes(app, settings, KeyHandlers(router))
    scans.routes(app, settings, router)
    cluster.routes(app, router)
    console.routes(app)
    ops.routes(app, router)
    return app

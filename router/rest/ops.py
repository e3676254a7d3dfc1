"""What operators and load balancers ask: whether the process is up and ready, and its metrics."""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from router.rest.routes import json_response
from router.routing import Router


def routes(app: FastAPI, router: Router) -> None:
    get = partial(app.get, tags=["ops"])

    @get("/healthz", summary="The process is up")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @get("/readyz", summary="Ready once routing metadata with tables is loaded")
    async def readyz() -> Response:
        snap = router.metadata.current
        if router.ready:
            return json_response({"status": "ready", "tables": len(snap.tables), "nodes": len(snap.nodes)})
        reason = ("stopping" if router.stopping else "no routing metadata loaded yet" if not snap.loaded
                  else "no tables registered yet")
        return json_response({"status": "not ready", "reason": reason}, 503)

    @get("/metrics", summary="Prometheus metrics", response_class=Response,
         responses={200: {"description": "the Prometheus text exposition format",
                          "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}})
    async def metrics() -> Response:
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

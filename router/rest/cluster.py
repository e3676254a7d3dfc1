"""The cluster as operators and the console see it: nodes, assignment and every replica's lag."""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI, Request
from fastapi.responses import Response

from freshroute.bound import MAX_LIMIT
from router.console.views import GRID_DEFAULT_LIMIT, GRID_MAX_LIMIT, ClusterViews
from router.openapi import ErrorBody
from router.rest.routes import JSON, json_response, query_of
from router.routing import Router


def routes(app: FastAPI, router: Router) -> None:
    get = partial(app.get, tags=["cluster"])
    views = ClusterViews(router)

    @get("/v1/cluster", summary="Nodes, liveness, assignment and per-replica lag")
    async def cluster() -> Response:
        return json_response(router.views.cluster().to_dict())

    @get("/v1/cluster/summary",
         summary="The cluster per node and per table: replica counts by kind, worst lag, restores in progress")
    async def cluster_summary() -> Response:
        return Response(await views.summary(), media_type=JSON)

    @get("/v1/cluster/tables/{table}",
         summary="One table's partitions, each with every replica's role, state and lag, a page at a time",
         responses={404: {"model": ErrorBody}, 400: {"model": ErrorBody}},
         openapi_extra={"parameters": [
             {"name": "from", "in": "query", "required": False,
              "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
              "description": "first partition (default 0)"},
             {"name": "limit", "in": "query", "required": False,
              "schema": {"type": "integer", "minimum": 0, "maximum": GRID_MAX_LIMIT},
              "description": f"partitions in the page (0 or absent: {GRID_DEFAULT_LIMIT})"}]})
    async def cluster_table(table: str, request: Request) -> Response:
        return json_response(views.table_replicas(table, query_of(request.scope.get("query_string", b""))))

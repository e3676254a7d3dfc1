"""The tables a caller may read."""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI, Request
from fastapi.responses import Response

from router.openapi import TablesResponse
from router.rest.routes import json_response
from router.routing import Router


def routes(app: FastAPI, router: Router) -> None:
    get = partial(app.get, tags=["tables"])

    @get("/v1/tables", summary="Tables with partition count, replicas and schema, and each one's versions: "
                               "state, input lag and, building, progress and when it will have caught up",
         responses={200: {"model": TablesResponse}})
    async def list_tables(request: Request) -> Response:
        principal = request.scope["state"].get("principal")
        return json_response({"tables": [t.to_dict() for t in router.views.list_tables()
                                         if principal is None or principal.may_read(t.spec.name)]})

"""The console's files: a page that reads the REST API with the token its user gives it."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.console import HEADERS, assets


def routes() -> APIRouter:
    api = APIRouter(include_in_schema=False)
    files = assets()

    @api.get("/console")
    @api.get("/console/{name}")
    async def console(name: str = "") -> Response:
        asset = files.get(name)
        if asset is None:
            raise StarletteHTTPException(404, f"no console file {name!r}")
        return Response(asset[0], media_type=asset[1], headers=HEADERS)

    return api

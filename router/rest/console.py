"""The console's files: a page that reads the REST API with the token its user gives it."""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.console import HEADERS, assets


def routes(app: FastAPI) -> None:
    get = partial(app.get, include_in_schema=False)
    files = assets()

    @get("/console")
    @get("/console/{name}")
    async def console(name: str = "") -> Response:
        asset = files.get(name)
        if asset is None:
            raise StarletteHTTPException(404, f"no console file {name!r}")
        return Response(asset[0], media_type=asset[1], headers=HEADERS)

"""The operator's console: a page served at ``/console`` on the router's REST port (static files in ``static/``,
nothing fetched from elsewhere) and the two summaries it reads besides the public API (:mod:`router.console.views`)."""

from __future__ import annotations

from importlib.resources import files

import orjson

from freshroute.bound import PARAMETERS

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}

# The page runs only its own files: no inline script, nothing from another origin, not framed by another site.
HEADERS = {"content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
           "x-content-type-options": "nosniff", "cache-control": "no-cache", "referrer-policy": "no-referrer"}


def assets() -> dict[str, tuple[bytes, str]]:
    """The console's files by name (``""`` is the page), read once when the app is made."""
    out: dict[str, tuple[bytes, str]] = {}
    for f in files(__name__).joinpath("static").iterdir():
        suffix = "." + f.name.rpartition(".")[2]
        if f.is_file() and suffix in _TYPES:
            out[f.name] = (f.read_bytes(), _TYPES[suffix])
    out[""] = out["index.html"]
    # The lookup form's bound fields, as the bound defines its parameters: a new one appears without a page change.
    out["bound.json"] = (orjson.dumps([{"name": name, "doc": p.doc, "numeric": p.schema.get("type") == "integer"}
                                       for name, p in PARAMETERS.items()]), "application/json")
    return out

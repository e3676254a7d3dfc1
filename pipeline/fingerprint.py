"""A table definition's fingerprint: what the table computes, so that a pipeline started with a changed definition
can build a new version of the table beside the served one, and one started with the same definition builds nothing.

In it: the key, the source as the table reads it, the window, deletes, history, the mode and the computation — the
SQL, or the function's code as Python parses it (comments and layout aside). Not in it: what changes how a table is
run or served but not its rows (standby replicas, the trigger, the query it shares). In it too: how this release lays
out a query of the table's mode (:data:`QUERY_LAYOUTS`), so that a release which computes tables otherwise builds each
again as a new version beside the one served, instead of resuming state it cannot read. Text is compared line by line,
each stripped: a difference the fingerprint cannot tell apart costs a rebuild, never a table quietly left as it was.
Code a function calls in another module is beyond it.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import inspect
import textwrap
from typing import Any, Callable

import orjson

from pipeline.tables import MICROBATCH, REALTIME, Source, Table

# How this release lays out the state and output of a query in each mode. A release that changes them raises the
# number: every table of that mode then gets a new version, built beside the one served (pipeline.versions).
QUERY_LAYOUTS = {REALTIME: 1, MICROBATCH: 1}


def fingerprint(t: Table, source: Source, mode: str) -> str:
    """The fingerprint of table ``t`` read from ``source`` in pipeline mode ``mode`` (hex, 16 digits)."""
    doc = {
        "key": t.key,
        "source": {"schema": _lines(source.schema), "topic": source.topic, "on_invalid": source.on_invalid,
                   "max_clock_skew_ms": source.max_clock_skew_ms, "max_record_bytes": source.max_record_bytes},
        "window": dataclasses.asdict(t.window) if t.window is not None else None,
        "delete_when": _lines(t.delete_when),
        "stale_keys": t.stale_keys,
        "history_retention_ms": t.history_retention_ms,
        "mode": mode,
        "sql": _lines(t.sql),
        "build": _code(t.build),
    }
    if t.versions_from != "beginning":  # a version refused for its expired input is built once the table says so
        doc["versions_from"] = t.versions_from
    layout = QUERY_LAYOUTS.get(mode, 1)
    if layout > 1:  # the first layouts are no field: fingerprints made before releases counted them stay as they were
        doc["layout"] = layout
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _lines(text: str | None) -> str | None:
    return None if text is None else "\n".join(s for s in (line.strip() for line in text.splitlines()) if s)


def _code(build: Callable[..., Any] | None) -> str | None:
    """A function's code as its syntax tree (its decorators aside), or its compiled code where the source is not
    to be had."""
    if build is None:
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(build)))
    except (OSError, TypeError, SyntaxError):
        code = build.__code__
        return repr((code.co_code, code.co_consts, code.co_names))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.decorator_list = []
    return ast.dump(tree)

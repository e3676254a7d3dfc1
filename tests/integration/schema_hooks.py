"""How schemathesis makes valid opaque tokens and ranges (loaded through SCHEMATHESIS_HOOKS by test_rest_schema).

A position or page token is valid only for the table it came from, so the tokens are made
for the table the test deployment serves; on any other (absent) table the answer is 404.
The windows routes name the deployment's windowed table instead, and their time ranges are
kept to what OpenAPI cannot say: ``from <= to``, at most ``max_windows`` windows, and a page
token of the same range.
"""

from __future__ import annotations

import os
import time

import schemathesis
from hypothesis import strategies as st

from freshroute.position import Position
from freshroute.write_tokens.token import WriteToken
from freshroute.routing.results import encode_page_token
from freshroute.position import POSITION_FORMAT
from freshroute.write_tokens.token import WRITE_TOKEN_FORMAT
from router.openapi import PAGE_TOKEN_FORMAT

TABLE = os.environ["FRESHROUTE_SCHEMA_TABLE"]
WINDOWED = os.environ["FRESHROUTE_SCHEMA_WINDOWED"]
WINDOW_MS = 10_000  # the windowed table's slide
MAX_WINDOWS = 10_000  # the router's default max_windows
KEYS = int(os.environ["FRESHROUTE_SCHEMA_KEYS"])  # the table holds sensor-0 … sensor-{KEYS-1}
HISTORY_MS = int(os.environ["FRESHROUTE_SCHEMA_HISTORY_MS"])  # the table keeps its versions this long

schemathesis.openapi.format(POSITION_FORMAT, st.dictionaries(
    st.integers(0, 1023), st.integers(0, 1 << 62), max_size=8).map(lambda offsets: Position(TABLE, offsets).encode()))
# Tokens of what a session read of the table, at positions every replica has: answered at once, as most requests
# must be (the refusals of tokens naming other topics are the unit tests').
schemathesis.openapi.format(WRITE_TOKEN_FORMAT, st.dictionaries(st.integers(0, 3), st.integers(0, 5), min_size=1,
                                                                max_size=4).map(
    lambda offsets: WriteToken({}, {TABLE: offsets}, 0).encode()))
schemathesis.openapi.format(PAGE_TOKEN_FORMAT, st.binary(max_size=64).map(lambda after: encode_page_token(TABLE, after)))


@schemathesis.hook
def flatmap_path_parameters(context, path_parameters):
    """As generated, or naming the deployment's table (and one of its keys), so requests reach the routing."""
    if not path_parameters or "table" not in path_parameters:
        return st.just(path_parameters)
    windows = context.operation is not None and context.operation.path.endswith("/windows")
    known_table = {**path_parameters, "table": WINDOWED if windows else TABLE}
    # A windows route's other checks (a range, a bound) are reached only through its table: it is named always.
    variants = [st.just(known_table)] if windows else [st.just(path_parameters), st.just(known_table)]
    if "key" in path_parameters:
        variants.append(st.integers(0, KEYS - 1).map(lambda i: {**known_table, "key": f"sensor-{i}"}))
    return st.one_of(variants)


def _within_history(query: dict) -> dict:
    """``as_of``, ``from``, ``to`` and ``page_token`` as times the table keeps (from no later than to): what OpenAPI
    cannot say, as the table's history ends now. ``as_of`` is from now on, where every key has its version (the
    deployment wrote them moments ago): an earlier one would mostly find a key absent."""
    now = int(time.time() * 1000)
    times = {k: now - HISTORY_MS + 60_000 + v % (HISTORY_MS + 3_600_000) for k in ("from", "to", "page_token")
             if (v := _millis(query.get(k))) is not None}
    if (v := _millis(query.get("as_of"))) is not None:
        times["as_of"] = now + v % 3_600_000
    if "from" in times and "to" in times:
        times["from"], times["to"] = min(times["from"], times["to"]), max(times["from"], times["to"])
    return {**query, **times}


def _millis(value) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 19:
        return int(value)
    return None


@schemathesis.hook
def map_query(context, query):
    """A windows route's range as the router accepts it, when both ends are whole milliseconds; a versioned read's
    times within the week its table keeps."""
    if context.operation is None or not query:
        return query
    if not context.operation.path.endswith("/windows"):
        return _within_history(query)
    frm, to = _millis(query.get("from")), _millis(query.get("to"))
    if frm is None or to is None:
        return query
    frm = min(frm, to)
    to = min(to, frm + MAX_WINDOWS * WINDOW_MS)
    query = {**query, "from": frm, "to": to}
    if "page_token" in query:
        query["page_token"] = encode_page_token(WINDOWED, b"sensor-1", f"{frm}-{to}")
    return query

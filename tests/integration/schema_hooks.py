"""How schemathesis makes valid opaque tokens (loaded through SCHEMATHESIS_HOOKS by test_rest_schema).

A position or page token is valid only for the table it came from, so the tokens are made
for the table the test deployment serves; on any other (absent) table the answer is 404.
"""

from __future__ import annotations

import os

import schemathesis
from hypothesis import strategies as st

from freshroute.position import Position
from freshroute.routing.results import encode_page_token
from router.openapi import PAGE_TOKEN_FORMAT, POSITION_FORMAT

TABLE = os.environ["FRESHROUTE_SCHEMA_TABLE"]
KEYS = int(os.environ["FRESHROUTE_SCHEMA_KEYS"])  # the table holds sensor-0 … sensor-{KEYS-1}

schemathesis.openapi.format(POSITION_FORMAT, st.dictionaries(
    st.integers(0, 1023), st.integers(0, 1 << 62), max_size=8).map(lambda offsets: Position(TABLE, offsets).encode()))
schemathesis.openapi.format(PAGE_TOKEN_FORMAT, st.binary(max_size=64).map(lambda after: encode_page_token(TABLE, after)))


@schemathesis.hook
def flatmap_path_parameters(context, path_parameters):
    """As generated, or naming the deployment's table (and one of its keys), so requests reach the routing."""
    if not path_parameters or "table" not in path_parameters:
        return st.just(path_parameters)
    known_table = {**path_parameters, "table": TABLE}
    variants = [st.just(path_parameters), st.just(known_table)]
    if "key" in path_parameters:
        variants.append(st.integers(0, KEYS - 1).map(lambda i: {**known_table, "key": f"sensor-{i}"}))
    return st.one_of(variants)

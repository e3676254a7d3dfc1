"""Models that document the REST surface in OpenAPI.

They describe what the handlers write; the handlers themselves build responses with
orjson and never validate through these models, which keeps the lookup path lean.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, create_model

from freshroute.bound import MAX_LIMIT, PARAMETERS, Parameter
from router.transports.http1 import MAX_HEAD, MAX_REQUEST_LINE_URL

PAGE_TOKEN_FORMAT = "freshroute-page-token"  # tokens are opaque; their formats are named for tools


class ServedBy(BaseModel):
    node: str
    role: str = Field(description='"active" or "standby"')


class Lag(BaseModel):
    offsets: int | None = Field(description="offsets behind the changelog end; null while the serving replica has "
                                            "not learnt the end offset yet (unknown, never 0)")
    ms: int = Field(description="ms since the serving replica was caught up")


class InputLag(BaseModel):
    records: int = Field(description="input records the pipeline has not processed yet (0: it keeps up)")
    ms: int = Field(description="ms since the pipeline last was caught up with its input (0: it keeps up)")


_INPUT_LAG_HELP = ("how far the table's changelog is behind its input (the pipeline's lag), beside `lag`, the serving "
                   "replica's lag behind the changelog")


class KeyValue(BaseModel):
    table: str
    table_version: int = Field(description="the version of the table that answered: the one served, or the one "
                                           "asked for with version")
    key: str
    value: Any = Field(None, description="the table row, as the changelog holds it (absent for a table of bytes "
                                         "values: value_b64)")
    value_b64: str | None = Field(None, description="a table of bytes values (a topic served with --value-format "
                                                    "bytes): the value, base64")
    partition: int
    served_by: ServedBy
    lag: Lag
    position: str = Field(description="pass back as min_position for monotonic reads")
    input_lag: InputLag = Field(description=_INPUT_LAG_HELP)
    as_of: int | None = Field(None, description="a versioned table's lookup `as_of`: the time asked for, ms")
    valid_from: int | None = Field(None, description="as_of: when the value answered became the key's, ms")
    valid_to: int | None = Field(None, description="as_of: when it stopped being the key's, ms; null: it still is")
    final: bool | None = Field(None, description="as_of: true when no change can reach the answer any more (the "
                                                 "replica had every change up to as_of + the table's grace)")


class ErrorDetail(BaseModel, extra="allow"):
    code: str = Field(description="stable code, e.g. KEY_NOT_FOUND, TABLE_NOT_FOUND, NO_REPLICA_WITHIN_BOUND")
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class DefaultBound(BaseModel):
    max_lag: int | None = Field(description="the table's default max_lag (null: none)")
    max_staleness_ms: int | None = Field(description="the table's default max_staleness_ms (null: none)")


class TablePipeline(BaseModel):
    alive: bool = Field(description="a pipeline is running the table's query (it speaks once a second)")
    last_progress_ms: int | None = Field(description="when its last micro-batch was seen; null: never")


class TableWindow(BaseModel):
    size_ms: int
    slide_ms: int
    grace_ms: int
    retention_ms: int


class TableVersionInfo(BaseModel):
    version: int
    state: str = Field(description='"building", "serving", "previous", "failed" or "retired"')
    fingerprint: str = Field(description="of the definition it computes")
    created_ms: int
    switched_ms: int | None = Field(None, description="when it last began to be served")
    retire_at_ms: int | None = Field(None, description="a previous version's: when it is retired")
    reason: str | None = Field(None, description="a failed version's: why")
    definition: str | None = Field(None, description="the digest of the tables file it was defined in")
    input_lag: InputLag | None = Field(None, description="how far its changelog is behind its input (a building, "
                                                         "serving or previous version placed on the store nodes)")
    progress: float | None = Field(None, ge=0, le=1, description=(
        "a building version's: the share of its input it has consumed, 0..1 (summed over the input's partitions, "
        "what it read past the log start over that and the records it has yet to read); null: unknown"))
    caught_up_in_ms: int | None = Field(None, ge=0, description=(
        "a building version's: ms until its input lag is within switch_lag records, at the rate the lag has been "
        "falling; 0: it is; null: unknown (too few samples, the lag not falling, the pipeline silent)"))


class TableInfo(BaseModel):
    name: str
    topic: str = Field(description="the changelog topic its replicas are restored from (its served version's)")
    partitions: int
    replicas: int
    standby_replicas: int
    key_column: str
    schema_: dict[str, str] = Field(alias="schema", description="column → type of its values")
    default_bound: DefaultBound
    input_lag: InputLag = Field(description="how far its served version's changelog is behind its input")
    pipeline: TablePipeline
    key_format: str
    value_format: str
    origin: str = Field(description='"pipeline", or "topic": a compacted topic served as it is')
    pipeline_mode: str | None = Field(description='"realtime" or "microbatch"; null: a topic served as it is')
    query: str | None = Field(description="the pipeline's streaming query that computes it; null: a topic's")
    history_retention_ms: int
    version: int = Field(description="the version served")
    versions: list[TableVersionInfo] = Field(description="every version the pipeline keeps a record of, oldest "
                                                         "first; none for a topic served as it is")
    window: TableWindow | None = Field(None, description="a windowed table's windows")


class TablesResponse(BaseModel):
    tables: list[TableInfo]


def _body_field(parameter: Parameter) -> Any:
    """A bound parameter as a field of a JSON body: its schema, nullable."""
    schema = dict(parameter.schema)
    if schema.pop("type") == "integer":
        return (int | None, Field(default=None, ge=schema["minimum"], le=schema["maximum"], description=parameter.doc))
    return (str | None, Field(default=None, description=parameter.doc, json_schema_extra=schema))


BatchGetRequest = create_model(
    "BatchGetRequest",
    keys=(list[str], Field(description="at most batch_max_keys (default 1000) keys")),
    **{name: _body_field(parameter) for name, parameter in PARAMETERS.items()},
    as_of=(int | None, Field(default=None, ge=0, le=MAX_LIMIT,
                             description="a versioned table: every key's value at this time (ms since the epoch; "
                                         "RFC 3339 text is read too); each item says valid_from, valid_to, final")))


class BatchItem(BaseModel):
    key: str
    found: bool
    value: Any = None
    value_b64: str | None = Field(None, description="as in a lookup's answer")
    partition: int | None = None
    served_by: ServedBy | None = None
    lag: Lag | None = None
    position: str | None = None
    error: ErrorDetail | None = None
    valid_from: int | None = Field(None, description="as_of: when the version answered became the key's, ms")
    valid_to: int | None = Field(None, description="as_of: when it stopped being the key's, ms; null: it still is")
    final: bool | None = Field(None, description="as_of: no change can reach this answer any more")


class BatchGetResponse(BaseModel):
    table: str
    table_version: int = Field(description="the version of the table that answered: the one served, or the one "
                                           "asked for with version")
    results: list[BatchItem]
    position: str | None = Field(default=None, description="the latest position of every partition read")
    input_lag: InputLag = Field(description=_INPUT_LAG_HELP)


class ScanItem(BaseModel):
    key: str
    value: Any = None
    value_b64: str | None = Field(None, description="as in a lookup's answer")
    partition: int
    valid_from: int | None = Field(None, description="as_of: when the value became the key's, ms")
    valid_to: int | None = Field(None, description="as_of: when it stopped being the key's, ms; null: it still is")


class ScanPartition(BaseModel):
    partition: int
    served_by: ServedBy
    lag: Lag
    position: str


class ScanResponse(BaseModel):
    table: str
    table_version: int = Field(description="the version of the table that answered: the one served, or the one "
                                           "asked for with version")
    items: list[ScanItem]
    next_page_token: str | None
    partitions: list[ScanPartition]
    input_lag: InputLag = Field(description=_INPUT_LAG_HELP)
    as_of: int | None = Field(None, description="a versioned table's scan `as_of`: the time asked for, ms")
    final: bool | None = Field(None, description="as_of: true when every partition's replica had every change up to "
                                                 "as_of when it answered")


class Window(BaseModel):
    start: int = Field(description="window start, ms since the epoch (inclusive)")
    end: int = Field(description="window end, ms since the epoch (exclusive)")
    value: Any = Field(description="the window's row, as the changelog holds it")
    final: bool = Field(description="true once the watermark has passed end + grace: no late record can revise it")


class WindowsResponse(BaseModel):
    table: str
    table_version: int = Field(description="the version of the table that answered: the one served, or the one "
                                           "asked for with version")
    key: str
    windows: list[Window] = Field(description="the key's windows starting in [from, to), in start order")
    partition: int
    served_by: ServedBy
    lag: Lag
    position: str = Field(description="pass back as min_position for monotonic reads")
    watermark_ms: int | None = Field(description="the partition's watermark (event time − grace) as of the answer")
    input_lag: InputLag = Field(description=_INPUT_LAG_HELP)


class Version(BaseModel):
    value: Any = Field(None, description="the key's value over [valid_from, valid_to); null for a deleted version")
    value_b64: str | None = Field(None, description="a table of bytes values: the value, base64")
    valid_from: int = Field(description="when this version became the key's, ms since the epoch")
    valid_to: int | None = Field(description="when the next one did, ms; null: it is the latest")
    deleted: bool = Field(description="the key was absent over this interval (a delete)")


class VersionsResponse(BaseModel):
    table: str
    table_version: int = Field(description="the version of the table that answered: the one served, or the one "
                                           "asked for with version")
    key: str
    from_: int = Field(alias="from", description="versions valid at some time in [from, to), ms (from: at least the "
                                                 "oldest time the table's history keeps)")
    to: int
    versions: list[Version] = Field(description="newest first")
    next_page_token: str | None = Field(description="pass as page_token for older versions; null: no more")
    complete_to: int = Field(description="the serving replica had every version up to this time, ms")
    partition: int
    served_by: ServedBy
    lag: Lag
    position: str = Field(description="pass back as min_position for monotonic reads")
    input_lag: InputLag = Field(description=_INPUT_LAG_HELP)


_TIME_SCHEMA = {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT}
_TIME_HELP = "ms since the epoch (RFC 3339 text with its offset, such as 2026-11-29T10:00:00Z, is read too)"


def as_of_parameter(what: str = "the key's value") -> dict[str, Any]:
    return {"name": "as_of", "in": "query", "required": False, "schema": _TIME_SCHEMA,
            "description": f"a versioned table: {what} at this time, {_TIME_HELP}; the answer says "
                           f"valid_from, valid_to and whether it is final"}


def version_range_parameters(max_limit: int) -> list[dict[str, Any]]:
    return [*({"name": n, "in": "query", "required": False, "schema": _TIME_SCHEMA, "description": f"{d}, {_TIME_HELP}"}
              for n, d in (("from", "versions valid at or after this time (default: the oldest kept)"),
                           ("to", "versions valid before this time (default: now and on)"))),
            {"name": "page_token", "in": "query", "required": False, "schema": _TIME_SCHEMA,
             "description": "next_page_token of the previous page: older versions"},
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 0, "maximum": max_limit},
             "description": "page size (0 or absent: 100)"}]


class WindowItem(Window):
    key: str
    partition: int


class WindowScanResponse(BaseModel):
    table: str
    table_version: int = Field(description="the version of the table that answered: the one served, or the one "
                                           "asked for with version")
    items: list[WindowItem] = Field(description="windows starting in [from, to), ordered by key, then start")
    next_page_token: str | None
    partitions: list[ScanPartition]
    input_lag: InputLag = Field(description=_INPUT_LAG_HELP)


def page_parameters(default_limit: int, max_limit: int, of: str) -> list[dict[str, Any]]:
    """A paged read's ``page_token`` and ``limit`` query parameters."""
    return [{"name": "page_token", "in": "query", "required": False,
             "schema": {"type": "string", "format": PAGE_TOKEN_FORMAT},
             "description": f"next_page_token of the previous page of {of} (`s1.…`, opaque)"},
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 0, "maximum": max_limit},
             "description": f"page size (0 or absent: {default_limit})"}]


def window_range_parameters(maximum_windows: int) -> list[dict[str, Any]]:
    return [{"name": n, "in": "query", "required": True,
             "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
             "description": d + f"; to − from may span at most {maximum_windows} windows"}
            for n, d in (("from", "earliest window start, ms since the epoch (inclusive)"),
                         ("to", "latest window start, ms since the epoch (exclusive)"))]


def bound_parameters() -> list[dict[str, Any]]:
    """The freshness bound's query parameters, as the bound defines them."""
    return [{"name": name, "in": "query", "required": False, "schema": dict(parameter.schema),
             "description": parameter.doc} for name, parameter in PARAMETERS.items()]


_PLAIN = {"text/plain": {"schema": {"type": "string"}}}
_UNREADABLE = "a request the HTTP parser cannot read (e.g. a URL over 64 KiB)"

# What the HTTP layer refuses before any route sees the request (in plain text, then it closes).
HTTP_REFUSALS: dict[int | str, dict[str, Any]] = {
    400: {"description": _UNREADABLE, "content": _PLAIN},
    414: {"description": f"the URL of a key lookup is longer than {MAX_REQUEST_LINE_URL >> 10} KiB", "content": _PLAIN},
    431: {"description": f"the request's head is larger than {MAX_HEAD >> 10} KiB", "content": _PLAIN},
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **HTTP_REFUSALS,
    400: {"model": ErrorBody, "content": _PLAIN,
          "description": "malformed bound, token or argument (INVALID_ARGUMENT); a key lookup of a windowed table "
                         "(WINDOWED_TABLE) or a windows lookup of a plain one (NOT_WINDOWED_TABLE); as_of or versions "
                         "of a table that keeps no history (TABLE_NOT_VERSIONED); in plain text, " + _UNREADABLE},
    404: {"model": ErrorBody, "description": "TABLE_NOT_FOUND or KEY_NOT_FOUND (the latter with partition, served_by, "
                                             "lag); VERSION_NOT_RETAINED: as_of before the oldest time a versioned "
                                             "table keeps (oldest_retained, ms)"},
    409: {"model": ErrorBody, "description": "WRITE_REJECTED: an event `after` names was rejected by the pipeline as "
                                             "bad input (the reason in the message); it will never be in the table"},
    503: {"model": ErrorBody, "description": "NO_REPLICA_WITHIN_BOUND (with the freshest lag available), "
                                             "REPLICA_UNAVAILABLE, or NOT_YET_VISIBLE (no replica had the events "
                                             "`after` names within `wait_ms`)"},
    504: {"model": ErrorBody, "description": "no replica answered before the deadline (TIMEOUT)"},
}

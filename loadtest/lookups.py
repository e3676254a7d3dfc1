"""One lookup through the router (REST or gRPC), turned into one flat record for the recording.

Every record has the same fields whatever the protocol, so that the summary, the plots
and the consistency checker never care how a lookup travelled:

``t`` (s since the run started, send time), ``ts_ms`` (wall clock), ``proto``, ``session``,
``seq``, ``table``, ``key``, ``bound_kind``, ``bound`` (the limits asked for), ``outcome``
(``ok``, ``not_found``, ``table_not_found``, ``unavailable``, ``timeout``, ``bad_request``,
``transport``, ``other``), ``status`` (HTTP status or gRPC code name), ``code`` (error code),
``latency_ms``, ``partition``, ``served_by``, ``lag``, ``position``, ``value``; a failed lookup
(not a 404) also keeps the router's whole error body as ``error``, which says what each
attempt met.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

_OUTCOME_BY_HTTP = {200: "ok", 400: "bad_request", 503: "unavailable", 504: "timeout"}
_OUTCOME_BY_GRPC = {"OK": "ok", "INVALID_ARGUMENT": "bad_request", "UNAVAILABLE": "unavailable",
                    "DEADLINE_EXCEEDED": "timeout"}


def _base(proto: str, table: str, key: str, bound_kind: str, bound: dict[str, Any], t: float,
          session: str | None, seq: int | None) -> dict[str, Any]:
    return {"t": round(t, 6), "ts_ms": int(time.time() * 1000), "proto": proto, "session": session, "seq": seq,
            "table": table, "key": key, "bound_kind": bound_kind, "bound": bound, "outcome": "other",
            "status": None, "code": None, "latency_ms": 0.0, "partition": None, "served_by": None, "lag": None,
            "position": None, "value": None}


def _fill_details(rec: dict[str, Any], doc: dict[str, Any]) -> None:
    for k in ("partition", "served_by", "lag", "position"):
        if doc.get(k) is not None:
            rec[k] = doc[k]


def _fill_error(rec: dict[str, Any], err: dict[str, Any]) -> None:
    rec["code"] = err.get("code")
    if rec["outcome"] not in ("not_found", "table_not_found") and err:
        rec["error"] = err
    _fill_details(rec, err)


def _not_found_outcome(code: str | None) -> str:
    return "table_not_found" if code == "TABLE_NOT_FOUND" else "not_found"


async def rest_lookup(client: Any, table: str, key: str, bound_kind: str, bound: dict[str, Any], t0: float,
                      session: str | None = None, seq: int | None = None) -> dict[str, Any]:
    """``GET /v1/tables/{table}/keys/{key}`` with an ``httpx.AsyncClient`` bound to the router."""
    import httpx

    start = time.monotonic()
    rec = _base("rest", table, key, bound_kind, bound, start - t0, session, seq)
    try:
        resp = await client.get(f"/v1/tables/{table}/keys/{key}", params=bound or None)
    except httpx.TimeoutException as e:
        rec.update(outcome="timeout", status="client-timeout", code=type(e).__name__)
    except httpx.HTTPError as e:
        rec.update(outcome="transport", status="transport", code=type(e).__name__)
    else:
        rec["status"] = resp.status_code
        try:
            doc = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            doc = {}
        if resp.status_code == 200:
            rec["outcome"] = "ok"
            rec["value"] = doc.get("value")
            _fill_details(rec, doc)
        else:
            err = doc.get("error") if isinstance(doc, dict) else None
            err = err if isinstance(err, dict) else {}
            code = err.get("code")
            rec["outcome"] = (_not_found_outcome(code) if resp.status_code == 404
                              else _OUTCOME_BY_HTTP.get(resp.status_code, "other"))
            _fill_error(rec, err)
    rec["latency_ms"] = round((time.monotonic() - start) * 1000, 3)
    return rec


def grpc_bound(bound: dict[str, Any]) -> Any:
    """The request's ``Bound`` message for a bound given as REST query parameters."""
    from proto import router_pb2

    return router_pb2.Bound(**bound) if bound else None


def response_to_dict(resp: Any) -> dict[str, Any]:
    """The REST-shaped fields of a gRPC ``GetResponse``."""
    return {"partition": resp.partition,
            "served_by": {"node": resp.served_by.node, "role": resp.served_by.role} if resp.HasField("served_by") else None,
            "lag": {"offsets": resp.lag.offsets, "ms": resp.lag.ms} if resp.HasField("lag") else None,
            "position": resp.position or None}


async def grpc_lookup(stub: Any, table: str, key: str, bound_kind: str, bound: dict[str, Any], t0: float,
                      session: str | None = None, seq: int | None = None, timeout_s: float = 5.0) -> dict[str, Any]:
    """``Router.Get`` on a ``grpc.aio`` stub."""
    import grpc

    from proto import router_pb2

    start = time.monotonic()
    rec = _base("grpc", table, key, bound_kind, bound, start - t0, session, seq)
    req = router_pb2.GetRequest(table=table, key=key, bound=grpc_bound(bound))
    try:
        resp = await stub.Get(req, timeout=timeout_s)
    except grpc.aio.AioRpcError as e:
        code = e.code().name
        rec["status"] = code
        err: dict[str, Any] = {}
        for md_key, md_value in e.trailing_metadata() or ():
            if md_key == "freshroute-error":
                try:
                    err = orjson.loads(md_value).get("error", {})
                except (orjson.JSONDecodeError, AttributeError):
                    err = {}
        rec["outcome"] = (_not_found_outcome(err.get("code")) if code == "NOT_FOUND"
                          else _OUTCOME_BY_GRPC.get(code, "other"))
        if code == "UNAVAILABLE" and not err:
            rec["outcome"] = "transport"  # no error body: the channel itself failed, not the router's routing
        _fill_error(rec, err)
    else:
        rec["status"] = "OK"
        _fill_details(rec, response_to_dict(resp))
        if resp.found:
            rec["outcome"] = "ok"
            rec["value"] = orjson.loads(resp.value_json) if resp.value_json else None
        else:
            rec["outcome"] = "not_found"
            rec["code"] = "KEY_NOT_FOUND"
    rec["latency_ms"] = round((time.monotonic() - start) * 1000, 3)
    return rec


_OUTCOME_BY_CODE = {"NO_REPLICA_WITHIN_BOUND": "unavailable", "REPLICA_UNAVAILABLE": "unavailable",
                    "TIMEOUT": "timeout", "INVALID_ARGUMENT": "bad_request", "TABLE_NOT_FOUND": "table_not_found"}


async def client_lookup(client: Any, table: str, key: str, bound_kind: str, bound: dict[str, Any], t0: float,
                        session: str | None = None, seq: int | None = None) -> dict[str, Any]:
    """``AsyncClient.get``: straight to the store nodes through the routing core."""
    from freshroute.errors import FreshrouteError

    start = time.monotonic()
    rec = _base("client", table, key, bound_kind, bound, start - t0, session, seq)
    try:
        r = await client.get(table, key, **bound)
    except FreshrouteError as e:
        rec.update(outcome=_OUTCOME_BY_CODE.get(e.code, "other"), status=e.http_status)
        _fill_error(rec, e.to_body()["error"])
    else:
        rec.update(outcome="ok" if r.found else "not_found", status=200 if r.found else 404,
                   code=None if r.found else "KEY_NOT_FOUND", value=r.value, partition=r.partition,
                   served_by={"node": r.node, "role": r.role}, lag={"offsets": r.lag_offsets, "ms": r.lag_ms},
                   position=r.position)
    rec["latency_ms"] = round((time.monotonic() - start) * 1000, 3)
    return rec

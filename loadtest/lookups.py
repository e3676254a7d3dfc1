"""One lookup through the router (REST or gRPC), turned into one flat record for the recording.

Every record has the same fields whatever the protocol, so that the summary, the plots
and the consistency checker never care how a lookup travelled:

``t`` (s since the run started, send time), ``ts_ms`` (wall clock), ``proto``, ``session``,
``seq``, ``table``, ``key``, ``bound_kind``, ``bound`` (the limits asked for), ``outcome``
(``ok``, ``not_found``, ``table_not_found``, ``unavailable``, ``timeout``, ``bad_request``,
``transport``, ``other``), ``status`` (HTTP status or gRPC code name), ``code`` (error code),
``latency_ms``, ``partition``, ``served_by``, ``lag``, ``position``, ``value``; a failed lookup
(not a 404) also keeps the router's whole error body as ``error``, which says what each
attempt met. A window lookup (of a windowed table) adds ``from_ms``, ``to_ms``, ``windows``
(each ``{start, end, value, final}``) and ``watermark_ms``; its outcome is ``ok`` with or
without windows.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from freshroute.routing.results import lag_message_doc

_OUTCOME_BY_HTTP = {200: "ok", 400: "bad_request", 503: "unavailable", 504: "timeout"}
_OUTCOME_BY_GRPC = {"OK": "ok", "INVALID_ARGUMENT": "bad_request", "UNAVAILABLE": "unavailable",
                    "DEADLINE_EXCEEDED": "timeout"}


def _base(proto: str, table: str, key: str, bound_kind: str, bound: dict[str, Any], t: float,
          session: str | None, seq: int | None) -> dict[str, Any]:
    return {"t": round(t, 6), "ts_ms": int(time.time() * 1000), "proto": proto, "session": session, "seq": seq,
            "table": table, "key": key, "bound_kind": bound_kind, "bound": bound, "outcome": "other",
            "status": None, "code": None, "latency_ms": 0.0, "partition": None, "served_by": None, "lag": None,
            "position": None, "value": None, "input_lag": None}


def _fill_details(rec: dict[str, Any], doc: dict[str, Any]) -> None:
    for k in ("partition", "served_by", "lag", "position", "input_lag"):
        if doc.get(k) is not None:
            rec[k] = doc[k]


def _fill_error(rec: dict[str, Any], err: dict[str, Any]) -> None:
    rec["code"] = err.get("code")
    if rec["outcome"] not in ("not_found", "table_not_found") and err:
        rec["error"] = err
    _fill_details(rec, err)


def _not_found_outcome(code: str | None) -> str:
    return "table_not_found" if code == "TABLE_NOT_FOUND" else "not_found"


def _windowed(rec: dict[str, Any], span: tuple[int, int] | None) -> dict[str, Any]:
    if span is not None:
        rec.update(from_ms=span[0], to_ms=span[1], windows=None, watermark_ms=None)
    return rec


def _fill_windows(rec: dict[str, Any], windows: list[dict[str, Any]], watermark_ms: int | None) -> None:
    rec["windows"] = windows
    rec["watermark_ms"] = watermark_ms


async def rest_lookup(client: Any, table: str, key: str, bound_kind: str, bound: dict[str, Any], t0: float,
                      session: str | None = None, seq: int | None = None,
                      span: tuple[int, int] | None = None) -> dict[str, Any]:
    """``GET /v1/tables/{table}/keys/{key}`` with an ``httpx.AsyncClient`` bound to the router; with ``span``
    (from, to), the key's windows starting in it (``…/windows``)."""
    import httpx

    start = time.monotonic()
    rec = _windowed(_base("rest", table, key, bound_kind, bound, start - t0, session, seq), span)
    path, params = f"/v1/tables/{table}/keys/{key}", dict(bound)
    if span is not None:
        path += "/windows"
        params.update({"from": span[0], "to": span[1]})
    try:
        resp = await client.get(path, params=params or None)
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
            if span is not None:
                _fill_windows(rec, doc.get("windows"), doc.get("watermark_ms"))
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
            "lag": lag_message_doc(resp.lag) if resp.HasField("lag") else None,
            "position": resp.position or None,
            "input_lag": {"records": resp.input_lag.records, "ms": resp.input_lag.ms}}


async def grpc_lookup(stub: Any, table: str, key: str, bound_kind: str, bound: dict[str, Any], t0: float,
                      session: str | None = None, seq: int | None = None, timeout_s: float = 5.0,
                      span: tuple[int, int] | None = None) -> dict[str, Any]:
    """``Router.Get`` on a ``grpc.aio`` stub; with ``span`` (from, to), ``Router.GetWindows``."""
    import grpc

    from proto import router_pb2

    start = time.monotonic()
    rec = _windowed(_base("grpc", table, key, bound_kind, bound, start - t0, session, seq), span)
    try:
        if span is None:
            resp = await stub.Get(router_pb2.GetRequest(table=table, key=key, bound=grpc_bound(bound)),
                                  timeout=timeout_s)
        else:
            resp = await stub.GetWindows(router_pb2.WindowsRequest(table=table, key=key, from_ms=span[0],
                                                                   to_ms=span[1], bound=grpc_bound(bound)),
                                         timeout=timeout_s)
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
        if span is not None:
            rec["outcome"] = "ok"
            _fill_windows(rec, [{"start": w.start_ms, "end": w.end_ms, "value": orjson.loads(w.value_json),
                                 "final": w.final} for w in resp.windows],
                          resp.watermark_ms if resp.HasField("watermark_ms") else None)
        elif resp.found:
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
                        session: str | None = None, seq: int | None = None,
                        span: tuple[int, int] | None = None) -> dict[str, Any]:
    """``AsyncClient.get`` (with ``span``: ``AsyncClient.windows``): straight to the store nodes through the routing
    core."""
    from freshroute.errors import FreshrouteError

    start = time.monotonic()
    rec = _windowed(_base("client", table, key, bound_kind, bound, start - t0, session, seq), span)
    try:
        if span is not None:
            w = await client.windows(table, key, from_ms=span[0], to_ms=span[1], **bound)
            rec.update(outcome="ok", status=200, partition=w.partition, served_by={"node": w.node, "role": w.role},
                       lag={"offsets": w.lag_offsets, "ms": w.lag_ms}, position=w.position,
                       input_lag={"records": w.input_lag_records, "ms": w.input_lag_ms})
            _fill_windows(rec, [x._asdict() for x in w.windows], w.watermark_ms)
            rec["latency_ms"] = round((time.monotonic() - start) * 1000, 3)
            return rec
        r = await client.get(table, key, **bound)
    except FreshrouteError as e:
        rec.update(outcome=_OUTCOME_BY_CODE.get(e.code, "other"), status=e.http_status)
        _fill_error(rec, e.to_body()["error"])
    else:
        rec.update(outcome="ok" if r.found else "not_found", status=200 if r.found else 404,
                   code=None if r.found else "KEY_NOT_FOUND", value=r.value, partition=r.partition,
                   served_by={"node": r.node, "role": r.role}, lag={"offsets": r.lag_offsets, "ms": r.lag_ms},
                   position=r.position, input_lag={"records": r.input_lag_records, "ms": r.input_lag_ms})
    rec["latency_ms"] = round((time.monotonic() - start) * 1000, 3)
    return rec

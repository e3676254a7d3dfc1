"""REST and gRPC lookups become the same flat record, for answers and for each kind of error."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import orjson

from freshroute.position import single
from loadtest.lookups import grpc_lookup, rest_lookup
from proto import router_pb2

BODY = {"table": "t", "key": "k", "value": {"count": 2}, "partition": 3,
        "served_by": {"node": "node-2", "role": "standby"}, "lag": {"offsets": 4, "ms": 120},
        "position": single("t", 3, 17)}


def _rest(handler) -> dict:
    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://router") as c:
            return await rest_lookup(c, "t", "k", "max_lag", {"max_lag": 5}, t0=0.0, session="w1", seq=7)
    return asyncio.run(go())


def test_rest_answer():
    seen = {}

    def handler(req: httpx.Request) -> httpx.Response:
        seen["url"] = str(req.url)
        return httpx.Response(200, json=BODY)

    r = _rest(handler)
    assert seen["url"] == "http://router/v1/tables/t/keys/k?max_lag=5"
    assert r["outcome"] == "ok" and r["status"] == 200 and r["value"] == {"count": 2}
    assert r["partition"] == 3 and r["served_by"]["role"] == "standby" and r["lag"] == {"offsets": 4, "ms": 120}
    assert r["position"] == BODY["position"] and r["session"] == "w1" and r["seq"] == 7
    assert r["bound"] == {"max_lag": 5} and r["bound_kind"] == "max_lag" and r["latency_ms"] >= 0


def test_rest_errors():
    err = {"error": {"code": "KEY_NOT_FOUND", "message": "no", "partition": 3, "lag": {"offsets": 0, "ms": 0},
                     "position": single("t", 3, 9)}}
    r = _rest(lambda req: httpx.Response(404, json=err))
    assert r["outcome"] == "not_found" and r["code"] == "KEY_NOT_FOUND" and r["position"] == err["error"]["position"]
    assert "error" not in r  # an expected 404 keeps the record small
    r = _rest(lambda req: httpx.Response(404, json={"error": {"code": "TABLE_NOT_FOUND", "message": "no"}}))
    assert r["outcome"] == "table_not_found"
    unavailable = {"code": "REPLICA_UNAVAILABLE", "message": "x",
                   "attempts": [{"node": "node-2", "reason": "NOT_HOSTED: gone"}]}
    r = _rest(lambda req: httpx.Response(503, json={"error": unavailable}))
    assert r["outcome"] == "unavailable" and r["code"] == "REPLICA_UNAVAILABLE" and r["error"] == unavailable
    r = _rest(lambda req: httpx.Response(502, text="bad gateway"))
    assert r["outcome"] == "other" and r["status"] == 502

    def refuse(req):
        raise httpx.ConnectError("refused")

    r = _rest(refuse)
    assert r["outcome"] == "transport" and r["code"] == "ConnectError"

    def slow(req):
        raise httpx.ReadTimeout("slow")

    assert _rest(slow)["outcome"] == "timeout"


class _Stub:
    def __init__(self, result):
        self.result = result
        self.request = None

    async def Get(self, request, timeout=None):  # noqa: N802 - gRPC method name
        self.request = request
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def _grpc(result, bound=None):
    stub = _Stub(result)
    rec = asyncio.run(grpc_lookup(stub, "t", "k", "session" if bound else "none", bound or {}, t0=0.0))
    return rec, stub.request


def _rpc_error(code: grpc.StatusCode, body: dict | None) -> grpc.aio.AioRpcError:
    md = grpc.aio.Metadata(("freshroute-error", orjson.dumps(body).decode())) if body else grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), md, details="x")


def test_grpc_answer_and_bound():
    resp = router_pb2.GetResponse(table="t", key="k", value_json='{"count":2}', partition=3,
                                  served_by=router_pb2.ServedBy(node="node-1", role="active"),
                                  lag=router_pb2.Lag(offsets=1, ms=2), position=single("t", 3, 5), found=True)
    token = single("t", 3, 4)
    r, req = _grpc(resp, {"min_position": token})
    assert req.bound.min_position == token and not req.bound.HasField("max_lag")
    assert r["outcome"] == "ok" and r["status"] == "OK" and r["value"] == {"count": 2}
    assert r["served_by"] == {"node": "node-1", "role": "active"} and r["lag"] == {"offsets": 1, "ms": 2}
    r, _ = _grpc(router_pb2.GetResponse(table="t", key="k", partition=3, position=single("t", 3, 5), found=False))
    assert r["outcome"] == "not_found" and r["position"] == single("t", 3, 5)


def test_grpc_errors():
    r, _ = _grpc(_rpc_error(grpc.StatusCode.UNAVAILABLE, {"error": {"code": "NO_REPLICA_WITHIN_BOUND", "bound": {}}}))
    assert r["outcome"] == "unavailable" and r["code"] == "NO_REPLICA_WITHIN_BOUND"
    assert r["error"] == {"code": "NO_REPLICA_WITHIN_BOUND", "bound": {}}
    r, _ = _grpc(_rpc_error(grpc.StatusCode.UNAVAILABLE, None))
    assert r["outcome"] == "transport"
    r, _ = _grpc(_rpc_error(grpc.StatusCode.NOT_FOUND, {"error": {"code": "TABLE_NOT_FOUND"}}))
    assert r["outcome"] == "table_not_found"
    r, _ = _grpc(_rpc_error(grpc.StatusCode.NOT_FOUND, {"error": {"code": "KEY_NOT_FOUND", "partition": 3}}))
    assert r["outcome"] == "not_found" and r["partition"] == 3
    r, _ = _grpc(_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, None))
    assert r["outcome"] == "timeout"

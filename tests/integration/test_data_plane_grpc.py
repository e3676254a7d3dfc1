"""The compiled path's gRPC port against the Python front's, side by side over the same store nodes: every
``Router.Get`` answered alike — the calls it answers itself, and those it relays — with and without credentials,
and its relays counted."""

from __future__ import annotations

import time
import uuid

import grpc
import orjson
import pytest

from freshroute.position import Position
from freshroute.write_tokens.token import WriteToken
from proto import router_pb2, router_pb2_grpc
from tools.local.services import free_port

from .router_deployment import FED, FED_INPUT_RECORDS, KEYS, LAYOUT, TABLE, WINDOWED, Deployment, Procs, value_of
from .data_plane_support import GOOD, NARROW, metrics, write_auth_file

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no Spark, no shared stack: runs beside the others

RELAYED = 'freshroute_router_compiled_path_handoffs_total{how="grpc_relayed"}'


@pytest.fixture(scope="module")
def ports(tmp_path_factory, broker, redis_service):
    """(the deployment, the compiled router's gRPC port, the Python front's, the secured routers' in that order)."""
    d = Deployment(Procs(tmp_path_factory.mktemp("data-plane-grpc")), broker, redis_service.address,
                   f"t{uuid.uuid4().hex[:10]}", fed=True)
    auth = tmp_path_factory.mktemp("data-plane-grpc-auth") / "auth.json"
    write_auth_file(auth)
    try:
        d.up()
        python, secured, secured_python = free_port(), free_port(), free_port()
        d.start_router("router-python", rest_port=free_port(), grpc_port=python,
                       settings={"FRESHROUTE_DATA_PLANE": "python"})
        d.start_router("router-auth", rest_port=free_port(), grpc_port=secured,
                       settings={"FRESHROUTE_AUTH_FILE": str(auth)})
        d.start_router("router-auth-python", rest_port=free_port(), grpc_port=secured_python,
                       settings={"FRESHROUTE_AUTH_FILE": str(auth), "FRESHROUTE_DATA_PLANE": "python"})
        assert "compiled path (gRPC's Router.Get too)" in d.procs.log("router")
        assert "compiled path (gRPC's Router.Get too)" in d.procs.log("router-auth")
        yield d, d.grpc_port, python, secured, secured_python
    finally:
        d.procs.stop_all()


LATER_MS = 4_102_444_800_000  # 2100-01-01


def bound(**fields) -> router_pb2.Bound:
    return router_pb2.Bound(**fields)


POSITION = Position(TABLE, {p: 0 for p in range(4)}).encode()
READ = WriteToken(reads={TABLE: {p: 1 for p in range(4)}}).encode()  # a session's token that read every partition
HERE, RELAYED_THERE = True, False
# Each Get, and whether the compiled path answers it itself.
REQUESTS = [
    *((router_pb2.GetRequest(table=TABLE, key=f"sensor-{i}"), HERE) for i in range(KEYS)),
    (router_pb2.GetRequest(table=TABLE, key="nope"), HERE),
    (router_pb2.GetRequest(table=TABLE, key="it's"), RELAYED_THERE),  # its message needs Python's repr
    (router_pb2.GetRequest(table=TABLE, key="café"), RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(max_lag=0)), HERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(max_staleness_ms=600_000)), HERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(max_lag=0, max_staleness_ms=600_000)), HERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(max_lag=-1)), RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(min_position=POSITION)), HERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(min_position="nonsense")), RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(min_position=Position(WINDOWED, {0: 1}).encode())),
     RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(max_input_lag_ms=0)), RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(after="nonsense")), RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(after=READ)), HERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(after=READ, wait_ms=500, max_lag=3)), HERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(after=READ, wait_ms=0)), RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(after=READ, wait_ms=60_001)), RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(after=WriteToken({"elsewhere": {0: 1}}).encode())),
     RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", bound=bound(wait_ms=10)), RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-2", typed_values=True), RELAYED_THERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-4", bound=bound(as_of=LATER_MS)), HERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-4", bound=bound(as_of=1)), RELAYED_THERE),  # before retention
    (router_pb2.GetRequest(table=TABLE, key="nope", bound=bound(as_of=LATER_MS)), HERE),
    (router_pb2.GetRequest(table=TABLE, key="sensor-4", bound=bound(as_of=-5)), RELAYED_THERE),
    (router_pb2.GetRequest(table="nope", key="k"), RELAYED_THERE),
    (router_pb2.GetRequest(table=WINDOWED, key="sensor-1"), RELAYED_THERE),  # a windowed table's keys
    (router_pb2.GetRequest(table="", key=""), RELAYED_THERE),
]


def call(port: int, request: router_pb2.GetRequest, token: str | None = None):
    """(status, details, the freshroute-error trailer's JSON, the response) of one Get."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        try:
            response = stub.Get(request, timeout=10, metadata=metadata)
            return grpc.StatusCode.OK, "", None, response
        except grpc.RpcError as e:
            trailer = dict(e.trailing_metadata() or ()).get("freshroute-error")
            return e.code(), e.details(), None if trailer is None else orjson.loads(trailer), None


def unplaced(body: dict | None) -> dict | None:
    """An error body without what depends on the replica that answered or the moment it was asked."""
    if body is not None:
        for name in ("served_by", "input_lag", "oldest_retained"):
            body["error"].pop(name, None)
        if body["error"]["code"] == "VERSION_NOT_RETAINED":
            body["error"].pop("message")  # it names the oldest time, which moves on with the clock
    return body


def same(got, want) -> None:
    assert got[0] == want[0]
    # A message naming the oldest time kept moves on with the clock.
    assert got[1].partition("the oldest time")[0] == want[1].partition("the oldest time")[0]
    assert unplaced(got[2]) == unplaced(want[2])
    if got[3] is not None:
        served = got[3].served_by.node
        assert served in LAYOUT[got[3].partition]
        for response in (got[3], want[3]):
            response.ClearField("served_by")
            response.ClearField("input_lag")
        assert got[3] == want[3]


@pytest.mark.parametrize("request_, here", REQUESTS, ids=[f"get{i}" for i in range(len(REQUESTS))])
def test_every_get_is_answered_as_the_python_front_answers_it(ports, request_, here):
    d, compiled, python, _, _ = ports
    before = metrics(d.rest)[RELAYED]
    got = call(compiled, request_)
    relayed = metrics(d.rest)[RELAYED] - before
    same(got, call(python, request_))
    assert relayed == (0 if here else 1), got[:2]


def test_a_get_after_input_events_no_replica_reflects_waits_here_and_ends_as_the_python_front_ends_it(ports):
    d, compiled, python, _, _ = ports
    events = WriteToken({d.input_topic: {0: 4, 1: FED_INPUT_RECORDS - 1}}, written_ms=int(time.time() * 1000))
    request = router_pb2.GetRequest(table=FED, key="sensor-3", bound=bound(after=events.encode(), wait_ms=300))
    before = metrics(d.rest)[RELAYED]
    started = time.monotonic()
    got = call(compiled, request)
    took = time.monotonic() - started
    assert metrics(d.rest)[RELAYED] == before, "answered here, the wait too"
    same(got, call(python, request))
    assert (got[0], got[2]["error"]["code"]) == (grpc.StatusCode.UNAVAILABLE, "NOT_YET_VISIBLE")
    assert 0.29 <= took < 1.5, took


def test_a_found_key_says_who_served_it_and_how_fresh(ports):
    d, compiled, _, _, _ = ports
    for i in range(KEYS):
        status, _, _, r = call(compiled, router_pb2.GetRequest(table=TABLE, key=f"sensor-{i}"))
        assert status == grpc.StatusCode.OK and r.found and orjson.loads(r.value_json) == value_of(i)
        assert r.served_by.role in ("active", "standby") and r.lag.HasField("offsets") and r.lag.offsets == 0
        assert Position.decode(r.position).table == TABLE
    status, details, body, _ = call(compiled, router_pb2.GetRequest(table=TABLE, key="nope"))
    assert (status, details, body["error"]["code"]) == (grpc.StatusCode.NOT_FOUND, "key 'nope' not found in table "
                                                       f"'{TABLE}'", "KEY_NOT_FOUND")
    status, _, _, r = call(compiled, router_pb2.GetRequest(table=TABLE, key="sensor-4", bound=bound(as_of=LATER_MS)))
    assert status == grpc.StatusCode.OK and r.HasField("valid_from") and not r.HasField("valid_to")
    assert r.valid_from <= int(time.time() * 1000)


@pytest.mark.parametrize("token, table", [(None, TABLE), (GOOD, TABLE), ("wrong-token", TABLE), (NARROW, TABLE),
                                          (NARROW, WINDOWED), ("", TABLE)])
def test_credentials_are_judged_as_the_python_front_judges_them(ports, token, table):
    d, _, _, secured, secured_python = ports
    request = router_pb2.GetRequest(table=table, key="sensor-1")
    got = call(secured, request, token)
    same(got, call(secured_python, request, token))
    expected = {None: grpc.StatusCode.UNAUTHENTICATED, GOOD: grpc.StatusCode.OK,
                "wrong-token": grpc.StatusCode.UNAUTHENTICATED, "": grpc.StatusCode.UNAUTHENTICATED}
    if token in expected:
        assert got[0] == expected[token]


def test_calls_of_every_other_method_are_relayed(ports):
    d, compiled, _, _, _ = ports
    before = metrics(d.rest)[RELAYED]
    with grpc.insecure_channel(f"127.0.0.1:{compiled}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        got = stub.BatchGet(router_pb2.BatchGetRequest(table=TABLE, keys=["sensor-1", "nope"]), timeout=10)
        assert [r.found for r in got.results] == [True, False]
        tables = stub.ListTables(router_pb2.ListTablesRequest(), timeout=10)
        assert {t.name for t in tables.tables} == set(d.tables)
    assert metrics(d.rest)[RELAYED] - before == 2


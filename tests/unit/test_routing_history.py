"""A versioned table's reads through the router (REST and gRPC answers built by the routing core over fake nodes):
a key as of a time with its validity and whether it is final, its versions page by page, and each refusal."""

import dataclasses

import grpc
import orjson
import pytest

from freshroute.client.lookup import AsOfLookup
from freshroute.client.router import RouterHttp
from freshroute.errors import InvalidArgument
from freshroute.bound import NO_BOUND
from freshroute.lag import now_ms
from freshroute.keys import serialize_key
from freshroute.routing.history import parse_time, rfc3339
from proto import router_pb2
from router.grpc_get import answer_get
from tests.unit.routing_support import SPEC, TABLE, Cluster, part

pytestmark = pytest.mark.anyio

DAY = 86_400_000
NOW = now_ms()
T1, T2, T3 = NOW - 3 * DAY, NOW - 2 * DAY, NOW - 10_000


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture
def cluster():
    c = Cluster(tables=(dataclasses.replace(SPEC, history_retention_ms=7 * DAY),))
    for node in (c.n1, c.n2):
        rep = node.replicas[(TABLE, part("sensor-1"))]
        rep.history[serialize_key("sensor-1")] = {T1: b'{"count":1}', T2: None, T3: b'{"count":3}'}
    return c


async def test_a_key_as_of_a_time_is_the_version_valid_then_with_its_interval(cluster):
    async with cluster.client() as c:
        r = (await c.get(f"/v1/tables/{TABLE}/keys/sensor-1", params={"as_of": T1 + 5})).json()
        assert (r["value"], r["as_of"], r["valid_from"], r["valid_to"], r["final"]) == ({"count": 1}, T1 + 5, T1, T2,
                                                                                        True)
        assert r["served_by"]["node"] in ("n1", "n2") and r["position"]
        # An RFC 3339 time names the same instant.
        named = (await c.get(f"/v1/tables/{TABLE}/keys/sensor-1", params={"as_of": rfc3339(T1 + 5)})).json()
        assert (named["as_of"], named["valid_from"], named["value"]) == (T1 + 5, T1, {"count": 1})
        latest = (await c.get(f"/v1/tables/{TABLE}/keys/sensor-1", params={"as_of": NOW + DAY})).json()
        assert (latest["value"], latest["valid_to"], latest["final"]) == ({"count": 3}, None, False)
        # Deleted then: absent, saying which delete.
        gone = await c.get(f"/v1/tables/{TABLE}/keys/sensor-1", params={"as_of": T2})
        assert gone.status_code == 404
        assert {k: gone.json()["error"][k] for k in ("code", "as_of", "valid_from", "valid_to")} == \
            {"code": "KEY_NOT_FOUND", "as_of": T2, "valid_from": T2, "valid_to": T3}
        before = await c.get(f"/v1/tables/{TABLE}/keys/sensor-1", params={"as_of": T1 - 1})
        assert before.status_code == 404 and before.json()["error"]["valid_from"] is None


async def test_an_answer_is_final_only_when_the_replica_had_every_change_up_to_then(cluster):
    for node in (cluster.n1, cluster.n2):
        # Last caught up a minute before T3's version began.
        node.replicas[(TABLE, part("sensor-1"))].staleness_ms = now_ms() - T3 + 60_000
    cluster.refresh()
    async with cluster.client() as c:
        def final(t):
            return c.get(f"/v1/tables/{TABLE}/keys/sensor-1", params={"as_of": t})

        assert (await final(T1)).json()["final"] is True
        assert (await final(T3)).json()["final"] is False  # after the replica was last complete


async def test_versions_come_newest_first_in_pages(cluster):
    async with cluster.client() as c:
        everything = (await c.get(f"/v1/tables/{TABLE}/keys/sensor-1/versions")).json()
        assert [(v["valid_from"], v["valid_to"], v["value"], v["deleted"]) for v in everything["versions"]] == [
            (T3, None, {"count": 3}, False), (T2, T3, None, True), (T1, T2, {"count": 1}, False)]
        assert everything["next_page_token"] is None and everything["complete_to"] >= NOW
        first = (await c.get(f"/v1/tables/{TABLE}/keys/sensor-1/versions", params={"limit": 2})).json()
        assert [v["valid_from"] for v in first["versions"]] == [T3, T2] and first["next_page_token"] == str(T2)
        rest = (await c.get(f"/v1/tables/{TABLE}/keys/sensor-1/versions",
                            params={"limit": 2, "page_token": first["next_page_token"]})).json()
        assert [v["valid_from"] for v in rest["versions"]] == [T1] and rest["next_page_token"] is None
        window = (await c.get(f"/v1/tables/{TABLE}/keys/sensor-1/versions",
                              params={"from": T2 + 1, "to": T3})).json()
        assert [v["valid_from"] for v in window["versions"]] == [T2]
        none = (await c.get(f"/v1/tables/{TABLE}/keys/sensor-2/versions")).json()
        assert none["versions"] == [] and none["partition"] == part("sensor-2")


@pytest.mark.parametrize("path, params, status, code, field", [
    ("keys/sensor-1", {"as_of": "tomorrow"}, 400, "INVALID_ARGUMENT", "as_of"),
    ("keys/sensor-1", {"as_of": "2026-11-29T10:00:00"}, 400, "INVALID_ARGUMENT", "as_of"),  # no offset
    ("keys/sensor-1", {"as_of": "9" * 19}, 400, "INVALID_ARGUMENT", "as_of"),  # past the largest time
    ("keys/sensor-1", {"as_of": str(NOW - 8 * DAY)}, 404, "VERSION_NOT_RETAINED", None),
    ("keys/sensor-1/versions", {"from": "5", "to": "4"}, 400, "INVALID_ARGUMENT", "from"),
    ("keys/sensor-1/versions", {"limit": "100000"}, 400, "INVALID_ARGUMENT", "limit"),
    ("keys/sensor-1/versions", {"page_token": "x"}, 400, "INVALID_ARGUMENT", "page_token"),
])
async def test_what_cannot_be_answered_is_refused_naming_why(cluster, path, params, status, code, field):
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/{path}", params=params)
    body = r.json()["error"]
    assert (r.status_code, body["code"], body.get("field")) == (status, code, field), body
    if code == "VERSION_NOT_RETAINED":
        assert NOW - 7 * DAY <= body["oldest_retained"] <= now_ms() - 7 * DAY


def with_history(cluster, keys):
    """Each key's versions (time → value or None) on both fake nodes."""
    for key, versions in keys.items():
        for node in (cluster.n1, cluster.n2):
            node.replicas[(TABLE, part(key))].history[serialize_key(key)] = versions


async def test_a_scan_as_of_a_time_holds_the_keys_present_then_each_with_its_interval(cluster):
    with_history(cluster, {"sensor-2": {T2: b'{"count":20}'}, "sensor-3": {T1: b'{"count":30}', T3: None},
                           "sensor-4": {T3: b'{"count":40}'}})
    async with cluster.client() as c:
        def at(t, **params):
            return c.get(f"/v1/tables/{TABLE}/scan", params={"as_of": t, **params})

        page = (await at(T2 + 1)).json()
        # sensor-1 deleted at T2, sensor-4 not yet there.
        assert [(i["key"], i["value"], i["valid_from"], i["valid_to"]) for i in page["items"]] == [
            ("sensor-2", {"count": 20}, T2, None), ("sensor-3", {"count": 30}, T1, T3)]
        assert (page["as_of"], page["final"], page["next_page_token"]) == (T2 + 1, True, None)
        first = (await at(T3, limit=1)).json()
        assert [i["key"] for i in first["items"]] == ["sensor-1"] and first["next_page_token"]
        rest = (await at(T3, limit=5, page_token=first["next_page_token"])).json()
        assert [(i["key"], i["valid_from"]) for i in rest["items"]] == [("sensor-2", T2), ("sensor-4", T3)]
        # A page token pages one time only; the future is the latest, not final.
        other = await at(T2, page_token=first["next_page_token"])
        assert other.status_code == 400 and other.json()["error"]["field"] == "page_token"
        latest = (await at(NOW + DAY)).json()
        assert [i["key"] for i in latest["items"]] == ["sensor-1", "sensor-2", "sensor-4"] and not latest["final"]
        old = await at(NOW - 8 * DAY)
        assert old.status_code == 404 and old.json()["error"]["code"] == "VERSION_NOT_RETAINED"


async def test_a_table_without_history_refuses_as_of_and_versions():
    plain = Cluster()
    async with plain.client() as c:
        for path, params in (("keys/sensor-1", {"as_of": "1"}), ("keys/sensor-1/versions", {}), ("scan", {"as_of": "1"})):
            r = await c.get(f"/v1/tables/{TABLE}/{path}", params=params)
            assert r.status_code == 400 and r.json()["error"]["code"] == "TABLE_NOT_VERSIONED"
        # A plain lookup is untouched.
        assert (await c.get(f"/v1/tables/{TABLE}/keys/sensor-1")).json()["value"] == {"count": 1, "avg": 0.5}


async def test_grpc_get_with_bound_as_of(cluster):
    got = await answer_get(cluster.router, router_pb2.GetRequest(table=TABLE, key="sensor-1",
                                                                 bound=router_pb2.Bound(as_of=T1)))
    assert orjson.loads(got.value_json) == {"count": 1} and (got.valid_from, got.valid_to, got.final) == (T1, T2, True)
    latest = await answer_get(cluster.router, router_pb2.GetRequest(table=TABLE, key="sensor-1",
                                                                    bound=router_pb2.Bound(as_of=NOW + DAY)))
    assert not latest.HasField("valid_to") and not latest.final


def test_times_parse_as_ms_or_rfc3339_with_an_offset():
    assert parse_time("as_of", "1764410400000") == 1764410400000
    assert parse_time("as_of", "2025-11-29T10:00:00Z") == 1764410400000
    assert parse_time("as_of", "2025-11-29T11:00:00+01:00") == 1764410400000
    for bad in ("", "-1", "1e3", "2025-11-29", "2025-11-29T10:00:00", "x" * 50, True):
        with pytest.raises(InvalidArgument):
            parse_time("as_of", bad)


async def test_a_batch_as_of_a_time_answers_each_key_with_its_version(cluster):
    async with cluster.client() as c:
        r = await c.post(f"/v1/tables/{TABLE}/keys:batchGet", json={"keys": ["sensor-1", "sensor-2"], "as_of": T1})
        body = r.json()
    assert r.status_code == 200 and body["as_of"] == T1
    one, two = body["results"]
    assert (one["found"], one["value"], one["valid_from"], one["valid_to"], one["final"]) == (True, {"count": 1}, T1,
                                                                                              T2, True)
    assert (two["found"], two["valid_from"]) == (False, None)  # no version then
    async with cluster.client() as c:
        old = await c.post(f"/v1/tables/{TABLE}/keys:batchGet", json={"keys": ["sensor-1"], "as_of": NOW - 8 * DAY})
        assert old.status_code == 404 and old.json()["error"]["code"] == "VERSION_NOT_RETAINED"
        bad = await c.post(f"/v1/tables/{TABLE}/keys:batchGet", json={"keys": ["sensor-1"], "as_of": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "as_of"


@pytest.mark.usefixtures("one_event_loop")
async def test_grpc_get_versions_and_a_batch_as_of_through_the_public_port():
    from proto import router_pb2_grpc
    from router.grpc_server import PublicGrpc
    from router.settings import RouterSettings

    c = Cluster(RouterSettings(grpc_port=0, request_timeout_ms=500, attempt_timeout_ms=200, hedge=False),
                tables=(dataclasses.replace(SPEC, history_retention_ms=7 * DAY),))
    for node in (c.n1, c.n2):
        node.replicas[(TABLE, part("sensor-1"))].history[serialize_key("sensor-1")] = {T1: b'{"count":1}', T2: None,
                                                                                       T3: b'{"count":3}'}
    server = PublicGrpc(c.settings.model_copy(update={"grpc_front": True}), c.router)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = router_pb2_grpc.RouterStub(channel)
            listed = await stub.GetVersions(router_pb2.VersionsRequest(table=TABLE, key="sensor-1", limit=2))
            assert [(v.valid_from, v.valid_to if v.HasField("valid_to") else None, v.deleted) for v in
                    listed.versions] == [(T3, None, False), (T2, T3, True)]
            assert listed.next_page_token == str(T2) and listed.partition == part("sensor-1")
            batch = await stub.BatchGet(router_pb2.BatchGetRequest(table=TABLE, keys=["sensor-1", "sensor-2"],
                                                                   bound=router_pb2.Bound(as_of=T1 + 1)))
            one, two = batch.results
            assert (one.found, orjson.loads(one.value_json), one.valid_from, one.valid_to, one.final) == \
                (True, {"count": 1}, T1, T2, True)
            assert not two.found and not two.HasField("valid_from")
            scanned = [item async for item in stub.Scan(router_pb2.ScanRequest(
                table=TABLE, limit=1, bound=router_pb2.Bound(as_of=T1 + 1)))]
            *items, last = scanned
            assert [(i.key, orjson.loads(i.value_json), i.valid_from, i.valid_to) for i in items] == [
                ("sensor-1", {"count": 1}, T1, T2)]
            assert last.summary.final and last.summary.next_page_token == ""
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Get(router_pb2.GetRequest(table=TABLE, key="sensor-1",
                                                     bound=router_pb2.Bound(as_of=NOW - 8 * DAY)))
            assert refused.value.code() is grpc.StatusCode.NOT_FOUND
            assert '"code":"VERSION_NOT_RETAINED"' in dict(refused.value.trailing_metadata())["freshroute-error"]
    finally:
        await server.stop(None)


async def test_the_clients_batch_and_scan_as_of_a_time_read_the_same_through_the_router_as_direct(cluster):
    # Direct: the routing core's answers made the client's values; through the router: its REST bodies parsed back.
    with_history(cluster, {"sensor-2": {T1: b'{"count":20}'}})
    router = RouterHttp("http://router", 5.0)
    router._http = cluster.client()
    keys, at = ["sensor-1", "sensor-2", "sensor-3"], T1 + 5
    lag, fmt = cluster.router.input_lag(TABLE), cluster.router.value_format(TABLE)

    def summary(r: AsOfLookup) -> tuple:
        return r.lookup.key, r.found, r.value, r.valid_from_ms, r.valid_to_ms, r.final, r.as_of_ms, r.partition

    direct = [AsOfLookup.of(a, lag, fmt) for a in await cluster.router.history.batch_as_of(TABLE, keys, at)]
    routed = await router.get_many(TABLE, keys, NO_BOUND, as_of_ms=at)
    assert [summary(r) for r in routed] == [summary(r) for r in direct]
    assert [summary(r)[:6] for r in routed] == [("sensor-1", True, {"count": 1}, T1, T2, True),
                                                ("sensor-2", True, {"count": 20}, T1, None, True),
                                                ("sensor-3", False, None, None, None, True)]
    page = await cluster.router.scans.rows(TABLE, as_of_ms=at)
    items, token = await router.scan_page(TABLE, "", "", "", 10, None, NO_BOUND, as_of_ms=at)
    assert token is None and [summary(r) for r in items] == [
        ("sensor-1", True, {"count": 1}, T1, T2, True, at, part("sensor-1")),
        ("sensor-2", True, {"count": 20}, T1, None, True, at, part("sensor-2"))]
    assert [(k, v) for k, v, _ in page.items] == [(r.lookup.key, r.lookup.raw_value) for r in items]
    await router.aclose()


async def test_a_batch_as_of_a_time_is_refused_whole_for_what_refuses_any_batch(cluster):
    # Too many keys, or a key the table cannot hold: the same refusal as a plain batch's, not an error per key.
    history = cluster.router.history
    for keys in (["sensor-1", "k-\ud800"], [f"k{i}" for i in range(cluster.settings.batch_max_keys + 1)]):
        with pytest.raises(InvalidArgument) as plain:
            cluster.router.group_keys(TABLE, keys, NO_BOUND)
        with pytest.raises(InvalidArgument) as as_of:
            await history.batch_as_of(TABLE, keys, T1)
        assert (as_of.value.code, str(as_of.value), as_of.value.details) == \
            (plain.value.code, str(plain.value), plain.value.details)

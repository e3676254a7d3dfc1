import asyncio
import base64
from dataclasses import replace
from types import MappingProxyType

import httpx
import orjson
import pytest

from freshroute.lag import now_ms
from freshroute.position import Position, single
from freshroute.keys import serialize_key
from freshroute.metadata.roles import Role
from freshroute.metadata.table_versions import VersionedTable

from freshroute.routing.fake import InMemoryStoreClient
from freshroute.routing.results import ClusterView, value_fields
from router.rest.app import create_app
from router.rest.routes import KeyHandlers, key_route
from router.routing import Router
from router.runtime import RouterRuntime
from router.settings import RouterSettings
from freshroute.routing.snapshot import FixedSnapshot, Snapshot

from .routing_support import KEYS, TABLE, Cluster, part

pytestmark = pytest.mark.anyio

@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def cluster():
    return Cluster()


async def test_lookup_200_body_shape(cluster):
    key = "sensor-3"
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/{key}")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"table", "table_version", "key", "value", "partition", "served_by", "lag", "position",
                         "input_lag"}
    assert list(body)[:2] == ["table", "table_version"] and body["table_version"] == 1
    assert body["input_lag"] == {"records": 0, "ms": 0}  # no input lag published: the pipeline keeps up
    assert body["table"] == TABLE and body["key"] == key and body["value"] == {"count": 3, "avg": 1.5}
    assert body["partition"] == part(key)
    assert body["served_by"]["node"] in {"n1", "n2"} and body["served_by"]["role"] in {"active", "standby"}
    assert body["lag"] == {"offsets": 0, "ms": 0}
    assert Position.decode(body["position"]) == Position(TABLE, {part(key): 100})
    # The store's JSON bytes are embedded as they are.
    stored = cluster.n1.replicas[(TABLE, part(key))].data[serialize_key(key)]
    assert stored in r.content


async def test_the_http1_path_and_the_app_answer_key_routes_alike(cluster):
    # The HTTP/1.1 path's entry (router.transports.http1 calls it with the route it matched) against the app.
    handlers = KeyHandlers(cluster.router)
    async with cluster.client() as app:
        for path in (f"/v1/tables/{TABLE}/keys/sensor-5", f"/v1/tables/{TABLE}/keys/nope",
                     f"/v1/tables/{TABLE}/keys/sensor-5?max_lag=-1", "/v1/tables/none/keys/x",
                     f"/v1/tables/{TABLE}/keys/sensor-5/metadata", f"/v1/tables/{TABLE}/keys/a%2Fmetadata",
                     f"/v1/tables/{TABLE}/keys/sensor-5/windows?from=0&to=10"):
            raw, _, query = path.encode().partition(b"?")
            status, body, headers = await handlers.answer(key_route(raw), query)
            b = await app.get(path)
            assert (status, headers) == (b.status_code, {})
            ja, jb = orjson.loads(body), b.json()
            for j in (ja, jb):  # load sharing may pick a different replica each time
                j.pop("served_by", None)
                if "error" in j:
                    j["error"].pop("served_by", None)
            assert ja == jb


async def test_key_not_found_404_still_says_where(cluster):
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/no-such-sensor")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "KEY_NOT_FOUND"
    assert err["partition"] == part("no-such-sensor") and err["key"] == "no-such-sensor"
    assert err["served_by"]["node"] in {"n1", "n2"} and err["lag"] == {"offsets": 0, "ms": 0}
    assert "position" in err and err["message"]


async def test_table_not_found_404(cluster):
    async with cluster.client() as c:
        r = await c.get("/v1/tables/nope/keys/sensor-1")
        m = await c.get("/v1/tables/nope/keys/sensor-1/metadata")
    assert r.status_code == 404 and r.json()["error"]["code"] == "TABLE_NOT_FOUND"
    assert r.json()["error"]["table"] == "nope"
    assert m.status_code == 404 and m.json()["error"]["code"] == "TABLE_NOT_FOUND"


@pytest.mark.parametrize("query,field", [("max_lag=-1", "max_lag"), ("max_lag=abc", "max_lag"),
                                         ("max_staleness_ms=1.5", "max_staleness_ms"), ("max_lag=", "max_lag"),
                                         ("min_position=garbage", "min_position"),
                                         ("min_position=p1.bm90LWpzb24", "min_position")])
async def test_malformed_bounds_400(cluster, query, field):
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/sensor-1?{query}")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "INVALID_ARGUMENT" and r.json()["error"]["field"] == field
    assert cluster.n1.reads + cluster.n2.reads == 0  # rejected before any store was asked


async def test_503_no_replica_within_bound_with_freshest_lag(cluster):
    key = "sensor-7"
    p = part(key)
    cluster.n1.replicas[(TABLE, p)].end = 150  # lag 50
    cluster.n2.replicas[(TABLE, p)].end = 180  # lag 80
    cluster.refresh()
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/{key}?max_lag=10")
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] == "NO_REPLICA_WITHIN_BOUND" and err["partition"] == p
    assert err["freshest_lag"]["offsets"] == 50 and err["freshest_lag"]["node"] == "n1"
    assert err["bound"]["max_lag"] == 10 and err["live_replicas"] == 2
    assert cluster.n1.reads + cluster.n2.reads == 0  # the recent view was enough to know


async def test_a_replica_never_caught_up_says_its_staleness_is_unknown_not_decades(cluster):
    """A replica that has never been caught up counts its staleness from the epoch (so that routing ranks it last):
    every answer shows it as unknown (null), in a lookup, a refusal, the key's metadata and the client."""
    from freshroute.client.lookup import Lookup

    key = "sensor-5"
    p = part(key)
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, p)].staleness_ms = now_ms()
    cluster.refresh()
    async with cluster.client() as c:
        served = (await c.get(f"/v1/tables/{TABLE}/keys/{key}")).json()
        refused = (await c.get(f"/v1/tables/{TABLE}/keys/{key}", params={"max_staleness_ms": 60_000})).json()
        meta = (await c.get(f"/v1/tables/{TABLE}/keys/{key}/metadata")).json()
    assert served["lag"] == {"offsets": 0, "ms": None}
    assert Lookup.from_json({"table": TABLE, **served}).lag_ms is None
    assert refused["error"]["code"] == "NO_REPLICA_WITHIN_BOUND" and refused["error"]["freshest_lag"]["ms"] is None
    assert meta["active"]["lag"]["ms"] is None


async def test_store_enforces_bound_router_view_was_stale(cluster):
    # The router thinks both replicas are caught up; the stores know better.
    key = "sensor-2"
    p = part(key)
    cluster.n1.replicas[(TABLE, p)].end = 130
    cluster.n2.replicas[(TABLE, p)].end = 140
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/{key}?max_lag=5")
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] == "NO_REPLICA_WITHIN_BOUND" and err["freshest_lag"]["offsets"] == 30
    assert cluster.n1.reads == 1 and cluster.n2.reads == 1


async def test_failover_to_next_replica_when_first_fails(cluster):
    key = "sensor-4"
    active = cluster.node_for(key, Role.ACTIVE)
    standby = cluster.node_for(key, Role.STANDBY)
    cluster.store.nodes[standby.address].replicas[(TABLE, part(key))].end = 101  # active strictly freshest
    cluster.refresh()
    active.down = True
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/{key}")
        assert r.status_code == 200
        assert r.json()["served_by"] == {"node": standby.node, "role": "standby"}
        assert r.json()["lag"]["offsets"] == 1
        # The failed node now goes to the back of the line: the next lookup asks the standby first.
        standby_reads = standby.reads
        r2 = await c.get(f"/v1/tables/{TABLE}/keys/{key}")
    assert r2.status_code == 200 and standby.reads == standby_reads + 1
    metrics = (await create_metrics_text(cluster))
    assert 'freshroute_router_retries_total{reason="unavailable"} 1.0' in metrics


async def create_metrics_text(cluster):
    async with cluster.client() as c:
        return (await c.get("/metrics")).text


async def test_failover_on_not_hosted(cluster):
    key = "sensor-9"
    p = part(key)
    active = cluster.node_for(key, Role.ACTIVE)
    standby = cluster.node_for(key, Role.STANDBY)
    standby.replicas[(TABLE, p)].end = 101
    cluster.refresh()
    del active.replicas[(TABLE, p)]  # moved away since the snapshot was built
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/{key}")
    assert r.status_code == 200 and r.json()["served_by"]["node"] == standby.node


async def test_all_replicas_unreachable_503(cluster):
    cluster.n1.down = cluster.n2.down = True
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/sensor-1")
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] == "REPLICA_UNAVAILABLE" and len(err["attempts"]) == 2


async def test_deadline_504():
    cluster = Cluster(RouterSettings(request_timeout_ms=100, attempt_timeout_ms=40, hedge=False))
    cluster.n1.delay_s = cluster.n2.delay_s = 1.0
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/sensor-1")
    assert r.status_code == 504 and r.json()["error"]["code"] == "TIMEOUT"


async def test_table_default_bound_from_settings():
    settings = RouterSettings(table_bounds={TABLE: {"max_lag": 10}}, hedge=False)
    cluster = Cluster(settings)
    key = "sensor-1"
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, part(key))].end = 200
    cluster.refresh()
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/{key}")
        loose = await c.get(f"/v1/tables/{TABLE}/keys/{key}?max_lag=1000")
    assert r.status_code == 503 and r.json()["error"]["bound"]["max_lag"] == 10
    assert loose.status_code == 200 and loose.json()["lag"]["offsets"] == 100


async def test_min_position_routes_to_a_replica_that_far(cluster):
    key = "sensor-6"
    p = part(key)
    cluster.n1.replicas[(TABLE, p)].applied = cluster.n1.replicas[(TABLE, p)].end = 120
    cluster.refresh()
    token = Position(TABLE, {p: 120}).encode()
    async with cluster.client() as c:
        for _ in range(5):
            r = await c.get(f"/v1/tables/{TABLE}/keys/{key}", params={"min_position": token})
            assert r.status_code == 200 and r.json()["served_by"]["node"] == "n1"
            assert Position.decode(r.json()["position"]).offset_for(p) >= 120


async def test_a_position_of_another_table_is_invalid_once_the_table_is_known(cluster):
    other = single("other", 0, 5)
    async with cluster.client() as c:
        wrong = [await c.get(f"/v1/tables/{TABLE}/keys/sensor-1", params={"min_position": other}),
                 await c.get(f"/v1/tables/{TABLE}/scan", params={"min_position": other}),
                 await c.post(f"/v1/tables/{TABLE}/keys:batchGet", json={"keys": ["a"], "min_position": other})]
        absent = await c.get("/v1/tables/nope/keys/sensor-1", params={"min_position": other})
    for r in wrong:
        assert r.status_code == 400 and r.json()["error"]["field"] == "min_position"
        assert "position of table 'other'" in r.json()["error"]["message"]
    assert absent.status_code == 404 and absent.json()["error"]["code"] == "TABLE_NOT_FOUND"


async def test_key_with_slash_and_unicode(cluster):
    key = "site/α-1"
    p = part(key)
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, p)].data[serialize_key(key)] = b'{"count":1}'
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/site%2F%CE%B1-1")
        m = await c.get(f"/v1/tables/{TABLE}/keys/site%2F%CE%B1-1/metadata")
    assert r.status_code == 200 and r.json()["key"] == key and r.json()["value"] == {"count": 1}
    assert m.status_code == 200 and m.json()["partition"] == p


async def test_batch_get_fans_out_by_partition(cluster):
    keys = ["sensor-1", "missing-1", "sensor-2", "sensor-17", "sensor-1"]
    async with cluster.client() as c:
        r = await c.post(f"/v1/tables/{TABLE}/keys:batchGet", json={"keys": keys})
    assert r.status_code == 200
    body = r.json()
    assert [x["key"] for x in body["results"]] == keys
    assert [x["found"] for x in body["results"]] == [True, False, True, True, True]
    assert body["results"][0]["value"] == {"count": 1, "avg": 0.5}
    assert body["results"][1]["partition"] == part("missing-1") and "value" not in body["results"][1]
    assert body["results"][3]["value"]["count"] == 17
    merged = Position.decode(body["position"])
    assert set(merged.offsets) == {part(k) for k in keys}
    # One group read per partition, not one read per key.
    assert cluster.n1.batches + cluster.n2.batches == len({part(k) for k in keys})
    assert cluster.n1.reads + cluster.n2.reads == 0


async def test_batch_get_partial_failure_is_per_key(cluster):
    bad = "sensor-5"
    p = part(bad)
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, p)].end = 500
    cluster.refresh()
    good = next(k for k in KEYS if part(k) != p)
    async with cluster.client() as c:
        r = await c.post(f"/v1/tables/{TABLE}/keys:batchGet", json={"keys": [good, bad], "max_lag": 5})
    assert r.status_code == 200
    ok, failed = r.json()["results"]
    assert ok["found"] is True
    assert failed["found"] is False and failed["error"]["code"] == "NO_REPLICA_WITHIN_BOUND"


@pytest.mark.parametrize("body", [b"not json", b"[1]", b'{"keys": "a"}', b'{"keys": [1]}',
                                  b'{"keys": ["a"], "max_lag": -1}', b'{"keys": ["a"], "min_position": 3}'])
async def test_batch_get_bad_body_400(cluster, body):
    async with cluster.client() as c:
        r = await c.post(f"/v1/tables/{TABLE}/keys:batchGet", content=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_ARGUMENT"


async def test_scan_is_ordered_across_partitions_and_paged(cluster):
    expected = sorted(KEYS)
    got = []
    token = None
    async with cluster.client() as c:
        for _ in range(10):
            params = {"limit": 7, "prefix": "sensor-", **({"page_token": token} if token else {})}
            r = await c.get(f"/v1/tables/{TABLE}/scan", params=params)
            assert r.status_code == 200
            body = r.json()
            got += [i["key"] for i in body["items"]]
            assert all(i["partition"] == part(i["key"]) for i in body["items"])
            assert [p["partition"] for p in body["partitions"]] == [0, 1, 2, 3]
            token = body["next_page_token"]
            if token is None:
                break
        assert got == expected
        r = await c.get(f"/v1/tables/{TABLE}/scan", params={"start": "sensor-2", "end": "sensor-3"})
        assert [i["key"] for i in r.json()["items"]] == [k for k in expected if "sensor-2" <= k < "sensor-3"]
        assert r.json()["items"][0]["value"]["count"] == 2
        bad = await c.get(f"/v1/tables/{TABLE}/scan", params={"page_token": "xyz"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "page_token"
        big = await c.get(f"/v1/tables/{TABLE}/scan", params={"limit": 100000})
        assert big.status_code == 400


async def test_key_metadata_tables_cluster(cluster):
    key = "sensor-8"
    async with cluster.client() as c:
        m = (await c.get(f"/v1/tables/{TABLE}/keys/{key}/metadata")).json()
        tables = (await c.get("/v1/tables")).json()["tables"]
        view = (await c.get("/v1/cluster")).json()
    assert m["partition"] == part(key)
    assert m["active"]["node"] == cluster.node_for(key, Role.ACTIVE).node and m["active"]["role"] == "active"
    assert [s["node"] for s in m["standbys"]] == [cluster.node_for(key, Role.STANDBY).node]
    assert m["active"]["lag"] == {"offsets": 0, "ms": 0} and m["active"]["alive"] is True
    assert tables == [{"name": TABLE, "topic": f"{TABLE}-changelog", "partitions": 4, "replicas": 2,
                       "standby_replicas": 1, "key_column": "sensor_id", "schema": {"count": "long", "avg": "double"},
                       "default_bound": {"max_lag": None, "max_staleness_ms": None},
                       "input_lag": {"records": 0, "ms": 0},
                       "pipeline": {"alive": False, "last_progress_ms": None},
                       "key_format": "string", "value_format": "json", "origin": "pipeline", "pipeline_mode": None,
                       "query": None, "history_retention_ms": 0, "version": 1, "versions": []}]
    record, _ = VersionedTable.first(TABLE, "fp1", 1_000).begun("fp2", 2_000)
    cluster.metadata.current = replace(cluster.metadata.current, versions=MappingProxyType({TABLE: record}))
    async with cluster.client() as c:
        listed, = (await c.get("/v1/tables")).json()["tables"]
    assert listed["version"] == 1 and listed["versions"] == [
        {"version": 1, "state": "serving", "fingerprint": "fp1", "created_ms": 1_000, "switched_ms": 1_000,
         "input_lag": {"records": 0, "ms": 0}},
        # Not placed yet, nothing published of it: its input lag unknown, and its progress and estimate null (not 0).
        {"version": 2, "state": "building", "fingerprint": "fp2", "created_ms": 2_000, "progress": None,
         "caught_up_in_ms": None}]
    assert [n["node"] for n in view["nodes"]] == ["n1", "n2"]
    assert all(n["alive"] and len(n["replicas"]) == 4 for n in view["nodes"])
    assert view["metadata"]["loaded"] is True
    # A client reads the body back into the typed view it was made from (ages aside: each read is its own now).
    typed = ClusterView.from_dict(view)
    assert [(n.node, [(r.table, r.partition, r.info.role) for r in n.replicas]) for n in typed.nodes] == [
        (n["node"], [(r["table"], r["partition"], r["role"]) for r in n["replicas"]]) for n in view["nodes"]]
    assert typed.to_dict() == view


async def test_a_malformed_bound_or_range_is_counted_as_an_invalid_lookup(cluster):
    async with cluster.client() as c:
        answers = [await c.get(f"/v1/tables/{TABLE}/keys/sensor-1?max_lag=-1"),
                   await c.get(f"/v1/tables/{TABLE}/keys/sensor-1/windows?from=x&to=10"),
                   await c.get(f"/v1/tables/{TABLE}/keys/sensor-1/windows?from=0&to=10&max_staleness_ms=-2")]
    assert [r.status_code for r in answers] == [400, 400, 400]
    assert cluster.router.metrics.registry.get_sample_value(
        "freshroute_router_lookups_total", {"outcome": "invalid", "role": "none"}) == 3.0


async def test_health_ready_metrics_docs(cluster):
    async with cluster.client() as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        assert (await c.get("/readyz")).status_code == 200
        await c.get(f"/v1/tables/{TABLE}/keys/sensor-1")
        await c.get(f"/v1/tables/{TABLE}/keys/none-such")
        text = (await c.get("/metrics")).text
        spec = (await c.get("/openapi.json")).json()
        docs = await c.get("/docs")
        unknown = await c.get("/v2/nothing")
    assert 'freshroute_router_lookups_total{outcome="not_found",role=' in text
    ok_lines = [line for line in text.splitlines() if line.startswith('freshroute_router_lookups_total{outcome="ok"')]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in ok_lines) == 1.0
    assert 'freshroute_router_replica_lag_offsets{node="n1",partition="0",role="active",table="sensor_stats"} 0.0' in text
    assert "freshroute_router_lookup_seconds_bucket" in text
    op = spec["paths"]["/v1/tables/{table}/keys/{key}"]["get"]
    assert {"table", "key", "max_lag", "max_staleness_ms", "min_position"} <= {p["name"] for p in op["parameters"]}
    assert "/v1/tables/{table}/keys:batchGet" in spec["paths"] and "/v1/tables/{table}/scan" in spec["paths"]
    assert docs.status_code == 200
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "NOT_FOUND"
    # What the document says of formats, limits and content types.
    params = {p["name"]: p["schema"] for p in op["parameters"]}
    assert params["min_position"]["format"] == "freshroute-position"
    assert params["max_lag"] == {"type": "integer", "minimum": 0, "maximum": (1 << 63) - 1}
    scan = {p["name"]: p["schema"] for p in spec["paths"]["/v1/tables/{table}/scan"]["get"]["parameters"]}
    assert scan["page_token"]["format"] == "freshroute-page-token" and scan["limit"]["maximum"] == 1000
    assert list(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == [
        "text/plain; version=1.0.0; charset=utf-8"]
    assert set(op["responses"]["400"]["content"]) == {"application/json", "text/plain"}
    assert {"414", "431"} <= set(spec["paths"]["/healthz"]["get"]["responses"])


async def test_a_method_not_allowed_names_the_allowed_ones(cluster):
    async with cluster.client() as c:
        r = await c.request("TRACE", "/v1/cluster")
        post = await c.post(f"/v1/tables/{TABLE}/keys/sensor-1")
    assert r.status_code == 405 and r.headers["allow"] == "GET" and r.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert post.status_code == 405 and post.headers["allow"] == "GET"


async def test_not_ready_once_stopping(cluster):
    async with cluster.client() as c:
        assert (await c.get("/readyz")).status_code == 200
        cluster.router.stop_serving()
        not_ready = await c.get("/readyz")
        assert not_ready.status_code == 503 and not_ready.json()["reason"] == "stopping"
        assert (await c.get(f"/v1/tables/{TABLE}/keys/sensor-1")).status_code == 200  # still answers while draining


async def test_not_ready_without_metadata():
    settings = RouterSettings()
    router = Router(settings, FixedSnapshot(Snapshot()), InMemoryStoreClient())
    app = create_app(settings, router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:
        ready = await c.get("/readyz")
        r = await c.get(f"/v1/tables/{TABLE}/keys/x")
    assert ready.status_code == 503 and ready.json()["status"] == "not ready"
    assert r.status_code == 503 and r.json()["error"]["code"] == "REPLICA_UNAVAILABLE"


async def test_concurrent_lookups_share_equally_fresh_replicas(cluster):
    async with cluster.client() as c:
        rs = await asyncio.gather(*(c.get(f"/v1/tables/{TABLE}/keys/sensor-{i % 20}") for i in range(200)))
    assert all(r.status_code == 200 for r in rs)
    roles = [r.json()["served_by"]["role"] for r in rs]
    assert roles.count("standby") > 40 and roles.count("active") > 40


async def test_a_router_whose_redis_does_not_answer_starts_and_says_why_it_is_not_ready():
    settings = RouterSettings(redis_url="redis://127.0.0.1:1/0", redis_timeout_ms=100, refresh_ms=50)
    runtime = RouterRuntime(settings)
    await runtime.start()
    try:
        app = create_app(settings, runtime.router)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:
            ready = await c.get("/readyz")
            r = await c.get(f"/v1/tables/{TABLE}/keys/x")
            cluster = (await c.get("/v1/cluster")).json()
    finally:
        await runtime.stop()
    assert ready.status_code == 503 and ready.json()["reason"] == "no routing metadata loaded yet"
    assert r.status_code == 503 and r.json()["error"]["code"] == "REPLICA_UNAVAILABLE"
    assert cluster["metadata"] == {"loaded": False, "age_ms": None, "redis_ok": False}


async def test_every_answer_carries_the_tables_input_lag_while_the_pipeline_is_behind():
    from dataclasses import replace

    from freshroute.metadata.progress import InputLag
    from router.grpc_get import answer_get
    from proto import router_pb2

    cluster = Cluster()
    now = now_ms()
    cluster.metadata.current = replace(cluster.metadata.current,
                                       input_lag={TABLE: InputLag(records=5000, caught_up_ms=now - 1500, at_ms=now,
                                                                         alive_ms=now)})
    records, ms = cluster.router.input_lag(TABLE)
    assert records == 5000 and 1500 <= ms < 5000
    async with cluster.client() as c:
        got = (await c.get(f"/v1/tables/{TABLE}/keys/sensor-3")).json()
        missing = (await c.get(f"/v1/tables/{TABLE}/keys/nope")).json()["error"]
        batch = (await c.post(f"/v1/tables/{TABLE}/keys:batchGet", json={"keys": ["sensor-3"]})).json()
        scan = (await c.get(f"/v1/tables/{TABLE}/scan", params={"limit": 2})).json()
        listed = {t["name"]: t for t in (await c.get("/v1/tables")).json()["tables"]}
    for doc in (got, missing, batch, scan, listed[TABLE]):
        assert doc["input_lag"]["records"] == 5000 and doc["input_lag"]["ms"] >= 1500, doc
    assert got["lag"] == {"offsets": 0, "ms": 0}  # the replica itself is caught up with the changelog
    response = await answer_get(cluster.router, router_pb2.GetRequest(table=TABLE, key="sensor-3"))
    assert response.input_lag.records == 5000 and response.input_lag.ms >= 1500
    # Caught up again: zero, and gRPC leaves the field unset.
    cluster.metadata.current = replace(cluster.metadata.current,
                                       input_lag={TABLE: InputLag(records=0, caught_up_ms=now, at_ms=now, alive_ms=now)})
    assert cluster.router.input_lag(TABLE) == (0, 0)
    response = await answer_get(cluster.router, router_pb2.GetRequest(table=TABLE, key="sensor-3"))
    assert not response.HasField("input_lag")


async def test_max_input_lag_ms_refuses_a_table_further_behind_its_input_on_every_path():
    from dataclasses import replace

    import grpc

    from freshroute.metadata.progress import InputEnds, InputLag
    from router.grpc_servicer import RouterServicer
    from proto import router_pb2

    cluster = Cluster()
    now = now_ms()
    spec = replace(cluster.metadata.current.tables[TABLE], input_topic="readings")
    # The pipeline read partition 0 to 100 and stopped 3 s ago; the input has grown to 160 since.
    cluster.metadata.current = replace(
        cluster.metadata.current, tables={**cluster.metadata.current.tables, TABLE: spec},
        input_lag={TABLE: InputLag(0, now - 3000, now - 3000, {0: 100}, now - 3000)},
        input_ends={"readings": InputEnds({0: 160}, now)})
    records, ms = cluster.router.input_lag(TABLE)
    assert records == 60 and 3000 <= ms < 4000
    async with cluster.client() as c:
        refused = await c.get(f"/v1/tables/{TABLE}/keys/sensor-3", params={"max_input_lag_ms": 1000})
        served = await c.get(f"/v1/tables/{TABLE}/keys/sensor-3", params={"max_input_lag_ms": 60_000})
        batch = await c.post(f"/v1/tables/{TABLE}/keys:batchGet", json={"keys": ["sensor-3"], "max_input_lag_ms": 1000})
        malformed = await c.get(f"/v1/tables/{TABLE}/keys/sensor-3", params={"max_input_lag_ms": "-1"})
        listed = {t["name"]: t for t in (await c.get("/v1/tables")).json()["tables"]}
        view = (await c.get("/v1/cluster")).json()
    err = refused.json()["error"]
    assert refused.status_code == batch.status_code == 503 and err["code"] == "NO_REPLICA_WITHIN_BOUND"
    assert err["input_lag"]["records"] == 60 and err["input_lag"]["ms"] >= 3000
    assert err["bound"]["max_input_lag_ms"] == 1000 and "behind its input" in err["message"]
    assert served.status_code == 200 and served.json()["input_lag"]["records"] == 60
    assert malformed.status_code == 400 and malformed.json()["error"]["field"] == "max_input_lag_ms"
    # The pipeline has not spoken for 3 s: not running, its last micro-batch named.
    assert listed[TABLE]["pipeline"] == {"alive": False, "last_progress_ms": now - 3000}
    assert [(t["table"], t["alive"], t["input_lag"]["records"]) for t in view["pipelines"]] == [(TABLE, False, 60)]

    class Aborted(Exception):
        pass

    class Context:
        def invocation_metadata(self):
            return ()

        async def abort(self, code, details, trailing_metadata=()):
            self.code = code
            raise Aborted()

        def set_trailing_metadata(self, md):
            pass

    context = Context()
    with pytest.raises(Aborted):
        await RouterServicer(cluster.router).Get(router_pb2.GetRequest(
            table=TABLE, key="sensor-3", bound=router_pb2.Bound(max_input_lag_ms=1000)), context)
    assert context.code is grpc.StatusCode.UNAVAILABLE
    got = await RouterServicer(cluster.router).Get(router_pb2.GetRequest(
        table=TABLE, key="sensor-3", bound=router_pb2.Bound(max_input_lag_ms=60_000)), Context())
    assert got.input_lag.records == 60


async def test_a_replica_that_has_not_learnt_its_end_offset_answers_with_lag_unknown_not_zero(cluster):
    key = "sensor-3"
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, part(key))].end = None
    cluster.refresh()
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/{key}")
        bounded = await c.get(f"/v1/tables/{TABLE}/keys/{key}", params={"max_lag": 1000})
        m = (await c.get(f"/v1/tables/{TABLE}/keys/{key}/metadata")).json()
        view = (await c.get("/v1/cluster")).json()
        text = (await c.get("/metrics")).text
    assert r.status_code == 200 and r.json()["lag"] == {"offsets": None, "ms": 0}
    assert bounded.status_code == 503 and bounded.json()["error"]["code"] == "NO_REPLICA_WITHIN_BOUND"
    assert bounded.json()["error"]["freshest_lag"]["offsets"] is None
    assert m["active"]["lag"]["offsets"] is None and m["active"]["end_offset"] is None
    unknown = [r for n in view["nodes"] for r in n["replicas"] if r["partition"] == part(key)]
    assert len(unknown) == 2 and all(r["lag"]["offsets"] is None and r["end_offset"] is None for r in unknown)
    assert f'freshroute_router_replica_lag_offsets{{node="n1",partition="{part(key)}"' not in text


def test_values_are_served_in_their_tables_format():
    assert orjson.dumps(value_fields("json", b'{"a":1}')) == b'{"value":{"a":1}}'
    assert value_fields("string", "héllo".encode()) == {"value": "héllo"}
    assert value_fields("bytes", b"\x00\xff") == {"value_b64": base64.b64encode(b"\x00\xff").decode()}

import json
from dataclasses import replace
from types import MappingProxyType

import grpc
import pytest
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from freshroute.metadata.table_versions import VersionedTable
from freshroute.position import Position
from freshroute.routing.fake import InMemoryStoreClient
from freshroute.routing.results import LookupResult
from freshroute.routing.snapshot import FixedSnapshot, Snapshot
from proto import router_pb2, router_pb2_grpc
from router.grpc_errors import ERROR_TRAILER
from router.grpc_messages import get_response
from router.grpc_server import PublicGrpc
from router.routing import Router
from router.settings import RouterSettings

from .routing_support import KEYS, TABLE, Cluster, part

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("one_event_loop")]


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


async def serve_grpc(settings: RouterSettings, router: Router, front: bool):
    """(stop, port) of the router's gRPC port: the HTTP/2 front relaying to grpc.aio, or grpc.aio alone."""
    server = PublicGrpc(settings.model_copy(update={"grpc_front": front}), router)
    return server.stop, await server.start()


# Every test of the public surface runs against both ways of serving it.
@pytest.fixture(params=[True, False], ids=["front", "grpcio"])
async def grpc_cluster(request):
    cluster = Cluster(RouterSettings(grpc_port=0, request_timeout_ms=500, attempt_timeout_ms=200, hedge=False))
    stop, port = await serve_grpc(cluster.settings, cluster.router, request.param)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield cluster, router_pb2_grpc.RouterStub(channel), channel
    finally:
        await channel.close()
        await stop(None)


def trailer(err: grpc.aio.AioRpcError) -> dict:
    md = dict(err.trailing_metadata() or ())
    return json.loads(md[ERROR_TRAILER])["error"]


async def test_get_found(grpc_cluster):
    cluster, stub, _ = grpc_cluster
    r = await stub.Get(router_pb2.GetRequest(table=TABLE, key="sensor-3"))
    assert r.found and r.table == TABLE and r.key == "sensor-3" and r.partition == part("sensor-3")
    assert json.loads(r.value_json) == {"count": 3, "avg": 1.5}
    assert r.served_by.node in {"n1", "n2"} and r.served_by.role in {"active", "standby"}
    assert (r.lag.offsets, r.lag.ms) == (0, 0)
    assert Position.decode(r.position).offset_for(r.partition) == 100
    assert not r.HasField("value")  # typed values only when asked for


async def test_values_are_typed_on_request(grpc_cluster):
    _, stub, _ = grpc_cluster
    r = await stub.Get(router_pb2.GetRequest(table=TABLE, key="sensor-3", typed_values=True))
    assert MessageToDict(r.value) == {"count": 3, "avg": 1.5} == json.loads(r.value_json)
    b = await stub.BatchGet(router_pb2.BatchGetRequest(table=TABLE, keys=["sensor-1", "nope"], typed_values=True))
    assert MessageToDict(b.results[0].value) == {"count": 1, "avg": 0.5} and not b.results[1].HasField("value")
    items = [i async for i in stub.Scan(router_pb2.ScanRequest(table=TABLE, limit=3, typed_values=True))]
    assert [MessageToDict(i.value) for i in items[:-1]] == [json.loads(i.value_json) for i in items[:-1]]
    assert len(items) == 4 and items[-1].HasField("summary")


async def test_get_missing_key_not_found_with_trailer(grpc_cluster):
    _, stub, _ = grpc_cluster
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Get(router_pb2.GetRequest(table=TABLE, key="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    body = trailer(e.value)
    assert body["code"] == "KEY_NOT_FOUND" and body["partition"] == part("nope")
    assert body["served_by"]["node"] in {"n1", "n2"} and body["lag"] == {"offsets": 0, "ms": 0}


async def test_unknown_table_not_found(grpc_cluster):
    _, stub, _ = grpc_cluster
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Get(router_pb2.GetRequest(table="nope", key="k"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and trailer(e.value)["code"] == "TABLE_NOT_FOUND"


@pytest.mark.parametrize("bound,field", [(router_pb2.Bound(max_lag=-1), "max_lag"),
                                         (router_pb2.Bound(max_staleness_ms=-5), "max_staleness_ms"),
                                         (router_pb2.Bound(min_position="garbage"), "min_position")])
async def test_invalid_bound_invalid_argument(grpc_cluster, bound, field):
    _, stub, _ = grpc_cluster
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Get(router_pb2.GetRequest(table=TABLE, key="sensor-1", bound=bound))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert trailer(e.value) == {**trailer(e.value), "code": "INVALID_ARGUMENT", "field": field}
    # Counted as an invalid lookup, as on REST.
    cluster = grpc_cluster[0]
    assert cluster.router.metrics.registry.get_sample_value(
        "freshroute_router_lookups_total", {"outcome": "invalid", "role": "none"}) == 1.0


async def test_no_replica_within_bound_unavailable_with_freshest_lag(grpc_cluster):
    cluster, stub, _ = grpc_cluster
    key = "sensor-7"
    cluster.n1.replicas[(TABLE, part(key))].end = 150
    cluster.n2.replicas[(TABLE, part(key))].end = 170
    cluster.refresh()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Get(router_pb2.GetRequest(table=TABLE, key=key, bound=router_pb2.Bound(max_lag=10)))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    body = trailer(e.value)
    assert body["code"] == "NO_REPLICA_WITHIN_BOUND" and body["freshest_lag"]["offsets"] == 50


async def test_batch_get_found_false_for_missing(grpc_cluster):
    _, stub, _ = grpc_cluster
    r = await stub.BatchGet(router_pb2.BatchGetRequest(table=TABLE, keys=["sensor-1", "nope", "sensor-2"]))
    assert [x.key for x in r.results] == ["sensor-1", "nope", "sensor-2"]
    assert [x.found for x in r.results] == [True, False, True]
    assert r.results[1].partition == part("nope") and r.results[1].value_json == ""
    assert json.loads(r.results[2].value_json)["count"] == 2


async def test_batch_get_reports_per_key_errors_and_answers_the_other_keys(grpc_cluster):
    cluster, stub, _ = grpc_cluster
    stale = "sensor-7"
    cluster.n1.replicas[(TABLE, part(stale))].end = 150
    cluster.n2.replicas[(TABLE, part(stale))].end = 170
    cluster.refresh()
    fresh = next(k for k in KEYS if part(k) != part(stale))
    r = await stub.BatchGet(router_pb2.BatchGetRequest(table=TABLE, keys=[fresh, stale, "nope"],
                                                       bound=router_pb2.Bound(max_lag=10)))
    ok, failed, missing = r.results
    assert ok.found and ok.key == fresh and not ok.HasField("error")
    assert not missing.found and not missing.HasField("error")
    assert failed.key == stale and not failed.found and failed.partition == part(stale)
    assert failed.error.code == "NO_REPLICA_WITHIN_BOUND"
    assert failed.error.status == grpc.StatusCode.UNAVAILABLE.value[0]
    body = json.loads(failed.error.body_json)["error"]
    assert body["code"] == "NO_REPLICA_WITHIN_BOUND" and body["freshest_lag"]["offsets"] == 50


async def test_batch_get_fails_as_a_whole_only_for_a_wrong_request(grpc_cluster):
    _, stub, _ = grpc_cluster
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.BatchGet(router_pb2.BatchGetRequest(table="nope", keys=["sensor-1"]))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and trailer(e.value)["code"] == "TABLE_NOT_FOUND"


async def test_scan_streams_in_key_order_then_a_summary(grpc_cluster):
    cluster, stub, _ = grpc_cluster
    *items, last = [i async for i in stub.Scan(router_pb2.ScanRequest(table=TABLE, prefix="sensor-"))]
    assert [i.key for i in items] == sorted(KEYS)
    assert all(i.partition == part(i.key) and not i.HasField("summary") for i in items)
    assert last.key == "" and last.summary.next_page_token == ""
    parts = last.summary.partitions
    assert [p.partition for p in parts] == [0, 1, 2, 3]
    assert all(p.served_by.node in {"n1", "n2"} and (p.lag.offsets, p.lag.ms) == (0, 0) for p in parts)
    assert all(Position.decode(p.position).offset_for(p.partition) == 100 for p in parts)
    *few, last = [i async for i in stub.Scan(router_pb2.ScanRequest(table=TABLE, limit=5))]
    assert [i.key for i in few] == sorted(KEYS)[:5]
    # The summary says where the rest starts.
    *rest, _ = [i async for i in stub.Scan(router_pb2.ScanRequest(table=TABLE,
                                                                  page_token=last.summary.next_page_token))]
    assert [i.key for i in rest] == sorted(KEYS)[5:]


async def test_scan_summary_reports_the_least_fresh_answer_of_each_partition(grpc_cluster):
    cluster, stub, _ = grpc_cluster
    stale = sorted(KEYS)[0]
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, part(stale))].end = 130
    cluster.refresh()
    *_, last = [i async for i in stub.Scan(router_pb2.ScanRequest(table=TABLE))]
    lags = {p.partition: p.lag.offsets for p in last.summary.partitions}
    assert lags == {p: 30 if p == part(stale) else 0 for p in range(4)}


async def test_metadata_tables_cluster(grpc_cluster):
    cluster, stub, _ = grpc_cluster
    m = await stub.KeyMetadata(router_pb2.KeyMetadataRequest(table=TABLE, key="sensor-2"))
    assert m.partition == part("sensor-2") and m.active.role == "active" and len(m.standbys) == 1
    assert m.active.alive and m.active.applied_offset == 100
    t = await stub.ListTables(router_pb2.ListTablesRequest())
    assert [(x.name, x.partitions, x.standby_replicas, x.schema["count"]) for x in t.tables] == [(TABLE, 4, 1, "long")]
    assert (t.tables[0].version, list(t.tables[0].versions)) == (1, [])  # no record: its one version
    record, _ = VersionedTable.first(TABLE, "fp1", 1_000).begun("fp2", 2_000)
    record = record.switched(2, 3_000, 3_600_000)
    cluster.metadata.current = replace(cluster.metadata.current, versions=MappingProxyType({TABLE: record}))
    t = await stub.ListTables(router_pb2.ListTablesRequest())
    assert t.tables[0].version == 2
    assert [(v.version, v.state, v.fingerprint, v.created_ms, v.switched_ms, v.HasField("retire_at_ms"))
            for v in t.tables[0].versions] == [(1, "previous", "fp1", 1_000, 1_000, True),
                                               (2, "serving", "fp2", 2_000, 3_000, False)]
    c = await stub.Cluster(router_pb2.ClusterRequest())
    assert [n.node for n in c.nodes] == ["n1", "n2"] and all(len(n.replicas) == 4 for n in c.nodes)
    # Everything /v1/cluster says, typed.
    view = cluster.router.views.cluster().to_dict()
    assert [(n.read_address or None, n.draining) for n in c.nodes] == [(n["read_address"], n["draining"])
                                                                        for n in view["nodes"]]
    assert [(a.table, a.partition, list(a.nodes)) for a in c.assignment] == [
        (a["table"], a["partition"], a["nodes"]) for a in view["assignment"] or ()]
    assert c.metadata.loaded == view["metadata"]["loaded"] and c.metadata.redis_ok == view["metadata"]["redis_ok"]
    assert c.metadata.HasField("age_ms") == (view["metadata"]["age_ms"] is not None)


async def test_health_and_reflection(grpc_cluster):
    _, _, channel = grpc_cluster
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "freshroute.v1.Router"):
        r = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = refl.ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    resp = await call.read()
    await call.done_writing()
    names = {s.name for s in resp.list_services_response.service}
    assert {"freshroute.v1.Router", "grpc.health.v1.Health"} <= names


@pytest.mark.parametrize("front", [True, False], ids=["front", "grpcio"])
async def test_health_not_serving_without_metadata(front):
    settings = RouterSettings(grpc_port=0)
    router = Router(settings, FixedSnapshot(Snapshot()), InMemoryStoreClient())
    stop, port = await serve_grpc(settings, router, front)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            r = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
            assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await router_pb2_grpc.RouterStub(channel).Get(router_pb2.GetRequest(table=TABLE, key="k"))
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await stop(None)


async def test_a_batch_answer_larger_than_the_clients_window_arrives_whole(grpc_cluster):
    # ~300 KB of results: more than a client's initial HTTP/2 window (64 KiB), so the answer
    # flows only as the client's WINDOW_UPDATEs arrive.
    _, stub, _ = grpc_cluster
    keys = [f"missing-{i:03d}-" + "x" * 280 for i in range(999)] + ["sensor-5"]
    r = await stub.BatchGet(router_pb2.BatchGetRequest(table=TABLE, keys=keys), timeout=10)
    assert r.ByteSize() > 250_000
    assert [x.key for x in r.results] == keys
    assert [x.found for x in r.results].count(True) == 1 and r.results[-1].found


async def test_a_request_larger_than_the_window_arrives_whole(grpc_cluster):
    # ~1.2 MB of keys in one BatchGet request: more than the stream window either server
    # grants at first, so the request flows only as the server reopens it.
    _, stub, _ = grpc_cluster
    keys = [f"k{i:03d}-" + "y" * 1200 for i in range(999)] + ["sensor-4"]
    r = await stub.BatchGet(router_pb2.BatchGetRequest(table=TABLE, keys=keys), timeout=10)
    assert len(r.results) == 1000 and r.results[-1].found and not any(x.found for x in r.results[:-1])


async def test_an_unknown_offset_lag_is_left_unset_not_zero(grpc_cluster):
    cluster, stub, _ = grpc_cluster
    for node in (cluster.n1, cluster.n2):
        node.replicas[(TABLE, part("sensor-3"))].end = None
    cluster.refresh()
    r = await stub.Get(router_pb2.GetRequest(table=TABLE, key="sensor-3"))
    assert r.found and r.HasField("lag") and not r.lag.HasField("offsets") and r.lag.HasField("ms")
    known = await stub.Get(router_pb2.GetRequest(table=TABLE, key=next(k for k in KEYS if part(k) != part("sensor-3"))))
    assert known.lag.HasField("offsets") and known.lag.offsets == 0
    meta = await stub.KeyMetadata(router_pb2.KeyMetadataRequest(table=TABLE, key="sensor-3"))
    assert not meta.active.lag.HasField("offsets") and not meta.active.HasField("end_offset")


async def test_a_found_value_is_carried_in_its_tables_format():
    def get(value_format: str, raw: bytes) -> router_pb2.GetResponse:
        found = LookupResult("t", "k", 0, True, raw, "n1", "active", 0, 0, 7)
        return get_response(found, value_format=value_format)

    assert get("json", b'{"a":1}').value_json == '{"a":1}'
    assert get("string", "héllo".encode()).value_json == '"héllo"'
    blob = get("bytes", b"\x00\xff")
    assert (blob.value_json, blob.value_bytes) == ("", b"\x00\xff")  # value_bytes carries them

"""Reads of a table with versions: the served one by the table's name, another by its number (REST ``version=``,
gRPC ``Bound.version``), each answer naming the version it came from; versions that cannot be read are named."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import orjson
import pytest

from freshroute.bound import Bound
from freshroute.errors import TableVersionNotFound
from freshroute.client.router import snapshot_from_router, table_infos
from freshroute.keys import serialize_key
from freshroute.lag import now_ms
from freshroute.metadata.catch_up import CatchUp
from freshroute.metadata.progress import InputEnds, InputLag
from freshroute.metadata.roles import Role
from freshroute.metadata.table_versions import VersionedTable
from freshroute.position import Position
from router.grpc_get import answer_get
from router.openapi import TablesResponse
from proto import router_pb2

from .routing_support import KEYS, SPEC, TABLE, Cluster, part

pytestmark = pytest.mark.anyio
V2 = f"{TABLE}-v2"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def versioned(record: VersionedTable) -> Cluster:
    """The table's rows as version 1 holds them, and version 2's — each key's count ×100 — on its own replicas."""
    cluster = Cluster(tables=(SPEC, replace(SPEC, name=V2, topic=f"{V2}-changelog")))
    for p in range(SPEC.partitions):
        for node, active in ((cluster.n1, p % 2 == 0), (cluster.n2, p % 2 == 1)):
            node.host(V2, p, role=Role.ACTIVE if active else Role.STANDBY, applied=7, end=7)
    for i, key in enumerate(KEYS):
        for node in (cluster.n1, cluster.n2):
            node.replicas[(V2, part(key))].data[serialize_key(key)] = orjson.dumps({"count": i * 100})
    cluster.refresh()
    cluster.metadata.current = replace(cluster.metadata.current, versions=MappingProxyType({TABLE: record}))
    return cluster


def building() -> VersionedTable:
    return VersionedTable.first(TABLE, "fp1", 1_000).begun("fp2", 2_000)[0]


async def test_the_served_version_answers_by_name_and_another_by_its_number():
    cluster = versioned(building())
    key, i = KEYS[3], 3
    async with cluster.client() as c:
        served = (await c.get(f"/v1/tables/{TABLE}/keys/{key}")).json()
        second = (await c.get(f"/v1/tables/{TABLE}/keys/{key}?version=2")).json()
        first = (await c.get(f"/v1/tables/{TABLE}/keys/{key}?version=1")).json()
        batch = (await c.post(f"/v1/tables/{TABLE}/keys:batchGet", json={"keys": [key], "version": 2})).json()
    assert (served["table"], served["table_version"], served["value"]["count"]) == (TABLE, 1, i)
    assert (second["table"], second["table_version"], second["value"]) == (TABLE, 2, {"count": i * 100})
    assert first["value"] == served["value"] and first["table_version"] == 1
    assert (batch["table"], batch["table_version"], batch["results"][0]["value"]) == (TABLE, 2, {"count": i * 100})
    # A position names the version's own changelog: version 2's offsets, not version 1's.
    assert Position.decode(second["position"]).table == V2


async def test_after_the_switch_the_name_reads_the_new_version_and_the_old_one_stays_readable():
    cluster = versioned(building().switched(2, 3_000, 3_600_000))
    key = KEYS[2]
    async with cluster.client() as c:
        served = (await c.get(f"/v1/tables/{TABLE}/keys/{key}")).json()
        previous = (await c.get(f"/v1/tables/{TABLE}/keys/{key}?version=1")).json()
        # A session's position of version 1 says nothing of version 2's changelog: set aside, not refused.
        after = await c.get(f"/v1/tables/{TABLE}/keys/{key}", params={"min_position": previous["position"]})
    assert served["table_version"] == 2 and served["value"] == {"count": 200}
    assert previous["table_version"] == 1 and previous["value"]["count"] == 2
    assert after.status_code == 200 and after.json()["table_version"] == 2
    response = await answer_get(cluster.router, router_pb2.GetRequest(table=TABLE, key=key))
    assert (response.table, response.table_version, orjson.loads(response.value_json)) == (TABLE, 2, {"count": 200})
    response = await answer_get(cluster.router, router_pb2.GetRequest(table=TABLE, key=key,
                                                                      bound=router_pb2.Bound(version=1)))
    assert response.table_version == 1


@pytest.mark.parametrize("record, version, says", [
    (building(), 3, "table 'sensor_stats' has no version 3 (versions: 1, 2)"),
    (building().failed(2, "Spark: [UNRESOLVED_COLUMN] top"),
     2, "version 2 of table 'sensor_stats' is failed: Spark: [UNRESOLVED_COLUMN] top"),
    (None, 2, "table 'sensor_stats' has one version, not 2"),
])
async def test_a_version_that_cannot_be_read_is_named(record, version, says):
    cluster = versioned(record) if record is not None else Cluster()
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{TABLE}/keys/{KEYS[0]}?version={version}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "TABLE_VERSION_NOT_FOUND"
    assert r.json()["error"]["message"] == says


async def test_a_version_not_placed_on_the_store_nodes_yet_is_named():
    cluster = Cluster()  # version 2 begun, its table spec not registered yet
    cluster.metadata.current = replace(cluster.metadata.current, versions=MappingProxyType({TABLE: building()}))
    with pytest.raises(TableVersionNotFound, match="version 2 of table 'sensor_stats' is not placed on the store "
                                                   "nodes yet"):
        await cluster.router.get(TABLE, KEYS[0], Bound(version=2))
    assert (await cluster.router.get(TABLE, KEYS[0])).table == TABLE  # the served version answers meanwhile


async def test_the_tables_listing_shows_a_table_once_by_its_served_version_with_each_versions_input_lag():
    cluster = versioned(building().switched(2, 3_000, 3_600_000))
    async with cluster.client() as c:
        tables = (await c.get("/v1/tables")).json()["tables"]
    listed, = tables  # version 2's own table is a version of the table, not a table of its own
    assert (listed["name"], listed["topic"], listed["version"]) == (TABLE, f"{V2}-changelog", 2)
    assert [(v["version"], v["state"], v["input_lag"]) for v in listed["versions"]] == [
        (1, "previous", {"records": 0, "ms": 0}), (2, "serving", {"records": 0, "ms": 0})]


def building_with_figures(starts: dict[int, int] | None = None, falling: float | None = 100.0) -> Cluster:
    """Version 2 building from input topic ``readings``: 900 records behind (600 + 300) of the 1,400 the broker holds
    past its log starts, its lag falling 100 records a second, the pipeline's switch_lag 100."""
    cluster = versioned(building())
    now = now_ms()
    snap = cluster.metadata.current
    tables = {**snap.tables, V2: replace(snap.tables[V2], input_topic="readings")}
    lag = InputLag(900, now - 5_000, now, {0: 400, 1: 200}, now, falling, 100)
    ends = InputEnds({0: 1_000, 1: 500}, now, {0: 100, 1: 0} if starts is None else starts)
    cluster.metadata.current = replace(snap, tables=MappingProxyType(tables),
                                       input_lag=MappingProxyType({V2: lag}),
                                       input_ends=MappingProxyType({"readings": ends}))
    return cluster


async def test_a_building_version_is_listed_with_its_progress_and_when_it_will_have_caught_up():
    cluster = building_with_figures()
    async with cluster.client() as c:
        body = (await c.get("/v1/tables")).json()
    TablesResponse.model_validate(body)  # as the OpenAPI document says
    serving, second = body["tables"][0]["versions"]
    assert (second["state"], second["input_lag"]["records"]) == ("building", 900)
    assert second["progress"] == pytest.approx(500 / 1400, abs=1e-4)
    assert 7_000 < second["caught_up_in_ms"] <= 8_000  # (900 − 100) records at 100 a second, from now
    assert serving["state"] == "serving" and "progress" not in serving and "caught_up_in_ms" not in serving
    # ListTables says the same, typed.
    t = (await answer_list_tables(cluster)).tables[0]
    served, built = t.versions
    assert built.progress == pytest.approx(second["progress"]) and 7_000 < built.caught_up_in_ms <= 8_000
    assert built.input_lag.records == 900
    assert not served.HasField("progress") and not served.HasField("caught_up_in_ms")
    # A client through the router reads the same into its typed listing.
    [info] = table_infos(snapshot_from_router(body, {"nodes": []}, 0), body)
    assert info.versions is not None and info.versions.serving == 1
    assert info.version_lags[2] == (900, second["input_lag"]["ms"])
    assert info.version_catch_ups[2] == CatchUp(second["progress"], second["caught_up_in_ms"])
    assert info.to_dict()["versions"] == body["tables"][0]["versions"]


async def test_what_is_not_known_of_a_building_version_is_null_in_rest_and_unset_in_grpc():
    cluster = building_with_figures(starts={}, falling=None)  # no log starts read yet; the lag not falling
    async with cluster.client() as c:
        body = (await c.get("/v1/tables")).json()
    TablesResponse.model_validate(body)
    building_doc = body["tables"][0]["versions"][1]
    assert (building_doc["progress"], building_doc["caught_up_in_ms"]) == (None, None)
    built = (await answer_list_tables(cluster)).tables[0].versions[1]
    assert not built.HasField("progress") and not built.HasField("caught_up_in_ms")


async def answer_list_tables(cluster: Cluster) -> router_pb2.ListTablesResponse:
    from router.grpc_messages import table_info

    return router_pb2.ListTablesResponse(tables=[table_info(t) for t in cluster.router.views.list_tables()])

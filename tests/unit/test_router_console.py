"""The console's views (the cluster summed up per node and table; one table's replicas a page at a time) and its
files, served by the REST app: over fake nodes' heartbeats, with a dead node, a restore and an unreported replica."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import MappingProxyType

import httpx
import orjson
import pytest

from freshroute.bound import PARAMETERS
from freshroute.errors import InvalidArgument, TableNotFound
from freshroute.metadata.assignment import Assignment
from freshroute.metadata.progress import InputEnds, InputLag
from freshroute.metadata.roles import Role
from freshroute.metadata.table_versions import VersionedTable
from freshroute.metadata.tables import TableSpec
from freshroute.routing.fake import InMemoryStoreClient
from freshroute.routing.snapshot import FixedSnapshot, build_snapshot
from router.console.views import BUILD_SHARE, GRID_MAX_LIMIT, SUMMARY_MAX_AGE_MS, ClusterViews
from router.rest.app import create_app
from router.routing import Router
from router.settings import RouterSettings

NOW = 1_800_000_000_000
SPEC = TableSpec("sensor_stats", "sensor_stats-changelog", 4, "sensor", {"count": "long"}, 1)


class Clock:
    def __init__(self) -> None:
        self.ms = NOW

    def __call__(self) -> int:
        return self.ms


def cluster(clock: Clock) -> Router:
    """n1 alive: actives of 0 and 1, a standby of 2 restoring (40 of 100); n2 dead (heard 10 s ago): actives of 2
    and 3; the assignment also names n3, which has not reported, for partition 3's standby."""
    store = InMemoryStoreClient()
    n1, n2 = store.add_node("n1"), store.add_node("n2")
    n1.host("sensor_stats", 0, role=Role.ACTIVE, applied=100, end=100)
    n1.host("sensor_stats", 1, role=Role.ACTIVE, applied=90, end=100, staleness_ms=700)
    n1.host("sensor_stats", 2, role=Role.STANDBY, applied=40, end=100, restoring=True)
    n2.host("sensor_stats", 2, role=Role.ACTIVE, applied=100, end=100)
    n2.host("sensor_stats", 3, role=Role.ACTIVE, applied=100, end=100)
    assignment = Assignment(7, {("sensor_stats", 0): ("n1",), ("sensor_stats", 1): ("n1",),
                                ("sensor_stats", 2): ("n2", "n1"), ("sensor_stats", 3): ("n2", "n3")})
    snap = build_snapshot({"sensor_stats": SPEC}, [n1.report(NOW), n2.report(NOW - 10_000)], assignment, NOW, 1200)
    metadata = FixedSnapshot(replace(snap, assignor="n1"))
    return Router(RouterSettings(), metadata, store, clock_ms=clock)


def test_the_summary_counts_each_nodes_and_tables_replicas_by_kind_with_the_worst_lag_and_the_restores():
    clock = Clock()
    doc = orjson.loads(asyncio.run(ClusterViews(cluster(clock), clock).summary()))
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert nodes["n1"]["alive"] and not nodes["n2"]["alive"]
    assert (nodes["n1"]["replicas"], nodes["n1"]["actives"], nodes["n1"]["restoring"]) == (3, 2, 1)
    assert nodes["n1"]["max_lag_offsets"] == 60 and nodes["n1"]["max_lag_ms"] >= 700  # the restoring standby
    assert (nodes["n2"]["replicas"], nodes["n2"]["actives"]) == (2, 2)
    assert nodes["n2"]["max_lag_offsets"] is None  # a dead node's replicas count for nothing fresh
    [table] = doc["tables"]
    assert table["name"] == "sensor_stats" and table["partitions"] == 4
    assert table["replica_kinds"] == {"active": 2, "restoring": 1, "dead": 2, "pending": 1}
    # 2 is led by the dead n2 with a standby still restoring; 3 has only n2 (dead) and n3 (unreported).
    assert table["unserved_partitions"] == 2
    assert table["restoring"] == [{"partition": 2, "node": "n1", "applied_offset": 40, "end_offset": 100}]
    assert table["restoring_total"] == 1 and table["pipeline"] == {"alive": False, "last_progress_ms": None}
    assert doc["assignor"] == "n1" and doc["assignment_generation"] == 7


def test_the_summary_is_built_once_per_half_second_however_many_ask():
    clock = Clock()
    views = ClusterViews(cluster(clock), clock)

    async def asked(times: int) -> list[bytes]:
        return await asyncio.gather(*(views.summary() for _ in range(times)))

    first = asyncio.run(asked(5))
    assert all(body is first[0] for body in first)  # one build for everyone asking at once
    clock.ms += SUMMARY_MAX_AGE_MS - 1
    assert asyncio.run(views.summary()) is first[0]
    clock.ms += 1
    again = asyncio.run(views.summary())
    assert again is not first[0] and orjson.loads(again)["at_ms"] == clock.ms


def test_a_summary_slow_to_build_is_kept_longer_so_that_summaries_take_a_bounded_share_of_a_core(monkeypatch):
    import router.console.views as views_module

    clock = Clock()
    views = ClusterViews(cluster(clock), clock)
    ticks = iter([10.0, 10.125])  # a build of 125 ms
    monkeypatch.setattr(views_module.time, "perf_counter", lambda: next(ticks))
    asyncio.run(views.summary())
    assert views.max_age_ms == 125 * BUILD_SHARE


def test_a_tables_replicas_come_a_page_of_partitions_at_a_time():
    clock = Clock()
    views = ClusterViews(cluster(clock), clock)
    page = views.table_replicas("sensor_stats", {"limit": "3"})
    assert [p["partition"] for p in page["partitions"]] == [0, 1, 2] and page["next_from"] == 3
    assert page["partitions_total"] == 4
    two = {(r["node"], r["role"], r["kind"], r["alive"]) for r in page["partitions"][2]["replicas"]}
    assert two == {("n2", "active", "active", False), ("n1", "standby", "restoring", True)}
    last = views.table_replicas("sensor_stats", {"from": "3"})
    assert [(r["node"], r["kind"]) for r in last["partitions"][0]["replicas"]] == [("n2", "active"), ("n3", "pending")]
    assert last["next_from"] is None
    with pytest.raises(InvalidArgument) as e:
        views.table_replicas("sensor_stats", {"limit": str(GRID_MAX_LIMIT + 1)})
    assert e.value.details["field"] == "limit"
    with pytest.raises(InvalidArgument):
        views.table_replicas("sensor_stats", {"from": "-1"})
    with pytest.raises(TableNotFound):
        views.table_replicas("nope", {})


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_the_rest_app_serves_the_views_and_the_page_its_files_under_a_strict_policy():
    app = create_app(RouterSettings(), cluster(Clock()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as c:
        summary = await c.get("/v1/cluster/summary")
        assert summary.status_code == 200 and summary.json()["assignor"] == "n1"
        grid = await c.get("/v1/cluster/tables/sensor_stats", params={"from": 1, "limit": 1})
        assert [p["partition"] for p in grid.json()["partitions"]] == [1]
        missing = await c.get("/v1/cluster/tables/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "TABLE_NOT_FOUND"
        bad = await c.get("/v1/cluster/tables/sensor_stats", params={"limit": "ten"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_ARGUMENT"
        page = await c.get("/console")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert b'src="/console/console.js"' in page.content
        script = await c.get("/console/console.js")
        assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
        assert (await c.get("/console/nothing.js")).status_code == 404
        # The lookup form's bound fields, one per parameter the bound defines.
        fields = (await c.get("/console/bound.json")).json()
        assert [f["name"] for f in fields] == list(PARAMETERS) and all(f["doc"] for f in fields)
        assert {f["name"] for f in fields if f["numeric"]} == {"max_lag", "max_staleness_ms", "max_input_lag_ms",
                                                                  "wait_ms", "version"}


def test_the_summary_lists_each_version_with_its_state_input_lag_progress_and_estimate():
    """A table whose version 2 builds beside version 1: its row lists both, the building one with how much of its
    input it has consumed and when it will have caught up; version 2's own table (its replicas in the grid) says
    whose version it is."""
    clock = Clock()
    router = cluster(clock)
    v2 = replace(SPEC, name="sensor_stats-v2", topic="sensor_stats-v2-changelog", input_topic="readings")
    record = VersionedTable.first("sensor_stats", "fp1", 1_000).begun("fp2", 2_000)[0]
    snap = router.metadata.current
    router.metadata.current = replace(
        snap, tables=MappingProxyType({**snap.tables, v2.name: v2}),
        versions=MappingProxyType({"sensor_stats": record}),
        input_lag=MappingProxyType({v2.name: InputLag(900, NOW - 5_000, NOW, {0: 400, 1: 200}, NOW, 100.0, 100)}),
        input_ends=MappingProxyType({"readings": InputEnds({0: 1_000, 1: 500}, NOW, {0: 100, 1: 0})}))
    doc = orjson.loads(asyncio.run(ClusterViews(router, clock).summary()))
    rows = {t["name"]: t for t in doc["tables"]}
    assert [(v["version"], v["state"]) for v in rows["sensor_stats"]["versions"]] == [(1, "serving"), (2, "building")]
    building = rows["sensor_stats"]["versions"][1]
    assert building["input_lag"] == {"records": 900, "ms": 5_000}
    assert building["progress"] == pytest.approx(500 / 1400, abs=1e-4) and building["caught_up_in_ms"] == 8_000
    assert (rows["sensor_stats-v2"]["table"], rows["sensor_stats-v2"]["table_version"]) == ("sensor_stats", 2)

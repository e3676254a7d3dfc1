"""Window lookups through the routing core and the REST adapter, against in-memory store nodes."""

from __future__ import annotations

import time

import orjson
import pytest

from freshroute.errors import InvalidArgument, NotWindowedTable, WindowedTable
from freshroute.bound import Bound
from router.settings import RouterSettings

from .routing_support import S, TABLE, WINDOWED, retries, windowed_cluster, wpart

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_a_keys_windows_in_range_in_start_order_each_saying_whether_it_is_final():
    cluster = windowed_cluster()
    r = await cluster.router.windows(WINDOWED, "s3", 0, 30 * S)
    assert [(w.start, w.end, orjson.loads(w.value), w.final) for w in r.windows] == [
        (0, 10 * S, {"count": 3}, True), (10 * S, 20 * S, {"count": 4}, True), (20 * S, 30 * S, {"count": 5}, False)]
    assert r.partition == wpart("s3") and r.watermark_ms == 25 * S and r.position.startswith("p1.")
    r = await cluster.router.windows(WINDOWED, "s3", 5 * S, 20 * S)  # starts in [5 s, 20 s)
    assert [w.start for w in r.windows] == [10 * S]
    r = await cluster.router.windows(WINDOWED, "nobody", 0, 30 * S)
    assert r.windows == [] and r.partition == wpart("nobody")


async def test_windows_past_retention_are_not_served():
    cluster = windowed_cluster(watermark=75 * S)  # [0, 10 s) expired at 10 s + 60 s
    r = await cluster.router.windows(WINDOWED, "s1", 0, 30 * S)
    assert [w.start for w in r.windows] == [10 * S, 20 * S]


async def test_a_windows_read_is_retried_on_the_next_replica_when_refused():
    cluster = windowed_cluster(RouterSettings(hedge=False))
    p = wpart("s2")
    active = cluster.n1 if p % 2 == 0 else cluster.n2
    standby = cluster.n2 if active is cluster.n1 else cluster.n1
    standby.replicas[(WINDOWED, p)].end += 1  # the active is fresher: tried first
    cluster.refresh()
    active.replicas[(WINDOWED, p)].end += 50  # ... and fell behind since
    r = await cluster.router.windows(WINDOWED, "s2", 0, 30 * S, Bound(max_lag=5))
    assert r.node == standby.node and len(r.windows) == 3
    assert retries(cluster, "too_stale") == 1


async def test_a_windows_read_hedges_to_the_next_replica_when_the_first_stalls():
    cluster = windowed_cluster(RouterSettings(request_timeout_ms=3000, attempt_timeout_ms=2000, hedge=True,
                                              hedge_min_ms=5, hedge_budget=1.0))
    p = wpart("s4")
    active = cluster.n1 if p % 2 == 0 else cluster.n2
    standby = cluster.n2 if active is cluster.n1 else cluster.n1
    standby.replicas[(WINDOWED, p)].end += 1
    cluster.refresh()
    for _ in range(64):
        assert (await cluster.router.windows(WINDOWED, "s4", 0, 30 * S)).node == active.node
    active.delay_s = 1.0
    t0 = time.perf_counter()
    r = await cluster.router.windows(WINDOWED, "s4", 0, 30 * S)
    assert r.node == standby.node and len(r.windows) == 3 and time.perf_counter() - t0 < 0.5
    assert retries(cluster, "hedge") == 1


async def test_windows_across_keys_page_in_key_then_start_order():
    cluster = windowed_cluster()
    got, token = [], None
    for _ in range(20):
        page = await cluster.router.scans.windows(WINDOWED, 10 * S, 30 * S, limit=4, page_token=token)
        got += [(k, w.start) for k, w, _ in page.items]
        token = page.next_page_token
        if token is None:
            break
    assert got == [(f"s{i}", s) for i in range(6) for s in (10 * S, 20 * S)]
    assert set(page.served_by) == set(range(4))
    first = await cluster.router.scans.windows(WINDOWED, 10 * S, 30 * S, limit=1)
    with pytest.raises(InvalidArgument) as e:
        await cluster.router.scans.windows(WINDOWED, 0, 30 * S, limit=1, page_token=first.next_page_token)
    assert e.value.details["field"] == "page_token"


async def test_key_reads_of_a_windowed_table_and_windows_of_a_plain_one_are_refused():
    cluster = windowed_cluster()
    for read in (cluster.router.get(WINDOWED, "s1"), cluster.router.batch_get(WINDOWED, ["s1"]),
                 cluster.router.scans.rows(WINDOWED)):
        with pytest.raises(WindowedTable, match="windows"):
            await read
    with pytest.raises(NotWindowedTable):
        await cluster.router.windows(TABLE, "sensor-1", 0, 10)


@pytest.mark.parametrize("frm,to,field", [(10, 5, "from"), (-1, 5, "from"), (0, -5, "to"), (0, 10_001 * 10 * S, "to"),
                                          (0, 1 << 63, "to")])
async def test_a_bad_time_range_names_its_field(frm, to, field):
    cluster = windowed_cluster()
    with pytest.raises(InvalidArgument) as e:
        await cluster.router.windows(WINDOWED, "s1", frm, to)
    assert e.value.details["field"] == field


async def test_rest_windows_body_and_refusals():
    cluster = windowed_cluster()
    async with cluster.client() as c:
        r = await c.get(f"/v1/tables/{WINDOWED}/keys/s1/windows", params={"from": 0, "to": 20 * S})
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"table", "table_version", "key", "windows", "partition", "served_by", "lag", "position",
                             "watermark_ms", "input_lag"}
        assert body["windows"] == [{"start": 0, "end": 10 * S, "value": {"count": 1}, "final": True},
                                   {"start": 10 * S, "end": 20 * S, "value": {"count": 2}, "final": True}]
        r = await c.get(f"/v1/tables/{WINDOWED}/keys/s1")
        assert r.status_code == 400 and r.json()["error"]["code"] == "WINDOWED_TABLE"
        r = await c.get(f"/v1/tables/{TABLE}/keys/sensor-1/windows", params={"from": 0, "to": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "NOT_WINDOWED_TABLE"
        for params, field in (({"from": "x", "to": 1}, "from"), ({"from": 0}, "to"), ({"from": 0, "to": "1e3"}, "to")):
            r = await c.get(f"/v1/tables/{WINDOWED}/keys/s1/windows", params=params)
            assert r.status_code == 400 and r.json()["error"]["field"] == field, r.text
        r = await c.get(f"/v1/tables/{WINDOWED}/windows", params={"from": 0, "to": 20 * S, "limit": 3})
        page = r.json()
        assert [(i["key"], i["start"]) for i in page["items"]] == [("s0", 0), ("s0", 10 * S), ("s1", 0)]
        assert page["next_page_token"] and len(page["partitions"]) == 4
        r = await c.get("/v1/tables")
        listed = {t["name"]: t for t in r.json()["tables"]}
        assert listed[WINDOWED]["window"] == {"size_ms": 10 * S, "slide_ms": 10 * S, "grace_ms": 5 * S,
                                              "retention_ms": 60 * S}
        assert "window" not in listed[TABLE]

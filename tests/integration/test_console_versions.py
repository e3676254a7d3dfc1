"""The console's tables view in a real headless browser (Debian's Chromium) over a router of fake store nodes: a
table whose version 2 builds beside version 1 is drawn with each version's state and input lag, the building one's
progress as a bar and when it will have caught up; what is not known is said so, never drawn as 0. (The shared
stack's console test, tests/integration/one_stack/test_console.py, has tables of one version.)"""

from __future__ import annotations

import socket
import threading
from dataclasses import replace
from types import MappingProxyType

import pytest
import uvicorn

from freshroute.lag import now_ms
from freshroute.metadata.progress import InputEnds, InputLag
from freshroute.metadata.roles import Role
from freshroute.metadata.table_versions import VersionedTable
from freshroute.metadata.tables import TableSpec
from freshroute.routing.fake import InMemoryStoreClient, fake_snapshot
from freshroute.routing.snapshot import FixedSnapshot
from router.rest.app import create_app
from router.routing import Router
from router.settings import RouterSettings
from tests.integration.browser import browser_page

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no Spark, no shared stack: runs beside the others

T, V2 = "sensor_stats", "sensor_stats-v2"
SPECS = [TableSpec(n, f"{n}-changelog", 2, "sensor", {"count": "long"}, 1, input_topic="readings") for n in (T, V2)]


@pytest.fixture
def router():
    """Version 1 served, version 2 building: 900 records behind of the 1,400 the broker holds past its log starts,
    its lag falling 100 records a second (switch_lag 100). The router's clock stands still, so that the pipeline
    stays alive and the estimate as it is while the page is looked at."""
    now = now_ms()
    store = InMemoryStoreClient()
    node = store.add_node("n1")
    for spec in SPECS:
        for p in range(spec.partitions):
            node.host(spec.name, p, role=Role.ACTIVE, applied=10, end=10)
    record = VersionedTable.first(T, "fp1", now - 60_000).begun("fp2", now - 30_000)[0]
    snap = replace(fake_snapshot(store, SPECS, now), versions=MappingProxyType({T: record}),
                   input_lag=MappingProxyType({
                       T: InputLag(0, now, now, {0: 1_000, 1: 500}, now),
                       V2: InputLag(900, now - 5_000, now, {0: 400, 1: 200}, now, 100.0, 100)}),
                   input_ends=MappingProxyType({"readings": InputEnds({0: 1_000, 1: 500}, now, {0: 100, 1: 0})}))
    return Router(RouterSettings(), FixedSnapshot(snap), store, clock_ms=lambda: now)


@pytest.fixture
def console_url(router):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(create_app(RouterSettings(), router), lifespan="off",
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/console"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def drawn_versions(page) -> list[dict]:
    """The versions the tables view draws in ``sensor_stats``'s row: data attributes and text."""
    return page.evaluate(f"""[...document.querySelectorAll('#tables tr[data-table="{T}"] td.versions .version')]
        .map(d => ({{version: Number(d.dataset.version), state: d.dataset.state, progress: d.dataset.progress,
                    caughtUpInMs: d.dataset.caughtUpInMs, text: d.textContent,
                    bar: d.querySelector('progress') ? d.querySelector('progress').getAttribute('value') : null}}))""")


def test_the_tables_view_draws_each_version_with_its_progress_and_estimate(router, console_url):
    with browser_page(console_url) as console:
        page = console.page
        console.wait_for(lambda: len(drawn_versions(page)) == 2, 20, "sensor_stats's two versions")
        serving, building = drawn_versions(page)
        assert (serving["version"], serving["state"], serving["bar"]) == (1, "serving", None)
        assert "input lag 0 / 0 ms" in serving["text"], serving["text"]
        assert (building["version"], building["state"]) == (2, "building")
        assert float(building["progress"]) == pytest.approx(500 / 1400, abs=1e-4)
        assert float(building["bar"]) == pytest.approx(500 / 1400, abs=1e-4)
        assert building["caughtUpInMs"] == "8000"
        assert "input lag 900 / 5.0 s" in building["text"] and "35%" in building["text"], building["text"]
        assert "caught up in ~8 s" in building["text"], building["text"]
        # Version 2's own table (its replicas in the grid) says whose version it is.
        own = page.evaluate(f"document.querySelector('#tables tr[data-table=\"{V2}\"] [data-table-version]')"
                            f".textContent")
        assert own == f" v2 of {T}"

        # The log starts not read yet and the lag no longer falling: unknown, said so, never drawn as 0.
        snap = router.metadata.current
        lag = snap.input_lag[V2]
        router.metadata.current = replace(
            snap, input_lag=MappingProxyType({**snap.input_lag, V2: replace(lag, falling_per_s=None)}),
            input_ends=MappingProxyType({"readings": replace(snap.input_ends["readings"], starts={})}))
        console.wait_for(lambda: drawn_versions(page)[1]["progress"] == "", 10, "the progress unknown")
        building = drawn_versions(page)[1]
        assert building["caughtUpInMs"] == "" and building["bar"] is None  # a bar without a value: indeterminate
        assert "?%" in building["text"] and "catch-up time unknown" in building["text"], building["text"]
        assert console.exceptions == []

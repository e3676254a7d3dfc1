"""The operator's console in a real headless browser (Debian's Chromium) against the shared stack: it draws every
node and every partition's replicas as ``/v1/cluster`` has them, shows a store node killed -9 dead within 3 s and
its partitions' actives on the other nodes, answers a lookup as the REST API does, shows the API's errors plainly,
and says when the router has gone and comes back by itself when it returns.

``FRESHROUTE_CONSOLE_SCREENSHOT=docs/console.png`` keeps the screenshot the kill test takes at its end
(docs/console.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import httpx
import pytest

from freshroute.bound import PARAMETERS
from freshroute.client import write_token
from tests.integration.browser import browser_page
from tests.integration.cluster_support import balanced, fully_replicated, metadata
from tests.integration.stack_fixture import fail_if_died, produce_and_serve, wait_until, write_reading

pytestmark = pytest.mark.integration

SENSORS = 12
NODES = {"node-1", "node-2", "node-3"}
DEAD_WITHIN_S = 3.0


@pytest.fixture(scope="module")
def console(stack):
    produce_and_serve(stack, [{"sensor": f"sensor-{i}", "area": "cabin", "reading": float(i)} for i in range(SENSORS)])
    with browser_page(f"{stack.config.rest_url}/console") as page:
        page.wait_for(lambda: drawn_nodes(page), 20, "the store nodes")
        yield page


def drawn_nodes(console) -> dict[str, str]:
    """Node → "true"/"false" (alive) as the nodes table draws them."""
    return dict(console.page.evaluate(
        "[...document.querySelectorAll('#nodes tbody tr')].map(tr => [tr.dataset.node, tr.dataset.alive])"))


def drawn_replicas(console, table: str) -> set[tuple[int, str, str, str]] | None:
    """(partition, node, role, alive) of every replica the grid draws, if it draws ``table``."""
    grid = console.page.evaluate("""() => ({table: document.querySelector('#grid').dataset.table,
        cells: [...document.querySelectorAll('#grid td.replica')].map(td =>
            [Number(td.closest('tr').dataset.partition), td.dataset.node, td.dataset.role, td.dataset.alive])})""")
    return {tuple(c) for c in grid["cells"]} if grid["table"] == table else None


def api_replicas(cluster: dict, table: str) -> set[tuple[int, str, str, str]]:
    return {(r["partition"], n["node"], r["role"], str(r["alive"]).lower()) for n in cluster["nodes"]
            for r in n["replicas"] if r["table"] == table}


def events(console) -> list[str]:
    return console.page.evaluate("[...document.querySelectorAll('#events li')].map(li => li.dataset.kind)")


def test_the_console_draws_every_node_and_replica_as_the_cluster_api_has_them(stack, console):
    page = console.page
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as http:
        tables = {t["name"]: t for t in http.get("/v1/tables").json()["tables"]}
        for table in sorted(tables):
            page.select_option("#grid-table", table)

            seen: list = []

            def as_the_api_has_them() -> bool:
                cluster = http.get("/v1/cluster").json()
                want = ({n["node"]: str(n["alive"]).lower() for n in cluster["nodes"]}, api_replicas(cluster, table))
                seen[:] = [(drawn_nodes(console), drawn_replicas(console, table)), want]
                return seen[0] == seen[1]

            try:
                console.wait_for(as_the_api_has_them, 10, f"{table}'s replicas as /v1/cluster has them",
                                 check=lambda: fail_if_died(stack))
            except AssertionError as e:
                raise AssertionError(f"{e}\ndrawn: {seen[0]}\nAPI:   {seen[1]}") from None
            drawn = drawn_replicas(console, table)
            assert {p for p, *_ in drawn} == set(range(tables[table]["partitions"]))
            assert sum(role == "active" for _, _, role, _ in drawn) == tables[table]["partitions"]
        rows = page.evaluate("[...document.querySelectorAll('#tables tbody tr')].map(tr => "
                             "[tr.dataset.table, tr.cells[1].textContent, tr.querySelector('[data-pipeline-alive]')"
                             ".dataset.pipelineAlive, tr.querySelector('[data-query]')?.dataset.query, "
                             "tr.querySelector('[data-table-version]').textContent])")
        # The demo's tables are computed by one query, which each row names, each in its first version.
        assert {name: (int(n), alive, query, version) for name, n, alive, query, version in rows} == \
            {name: (t["partitions"], "true", "readings.tables", " v1") for name, t in tables.items()}


def ask(console, table: str, key: str, **bounds: str) -> tuple[dict | None, str]:
    """Look ``key`` up through the page's form: (the answer's JSON as the page shows it, the status line); a lookup
    that may wait (``wait_ms``) is given that long and 10 s more to show."""
    page = console.page
    page.evaluate("document.querySelector('#lookup-result').replaceChildren()")
    page.fill("#lookup-table", table)
    page.fill("#lookup-key", key)
    # The form has a field for each of the bound's parameters, as the bound defines them.
    page.wait_for_selector("#lookup-bound input[name=wait_ms]")
    assert page.eval_on_selector_all("#lookup-bound input", "inputs => inputs.map(i => i.name)") == list(PARAMETERS)
    for name in PARAMETERS:
        page.fill(f"#lookup-bound input[name={name}]", bounds.get(name, ""))
    page.click("#lookup-form button[type=submit]")
    page.wait_for_selector("#lookup-result [data-status]", timeout=10_000 + int(bounds.get("wait_ms") or 0))
    status = page.inner_text("#lookup-result [data-status]")
    body = json.loads(page.inner_text("#lookup-json")) if page.query_selector("#lookup-json") else None
    return body, status


def test_a_lookup_through_the_console_answers_as_the_rest_api(stack, console):
    with httpx.Client(base_url=stack.config.rest_url, timeout=10) as http:
        for key in ("sensor-3", "sensor-7"):
            shown, line = ask(console, "sensor_stats", key)
            rest = http.get(f"/v1/tables/sensor_stats/keys/{key}").json()
            assert shown["value"] == rest["value"] and shown["partition"] == rest["partition"], (shown, rest)
            # Equally fresh replicas share the reads, so the serving replica is one of the key's, in its role.
            where = http.get(f"/v1/tables/sensor_stats/keys/{key}/metadata").json()
            replicas = {(r["node"], r["role"]) for r in [where["active"], *where["standbys"]]}
            assert (shown["served_by"]["node"], shown["served_by"]["role"]) in replicas
            assert f"partition {rest['partition']} · served by {shown['served_by']['node']}" in line
        # After a write token: the reading it names is in the answer (waited for as long as a pipeline sharing two
        # busy cores may take; 5 s was once not enough in the suite).
        before = http.get("/v1/tables/sensor_stats/keys/sensor-1").json()["value"]["count"]
        shown, line = ask(console, "sensor_stats", "sensor-1", wait_ms="30000", after=write_reading(stack, {
            "sensor": "sensor-1", "area": "north", "reading": 3.0, "ts": int(time.time() * 1000)}))
        assert line.startswith("partition ") and shown["value"]["count"] > before, line
        # A windowed table: its windows on a time line, the final ones filled (once the pipeline has made some: on a
        # stack just started its windowed query may not have yet).
        wait_until(lambda: http.get("/v1/tables/sensor_windows/keys/sensor-3/windows", params={
            "from": int(time.time() * 1000) - 3_600_000, "to": int(time.time() * 1000) + 60_000}).json().get("windows"),
                   60, "sensor-3's first windows", stack=stack)
        shown, _ = ask(console, "sensor_windows", "sensor-3")
        rest = http.get("/v1/tables/sensor_windows/keys/sensor-3/windows",
                        params={"from": shown["windows"][0]["start"] if shown["windows"] else 0,
                                "to": int(time.time() * 1000) + 60_000}).json()
        drawn = console.page.evaluate("[...document.querySelectorAll('svg.timeline rect')].map(r => "
                                      "[Number(r.dataset.start), r.getAttribute('class')])")
        assert drawn and [[w["start"], "final" if w["final"] else "open"] for w in shown["windows"]] == drawn
        assert {w["start"] for w in shown["windows"] if w["final"]} <= {w["start"] for w in rest["windows"]}


def test_the_apis_errors_are_shown_plainly(console):
    _, line = ask(console, "no_such_table", "k")
    assert line.startswith("404 TABLE_NOT_FOUND: ") and "no_such_table" in line, line
    _, line = ask(console, "sensor_stats", "nobody-here")
    assert line.startswith("404 KEY_NOT_FOUND: "), line
    _, line = ask(console, "sensor_stats", "sensor-1", max_lag="abc")
    assert line.startswith("400 INVALID_ARGUMENT: ") and "max_lag" in line, line
    _, line = ask(console, "sensor_stats", "sensor-1", min_position="not-a-position")
    assert line.startswith("400 INVALID_ARGUMENT: ") and "position" in line, line
    _, line = ask(console, "sensor_stats", "sensor-1", after=write_token(("orders", 0, 1)))
    assert line.startswith("400 INVALID_ARGUMENT: ") and "reads" in line, line
    assert console.exceptions == []


def test_a_store_node_killed_shows_dead_within_3_s_and_its_actives_move(stack, console, tmp_path):
    page = console.page
    victim, vid = "store-node-3", "node-3"
    md = metadata(stack)
    page.select_option("#grid-table", "sensor_stats")
    console.wait_for(lambda: drawn_replicas(console, "sensor_stats"), 5, "sensor_stats's replicas")
    led = {p for p, node, role, _ in drawn_replicas(console, "sensor_stats") if node == vid and role == "active"}
    assert led
    killed = time.monotonic()
    stack.signal(victim, signal.SIGKILL)
    console.wait_for(lambda: drawn_nodes(console).get(vid) == "false", 10, f"{vid} dead")
    dead_after = time.monotonic() - killed
    assert dead_after <= DEAD_WITHIN_S, f"{vid} shown dead {dead_after:.2f} s after kill -9"

    def actives_elsewhere() -> bool:
        drawn = drawn_replicas(console, "sensor_stats") or set()
        actives = {p: (node, alive) for p, node, role, alive in drawn if role == "active"}
        return all(p in actives and actives[p][0] != vid and actives[p][1] == "true" for p in led)

    console.wait_for(actives_elsewhere, 10, f"the partitions {vid} led with their actives on other nodes",
                     check=lambda: fail_if_died(stack))
    seen = events(console)
    assert "node-died" in seen and "active-moved" in seen, seen
    print(f"CONSOLE: {vid} shown dead {dead_after:.2f} s after kill -9")
    stack.start(victim)
    wait_until(lambda: fully_replicated(md, NODES) and balanced(md.assignment(), NODES), 90,
               f"{vid} back and the cluster balanced again", stack=stack)
    console.wait_for(lambda: drawn_nodes(console).get(vid) == "true", 10, f"{vid} alive again")
    # The page after all that, a windowed lookup on it: the screenshot of docs/console.md.
    ask(console, "sensor_windows", "sensor-3")
    shot = tmp_path / "console.png"
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("FRESHROUTE_CONSOLE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["FRESHROUTE_CONSOLE_SCREENSHOT"])


def test_the_console_says_when_the_router_is_gone_and_reconnects_by_itself(stack, console):
    page = console.page
    state = lambda: page.get_attribute("#connection", "data-state")  # noqa: E731
    assert state() == "live"
    log = stack.components["router"].log
    since = len(open(log, "rb").read())
    stack.stop("router")
    try:
        console.wait_for(lambda: state() == "disconnected", 5, "that the router is gone")
        assert "disconnected" in page.inner_text("#connection")
    finally:
        stack.start("router")
    wait_until(lambda: b"router serving" in open(log, "rb").read()[since:], 60, "the router to serve again",
               stack=stack)
    console.wait_for(lambda: state() == "live", 10, "the page live again", check=lambda: fail_if_died(stack))
    said = console.page.evaluate("[...document.querySelectorAll('#events li')].map(li => li.textContent)")
    assert any("lost the router" in e for e in said) and any("reconnected to the router" in e for e in said), said
    assert console.exceptions == []

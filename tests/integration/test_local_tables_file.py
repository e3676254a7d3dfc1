"""Your own tables on the local stack: ``freshroute local up --tables-file FILE`` runs them instead of the demo's,
creates their sources' topics, returns once the pipeline has registered them, and serves what you produce — a
versioned table's every version, in either pipeline mode, at the time of the latest input record it reflects."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time

import httpx
import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from freshroute.topics import topic_config
from tools.local.stack import Stack
from tests.integration.stack_fixture import FIRST_DATA_TIMEOUT_S, wait_until

pytestmark = pytest.mark.integration

ORDERS = textwrap.dedent('''
    from pipeline.tables import source, sql_table

    source("orders", schema="order_id STRING, customer STRING, amount DOUBLE")
    TOTALS = "SELECT customer, count(*) AS orders, sum(amount) AS total FROM orders GROUP BY customer"
    # A customer's sixth order closes its account: the key is deleted, and that is a version too.
    sql_table(name="customer_totals", key="customer", source="orders", sql=TOTALS, history_retention="7d",
              delete_when="orders >= 6")
    sql_table(name="customer_totals_mb", key="customer", source="orders", sql=TOTALS, history_retention="7d",
              delete_when="orders >= 6", pipeline_mode="microbatch")
''')
TABLES = ["customer_totals", "customer_totals_mb"]
DAY_MS = 86_400_000


def freshroute(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture(scope="module")
def orders_stack(tmp_path_factory):
    """``local up`` of the orders tables file: (the stack, what ``up`` printed, the file)."""
    tmp_path = tmp_path_factory.mktemp("orders")
    path = tmp_path / "orders.py"
    path.write_text(ORDERS)
    home = tmp_path / "home"
    up = ["local", "up", "--home", str(home), "--tables-file", str(path), "--store-nodes", "1",
          "--standby-replicas", "0", "--routers", "1", "--rest-port", "0", "--grpc-port", "0", "--broker-port", "0",
          "--redis-port", "0", "--store-port", "0"]
    try:
        done = freshroute(*up, timeout=FIRST_DATA_TIMEOUT_S)
        stack = Stack.load(home)  # started by `local up`, which has exited: the stack's processes are no child of ours
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        yield stack, done, path
    finally:
        if (home / "state.json").exists():
            Stack.load(home).discard()


@pytest.mark.timeout(900)
def test_local_up_serves_a_tables_file_of_your_own(orders_stack):
    stack, done, path = orders_stack
    assert "customer_totals, customer_totals_mb registered: produce to orders" in done.stdout, done.stdout[-3000:]
    assert "demo-producer" not in stack.components
    # `up`'s steps, as `./dev up` takes them: within twice their budgets even on a busy machine.
    assert [step.name for step in stack.steps] == ["broker", "redis", "store nodes", "routers",
                                                  "pipeline to its tables registered"]
    assert not stack.over_budget(2), [(s.name, s.seconds, s.budget_s) for s in stack.steps]
    status = json.loads(freshroute("local", "status", "--home", str(stack.config.home), "--json").stdout)
    assert status["tables_file"] == str(path.resolve())

    c = stack.config
    with httpx.Client(base_url=c.rest_url, timeout=10) as http:
        # Ready means registered: the tables are listed before any order exists.
        assert sorted(t["name"] for t in http.get("/v1/tables").json()["tables"]) == TABLES
        producer = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 5})
        orders = [("o1", "ada", 12.5), ("o2", "bob", 3.0), ("o3", "ada", 7.5)]
        for order_id, customer, amount in orders:
            producer.produce("orders", key=customer.encode(),
                             value=orjson.dumps({"order_id": order_id, "customer": customer, "amount": amount}))
        assert producer.flush(10) == 0

        def served() -> bool:
            r = http.get("/v1/tables/customer_totals/keys/ada", params={"max_lag": 0})
            return r.status_code == 200 and r.json()["value"] == {"orders": 2, "total": 20.0}

        wait_until(served, FIRST_DATA_TIMEOUT_S, "ada's orders to be served", stack=stack)
        # bob's row is another partition's (and may come from another input partition): waited for on its own.
        wait_until(lambda: http.get("/v1/tables/customer_totals/keys/bob", params={"max_lag": 0}).status_code == 200,
                   60, "bob's order to be served", stack=stack)
        assert http.get("/v1/tables/customer_totals/keys/bob").json()["value"] == {"orders": 1, "total": 3.0}
        assert http.get("/v1/tables/sensor_stats/keys/sensor-1").json()["error"]["code"] == "TABLE_NOT_FOUND"


def totals(orders: list[tuple[int, float]], at: int) -> dict | None:
    """A customer's row recomputed from its orders (time, amount) up to ``at``: None before the first and from the
    sixth on (the table deletes it)."""
    seen = [amount for t, amount in orders if t <= at]
    return {"orders": len(seen), "total": sum(seen)} if 0 < len(seen) < 6 else None


@pytest.mark.timeout(900)
def test_a_versioned_pipeline_table_answers_as_of_any_time_as_a_recomputation_of_its_input(orders_stack):
    """Each customer's orders at times of their own (in the past, one input partition a customer): in Real-time Mode
    every order is a version at its own time, so an answer as of any time is the recomputation of the orders up to
    it; in micro-batches a version reflects a batch's orders, at the time of the latest, and equals the recomputation
    as of that time."""
    stack, _, _ = orders_stack
    c = stack.config
    rng = random.Random(64)
    base = int(time.time() * 1000) - 3_600_000
    orders: dict[str, list[tuple[int, float]]] = {}
    for i in range(8):
        t = base + rng.randrange(60_000)
        orders[f"c-{i}"] = []
        for _ in range(rng.randrange(1, 8)):
            orders[f"c-{i}"].append((t, rng.randrange(1, 200) / 2))
            t += rng.randrange(2, 120_000)
    producer = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 5})
    # In three bursts a second or more apart, each customer's orders in time order (one partition, produced in order
    # and each burst acknowledged before the next): the micro-batch table sees several batches.
    for burst in range(3):
        for customer, made in orders.items():
            for n, (t, amount) in enumerate(made):
                if n * 3 // len(made) == burst:
                    producer.produce("orders", key=customer.encode(), timestamp=t, value=orjson.dumps(
                        {"order_id": f"{customer}-{n}", "customer": customer, "amount": amount}))
        assert producer.flush(10) == 0
        if burst < 2:  # after the last, the wait for every customer's totals below
            time.sleep(1.5)
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    for table in TABLES:
        # Compaction keeps the history a restore reads.
        assert topic_config(admin, f"{c.topic_prefix}{table}-changelog")["min.compaction.lag.ms"] == str(8 * DAY_MS)
    with httpx.Client(base_url=c.rest_url, timeout=10) as http:
        def caught_up() -> bool:
            for table in TABLES:
                for customer, made in orders.items():
                    r = http.get(f"/v1/tables/{table}/keys/{customer}", params={"max_lag": 0})
                    want = totals(made, made[-1][0])
                    if (r.status_code, r.json().get("value")) != ((404, None) if want is None else (200, want)):
                        return False
            return True

        wait_until(caught_up, 120, "every customer's latest totals in both tables", stack=stack)
        checked = 0
        for customer, made in orders.items():
            for t in sorted({t + d for t, _ in made for d in (-1, 0, 1)} | {base - 1}):
                want = totals(made, t)
                r = http.get(f"/v1/tables/customer_totals/keys/{customer}", params={"as_of": t})
                body = r.json()
                if want is None:
                    assert r.status_code == 404 and body["error"]["code"] == "KEY_NOT_FOUND", (customer, t, body)
                else:
                    assert r.status_code == 200 and body["value"] == want and body["final"], (customer, t, body)
                    assert body["valid_from"] == max(o for o, _ in made if o <= t), (customer, t, body)
                checked += 1
            # The micro-batch table's versions: each the recomputation as of its time, the newest the latest.
            versions = http.get(f"/v1/tables/customer_totals_mb/keys/{customer}/versions").json()["versions"]
            assert versions and all(v["valid_from"] in {t for t, _ in made} for v in versions), (customer, versions)
            assert [v["value"] for v in versions] == [totals(made, v["valid_from"]) for v in versions], customer
            assert versions[0]["value"] == totals(made, made[-1][0])
            for v in versions:
                got = http.get(f"/v1/tables/customer_totals_mb/keys/{customer}", params={"as_of": v["valid_from"]})
                assert (got.json().get("value") if got.status_code == 200 else None) == v["value"], (customer, v)
        print(f"AS_OF: {checked} reads of the Real-time table")

"""Your own tables on the local stack: ``freshroute local up --tables-file FILE`` runs them instead of the demo's,
creates their sources' topics, returns once the pipeline has registered them, and serves what you produce."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import httpx
import orjson
import pytest
from confluent_kafka import Producer

from tools.local.stack import Stack
from tests.integration.stack_fixture import FIRST_DATA_TIMEOUT_S, discard, wait_until

pytestmark = pytest.mark.integration

ORDERS = textwrap.dedent('''
    from pipeline.tables import source, sql_table

    source("orders", schema="order_id STRING, customer STRING, amount DOUBLE")
    sql_table(name="customer_totals", key="customer", source="orders",
              sql="SELECT customer, count(*) AS orders, sum(amount) AS total FROM orders GROUP BY customer")
''')


def freshroute(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.timeout(900)
def test_local_up_serves_a_tables_file_of_your_own(tmp_path):
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
        assert "customer_totals registered: produce to orders" in done.stdout, done.stdout[-3000:]
        assert "demo-producer" not in stack.components
        # `up`'s steps, as `./dev up` takes them: within twice their budgets even on a busy machine.
        assert [step.name for step in stack.steps] == ["broker", "redis", "store nodes", "routers",
                                                      "pipeline to its tables registered"]
        assert not stack.over_budget(2), [(s.name, s.seconds, s.budget_s) for s in stack.steps]
        status = json.loads(freshroute("local", "status", "--home", str(home), "--json").stdout)
        assert status["tables_file"] == str(path.resolve())

        c = stack.config
        with httpx.Client(base_url=c.rest_url, timeout=10) as http:
            # Ready means registered: the table is listed before any order exists.
            assert [t["name"] for t in http.get("/v1/tables").json()["tables"]] == ["customer_totals"]
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
            assert http.get("/v1/tables/customer_totals/keys/bob").json()["value"] == {"orders": 1, "total": 3.0}
            assert http.get("/v1/tables/sensor_stats/keys/sensor-1").json()["error"]["code"] == "TABLE_NOT_FOUND"
    finally:
        if (home / "state.json").exists():
            discard(Stack.load(home))

"""The client alone: ``pip install 'freshroute[client]'`` into a fresh virtual environment brings the client and its
few dependencies, nothing of the server's, and reads the shared stack from a process that has only that install."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.stack_fixture import produce_and_serve, same_stats

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
# What the server runs on and a client must not bring: Spark, RocksDB, the web servers, Kafka's client, gRPC.
SERVER_ONLY = ("pyspark", "pyarrow", "pandas", "rocksdict", "fastapi", "uvicorn", "confluent_kafka", "pydantic", "grpc")

READ = """
import asyncio, importlib.util, json, sys
from freshroute.client import AsyncClient, Client
redis_url, namespace, router, *keys = sys.argv[1:]
with Client(redis_url=redis_url, namespace=namespace) as c:
    direct = {k: c.get("sensor_stats", k).value for k in keys}
async def via_router():
    async with AsyncClient(router=router) as c:
        return {r.key: r.value for r in await c.get_many("sensor_stats", keys)}
print(json.dumps({"direct": direct, "router": asyncio.run(via_router()),
                  "importable": [m for m in %r if importlib.util.find_spec(m)]}))
"""


@pytest.fixture(scope="module")
def client_python(tmp_path_factory) -> Path:
    """A virtual environment with the wheel built from this tree, installed with the ``client`` extra."""
    d = tmp_path_factory.mktemp("client-install")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", str(d / "dist"), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((d / "dist").glob("freshroute-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(d / "venv")], check=True, timeout=120)
    python = d / "venv" / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                f"freshroute[client] @ {wheel.as_uri()}"], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return python


def test_the_client_install_brings_no_server_dependency_and_reads_the_stack(stack, client_python, tmp_path):
    rng = random.Random(31)
    events = [{"sensor": f"sensor-{i % 6}", "area": "hold", "reading": round(rng.uniform(0, 50), 2)} for i in range(60)]
    expected = produce_and_serve(stack, events)

    listed = subprocess.run([str(client_python), "-m", "pip", "list", "--format", "json"], capture_output=True,
                            text=True, timeout=60, check=True)
    names = {p["name"].lower().replace("-", "_") for p in json.loads(listed.stdout)}
    assert "freshroute" in names and not names & set(SERVER_ONLY), sorted(names)

    c = stack.config
    keys = [f"sensor-{i}" for i in range(6)]
    # From a directory of its own with no PYTHONPATH: the installed package, not this tree, is imported.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(client_python), "-c", READ % (SERVER_ONLY,), c.redis_url, c.namespace, c.rest_url,
                           *keys], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["importable"] == []
    for way in ("direct", "router"):
        assert set(got[way]) == set(keys) and all(same_stats(got[way][k], expected[k]) for k in keys), (way, got)

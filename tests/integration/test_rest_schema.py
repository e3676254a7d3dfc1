"""The REST API answers what its OpenAPI document says, as schemathesis checks it (`--checks all`).

A real router process over real Redis and three real store nodes; schemathesis generates
valid and invalid requests for every operation from the router's own /openapi.json, within
a bounded number of examples and time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from .router_deployment import HISTORY_MS, KEYS, ROOT, TABLE, WINDOWED, Deployment, Procs

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no Spark, no shared stack: runs beside the others

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, broker, redis_service):
    d = Deployment(Procs(tmp_path_factory.mktemp("schema")), broker, redis_service.address, f"t{uuid.uuid4().hex[:10]}")
    try:
        d.up()
        yield d
    finally:
        d.procs.stop_all()


def test_the_rest_api_keeps_to_its_openapi_document(deployment, tmp_path):
    assert SCHEMATHESIS.exists(), "schemathesis is a test dependency (pyproject's test extras)"
    run = subprocess.run(
        [str(SCHEMATHESIS), "--config-file", str(Path(__file__).with_name("schemathesis.toml")), "run",
         f"{deployment.rest}/openapi.json", "--checks", "all",
         "--max-examples", "30", "--seed", "1", "--workers", "1",
         "--request-timeout", "10", "--no-color", "--output-truncate", "true", "--report-dir", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=400,
        env={**os.environ, "PYTHONPATH": str(ROOT), "SCHEMATHESIS_HOOKS": "tests.integration.schema_hooks",
             "FRESHROUTE_SCHEMA_TABLE": TABLE, "FRESHROUTE_SCHEMA_WINDOWED": WINDOWED,
             "FRESHROUTE_SCHEMA_KEYS": str(KEYS), "FRESHROUTE_SCHEMA_HISTORY_MS": str(HISTORY_MS)})
    assert run.returncode == 0 and "No issues found" in run.stdout, run.stdout[-20_000:] + run.stderr[-5_000:]

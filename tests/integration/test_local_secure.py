"""``local up --secure``: routers with TLS and tokens, and the examples it prints work as printed."""

from __future__ import annotations

import os
import random
import ssl
import subprocess

import httpx
import pytest

from freshroute.local.stack import _print_examples
from tests.integration.stack_fixture import (FIRST_DATA_TIMEOUT_S, expected_sensor_stats, produce_readings,
                                             start_stack, wait_until)

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("secure"), routers=1, secure=True)
    yield s
    s.down()


def test_a_secure_stack_serves_over_tls_with_tokens_and_its_printed_examples_work(stack, capsys):
    status = stack.status()
    secure = status["router"]["secure"]
    assert status["router"]["rest"].startswith("https://") and set(secure["tokens"]) == {"reader", "admin"}
    auth_text = open(secure["auth_file"]).read()
    assert all(token not in auth_text for token in secure["tokens"].values())  # hashes only
    assert oct(os.stat(secure["auth_file"]).st_mode & 0o777) == "0o600"

    rng = random.Random(9)
    events = [{"sensor": f"sensor-{rng.randrange(5)}", "area": "cabin", "reading": 1.0} for _ in range(100)]
    produce_readings(stack, events)
    with httpx.Client(base_url=stack.config.rest_url, verify=ssl.create_default_context(cafile=secure["ca"]), timeout=10,
                      headers={"authorization": f"Bearer {secure['tokens']['admin']}"}) as admin:
        wait_until(lambda: admin.get("/v1/tables/sensor_stats/keys/sensor-1").status_code == 200,
                   FIRST_DATA_TIMEOUT_S, "sensor-1 to be served")
        assert admin.get("/v1/tables/sensor_stats/keys/sensor-1").json()["value"]["count"] == \
            expected_sensor_stats(events)["sensor-1"]["count"]

    capsys.readouterr()
    _print_examples(stack.config)
    printed = capsys.readouterr().out
    lines = [line.strip() for line in printed.splitlines() if line.strip()]
    assignments = [line.split("#")[0].strip() for line in lines if line.startswith(("READER=", "ADMIN="))]
    commands = [line.split("   #")[0] for line in lines if line.startswith(("curl ", ".venv/bin/freshroute lookup"))]
    assert len(assignments) == 2 and len(commands) == 5, printed
    outputs = []
    for command in commands:
        run = subprocess.run(["bash", "-c", "; ".join([*assignments, command])], capture_output=True, text=True,
                             timeout=60, cwd=REPO)
        outputs.append((command, run.returncode, run.stdout + run.stderr))
    (c1, rc1, out1), (c2, rc2, out2), (c3, rc3, out3), (c4, rc4, out4), (c5, rc5, out5) = outputs
    assert rc1 == 0 and '"key":"sensor-1"' in out1, (c1, out1)
    assert rc2 == 0 and "PERMISSION_DENIED" in out2, (c2, out2)
    assert rc3 == 0 and '"nodes"' in out3, (c3, out3)
    assert rc4 == 0 and '"key":"sensor-1"' in out4, (c4, out4)
    assert rc5 == 0 and '"key":"sensor-1"' in out5, (c5, out5)

"""``local up --secure``: routers with TLS and tokens, store nodes with TLS and the cluster secret, and the
examples it prints work as printed."""

from __future__ import annotations

import os
import random
import ssl
import subprocess

import httpx
import pytest

from tools.local.stack import _print_examples
from tests.integration.data_plane_support import metrics
from tests.integration.stack_fixture import (FIRST_DATA_TIMEOUT_S, expected_sensor_stats, produce_readings,
                                             start_stack, wait_until)

pytestmark = [pytest.mark.integration, pytest.mark.beside]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("secure"), routers=1, secure=True)
    yield s
    s.discard()


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
        # Each reading changes the row as it comes: the count grows to its whole.
        want = expected_sensor_stats(events)["sensor-1"]["count"]

        def counted() -> bool:
            r = admin.get("/v1/tables/sensor_stats/keys/sensor-1")
            return r.status_code == 200 and r.json()["value"]["count"] == want

        wait_until(counted, FIRST_DATA_TIMEOUT_S, "sensor-1 to be served with every reading", stack=stack)

    capsys.readouterr()
    _print_examples(stack.config)
    printed = capsys.readouterr().out
    lines = [line.strip() for line in printed.splitlines() if line.strip()]
    assignments = [line.split("#")[0].strip() for line in lines if line.startswith(("READER=", "ADMIN="))]
    commands = [line.split("   #")[0] for line in lines if line.startswith(("curl ", ".venv/bin/freshroute lookup"))]
    assert len(assignments) == 2 and len(commands) == 6, printed
    outputs = []
    for command in commands:
        run = subprocess.run(["bash", "-c", "; ".join([*assignments, command])], capture_output=True, text=True,
                             timeout=60, cwd=REPO)
        outputs.append((command, run.returncode, run.stdout + run.stderr))
    (c1, rc1, out1), (c2, rc2, out2), (c3, rc3, out3), (c4, rc4, out4), (c5, rc5, out5), (c6, rc6, out6) = outputs
    assert rc1 == 0 and '"key":"sensor-1"' in out1, (c1, out1)
    assert rc2 == 0 and "PERMISSION_DENIED" in out2, (c2, out2)
    assert rc3 == 0 and '"nodes"' in out3, (c3, out3)
    assert rc4 == 0 and '"key":"sensor-1"' in out4, (c4, out4)
    assert rc5 == 0 and '"key":"sensor-1"' in out5, (c5, out5)
    assert rc6 == 0 and '"key":"sensor-1"' in out6 and '"node":"node-' in out6, (c6, out6)


def test_the_routers_compiled_path_reads_the_store_nodes_over_tls(stack):
    """REST lookups and gRPC Gets are answered by the compiled path, which reaches the nodes' read ports over TLS
    with the cluster secret: none relayed to the Python path."""
    import grpc

    from proto import router_pb2, router_pb2_grpc

    secure = stack.status()["router"]["secure"]
    log = (stack.config.home / "logs" / "router.log").read_text()
    assert "REST lookups by the compiled path (gRPC's Router.Get too)" in log, log[-2000:]
    produce_readings(stack, [{"sensor": "sensor-3", "area": "cabin", "reading": 3.0}])
    token = secure["tokens"]["admin"]
    verify = ssl.create_default_context(cafile=secure["ca"])

    def relayed() -> dict[str, float]:
        """The requests and calls the compiled path relayed, asked on a connection of its own (a /metrics request
        hands its connection over to the Python front, counted as handed over)."""
        return {name: value for name, value in metrics(stack.config.rest_url, token, verify).items()
                if name.startswith("freshroute_router_compiled_path_handoffs_total") and "handed_over" not in name}

    with httpx.Client(base_url=stack.config.rest_url, verify=verify, timeout=10,
                      headers={"authorization": f"Bearer {token}"}) as admin:
        wait_until(lambda: admin.get("/v1/tables/sensor_stats/keys/sensor-3").status_code == 200, FIRST_DATA_TIMEOUT_S,
                   "sensor-3 to be served", stack=stack)
        before = relayed()
        assert before, "the compiled path's counters are among the router's metrics"
        for _ in range(20):
            r = admin.get("/v1/tables/sensor_stats/keys/sensor-3")
            assert r.status_code == 200 and r.json()["value"]["count"] >= 1
        ca = open(secure["ca"], "rb").read()
        with grpc.secure_channel(stack.config.grpc_address, grpc.ssl_channel_credentials(ca)) as channel:
            got = router_pb2_grpc.RouterStub(channel).Get(router_pb2.GetRequest(table="sensor_stats", key="sensor-3"),
                                                          metadata=(("authorization", f"Bearer {token}"),), timeout=10)
        assert got.found and got.served_by.node.startswith("node-")
        assert relayed() == before, "every lookup and Get answered by the compiled path"


def test_store_node_ports_serve_only_peers_with_tls_and_the_cluster_secret(stack):
    import grpc

    from freshroute.client import Client
    from freshroute.errors import ReplicaUnavailable
    from proto import store_pb2, store_pb2_grpc

    secure = stack.status()["router"]["secure"]
    secret = open(secure["cluster_secret_file"]).read().strip()
    produce_readings(stack, [{"sensor": "sensor-2", "area": "cabin", "reading": 2.0}])
    with Client(redis_url=stack.config.redis_url, namespace=stack.config.namespace, ca=secure["ca"],
                cluster_secret=secret) as trusted:
        wait_until(lambda: trusted.get("sensor_stats", "sensor-2").found, FIRST_DATA_TIMEOUT_S, "sensor-2 to be served", stack=stack)
        nodes = list(trusted._async.metadata.current.nodes.values())
    assert len(nodes) == 3 and all(n.read_address for n in nodes)

    # The real client without the secret: every node refuses it, naming why.
    with Client(redis_url=stack.config.redis_url, namespace=stack.config.namespace, ca=secure["ca"]) as outsider:
        with pytest.raises(ReplicaUnavailable) as refused:
            outsider.get("sensor_stats", "sensor-2")
        assert "cluster secret is missing or wrong" in refused.value.message
    # Plaintext to a TLS read port: the handshake fails and nothing is answered.
    import socket

    from freshroute.wire import frame

    host, port = nodes[0].read_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        read = store_pb2.ReadBatch(cluster_secret=secret, reads=[store_pb2.KeyRead(
            id=1, table="sensor_stats", partition=0, key=b"sensor-2")])
        sock.sendall(frame(read.SerializeToString()))
        answer = sock.recv(65536)
        assert b"sensor-2" not in answer and b"count" not in answer
    # gRPC over TLS without the secret: UNAUTHENTICATED; with it: served.
    ca = open(secure["ca"], "rb").read()
    with grpc.secure_channel(nodes[0].address, grpc.ssl_channel_credentials(ca)) as channel:
        stub = store_pb2_grpc.StoreNodeStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Status(store_pb2.StatusRequest(), timeout=10)
        assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
        status = stub.Status(store_pb2.StatusRequest(), timeout=10,
                             metadata=(("x-freshroute-cluster-secret", secret),))
        assert status.node == nodes[0].node and len(status.replicas) > 0


def test_the_console_over_tls_asks_for_a_token_and_works_with_one_allowed_to_see_the_cluster(stack):
    from tests.integration.browser import browser_page

    tokens = stack.status()["router"]["secure"]["tokens"]
    # The stack's CA is not the browser's: the page is reached over the same TLS port as the API all the same.
    with browser_page(f"{stack.config.rest_url}/console", ignore_https_errors=True) as console:
        page = console.page
        state = lambda: page.get_attribute("#connection", "data-state")  # noqa: E731
        console.wait_for(lambda: state() == "unauthenticated", 10, "that a token is needed")
        assert page.is_visible("#login") and not page.is_visible("#main")
        assert "asks for a token" in page.inner_text("#login-reason")
        # A reader of one table may not see the cluster: said plainly, and asked again.
        page.fill("#token", tokens["reader"])
        page.click("#login-form button[type=submit]")
        console.wait_for(lambda: "PERMISSION_DENIED" in page.inner_text("#login-reason"), 10, "the reader refused")
        page.fill("#token", "not-a-token")
        page.click("#login-form button[type=submit]")
        console.wait_for(lambda: "401 UNAUTHENTICATED" in page.inner_text("#login-reason"), 10, "a bad token refused")
        page.fill("#token", tokens["admin"])
        page.click("#login-form button[type=submit]")
        console.wait_for(lambda: state() == "live" and len(page.query_selector_all("#nodes tbody tr")) == 3, 10,
                         "the cluster with the admin's token")
        assert not page.is_visible("#login")
        # The token is the page's alone: nothing is stored for a later visit.
        assert page.evaluate("localStorage.length + sessionStorage.length + document.cookie.length") == 0

"""TLS and mTLS on a real router's REST and gRPC ports, with httpx, curl and grpcio as the clients.

A throwaway CA signs the router's certificate and the clients'. Checked: HTTPS and gRPC over
TLS (ALPN h2) answer, for the call the gRPC front answers itself and for a relayed one; a
client trusting another CA, and plaintext to a TLS port, are refused; with ``--tls-client-ca``
a client without a certificate, or with an expired or not-yet-valid one, is refused and one
with a valid certificate is served, and its subject can name a principal of the auth file on
every path; SIGHUP puts a new certificate in use for new connections;
broken files stop the router at start, naming them.
"""

from __future__ import annotations

import datetime as dt
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys

import grpc
import httpx
import pytest

from tools.local.certs import issue, make_ca
from proto import router_pb2, router_pb2_grpc
from tests.integration.stack_fixture import produce_and_serve, restart_router, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d)
    other_ca = make_ca(d, "other-ca", "someone else's CA")
    now = dt.datetime.now(dt.timezone.utc)
    return {"dir": d, "ca": ca, "other_ca": other_ca,
            "server": issue(ca, d, "server", "router", hosts=("127.0.0.2", "127.0.0.1", "localhost")),
            "client": issue(ca, d, "client", "dashboards", server=False),
            "expired": issue(ca, d, "expired", "old", server=False, valid_from=now - dt.timedelta(days=10),
                             valid_days=1),
            "future": issue(ca, d, "future", "early", server=False, valid_from=now + dt.timedelta(days=1)),
            "stranger": issue(other_ca, d, "stranger", "stranger", server=False)}


@pytest.fixture(scope="module")
def stack(stack):
    """The shared stack, its router plain again after this module's tests restarted it with TLS."""
    rng = random.Random(5)
    events = [{"sensor": f"sensor-{rng.randrange(10)}", "area": "cabin", "reading": round(rng.uniform(0, 9), 2)}
              for _ in range(200)]
    produce_and_serve(stack, events)
    yield stack
    restart_router(stack)


def https(stack, pki, verify: ssl.SSLContext | None = None, cert: tuple[str, str] | None = None) -> httpx.Client:
    ctx = verify or ssl.create_default_context(cafile=str(pki["ca"].cert))
    if cert:
        ctx.load_cert_chain(*cert)
    return httpx.Client(base_url=stack.config.rest_url.replace("http://", "https://"), timeout=10, verify=ctx)


def grpc_get(stack, credentials, table: str = "sensor_stats") -> grpc.StatusCode:
    channel = grpc.secure_channel(stack.config.grpc_address, credentials) if credentials else \
        grpc.insecure_channel(stack.config.grpc_address)
    with channel:
        stub = router_pb2_grpc.RouterStub(channel)
        try:
            stub.Get(router_pb2.GetRequest(table=table, key="sensor-1"), timeout=5)
            stub.BatchGet(router_pb2.BatchGetRequest(table=table, keys=["sensor-1", "sensor-2"]), timeout=5)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()


def test_tls_serves_trusting_clients_and_refuses_others(stack, pki):
    p = pki
    restart_router(stack, "--tls-cert", str(p["server"].cert), "--tls-key", str(p["server"].key))
    with https(stack, pki) as client:
        r = client.get("/v1/tables/sensor_stats/keys/sensor-1")
        assert r.status_code == 200 and r.json()["key"] == "sensor-1"
    curl = subprocess.run(["curl", "-sS", "--cacert", str(p["ca"].cert),
                           f"{stack.config.rest_url.replace('http://', 'https://')}/v1/tables/sensor_stats/keys/sensor-1"],
                          capture_output=True, text=True, timeout=30)
    assert curl.returncode == 0 and '"key":"sensor-1"' in curl.stdout, curl.stderr
    ca_pem = p["ca"].cert.read_bytes()
    assert grpc_get(stack, grpc.ssl_channel_credentials(root_certificates=ca_pem)) is grpc.StatusCode.OK

    # A client that trusts another CA: the handshake fails.
    with https(stack, pki, verify=ssl.create_default_context(cafile=str(p["other_ca"].cert))) as client:
        with pytest.raises(httpx.ConnectError):
            client.get("/healthz")
    other = grpc.ssl_channel_credentials(root_certificates=p["other_ca"].cert.read_bytes())
    assert grpc_get(stack, other) is grpc.StatusCode.UNAVAILABLE
    # Plaintext to a TLS port: refused, nothing served.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{stack.config.rest_url}/v1/tables/sensor_stats/keys/sensor-1", timeout=5)
    assert grpc_get(stack, None) is grpc.StatusCode.UNAVAILABLE


def test_mtls_serves_clients_with_a_valid_certificate_only(stack, pki):
    p = pki
    restart_router(stack, "--tls-cert", str(p["server"].cert), "--tls-key", str(p["server"].key),
                   "--tls-client-ca", str(p["ca"].cert))
    with https(stack, pki, cert=(str(p["client"].cert), str(p["client"].key))) as client:
        assert client.get("/v1/tables/sensor_stats/keys/sensor-1").status_code == 200
    ca_pem = p["ca"].cert.read_bytes()
    with_cert = grpc.ssl_channel_credentials(ca_pem, p["client"].key.read_bytes(), p["client"].cert.read_bytes())
    assert grpc_get(stack, with_cert) is grpc.StatusCode.OK

    for name in ("expired", "future", "stranger", None):
        cert = (str(p[name].cert), str(p[name].key)) if name else None
        with https(stack, pki, cert=cert) as client:
            with pytest.raises(httpx.HTTPError):
                client.get("/v1/tables/sensor_stats/keys/sensor-1")
        creds = grpc.ssl_channel_credentials(ca_pem, p[name].key.read_bytes(), p[name].cert.read_bytes()) if name \
            else grpc.ssl_channel_credentials(ca_pem)
        assert grpc_get(stack, creds) is grpc.StatusCode.UNAVAILABLE, name



def test_a_client_certificates_subject_names_a_principal_on_every_path(stack, pki, tmp_path):
    import json

    from router.auth import token_hash

    p = pki
    ops = issue(p["ca"], p["dir"], "ops", "ops", server=False)
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"principals": [
        {"name": "dashboards", "certificate_subject": "CN=dashboards", "tables": ["sensor_stats"]},
        {"name": "admin", "token_sha256": token_hash("admin-token-of-the-test"), "tables": ["*"], "cluster": True}]}))
    restart_router(stack, "--tls-cert", str(p["server"].cert), "--tls-key", str(p["server"].key),
                   "--tls-client-ca", str(p["ca"].cert), "--auth-file", str(auth))
    # REST: the key route (the HTTP/1.1 fast path) and uvicorn's routes, with no token.
    with https(stack, pki, cert=(str(p["client"].cert), str(p["client"].key))) as dashboards:
        assert dashboards.get("/v1/tables/sensor_stats/keys/sensor-1").json()["key"] == "sensor-1"
        assert dashboards.get("/v1/tables/area_counts/keys/cabin").status_code == 403
        assert [t["name"] for t in dashboards.get("/v1/tables").json()["tables"]] == ["sensor_stats"]
        assert dashboards.get("/v1/tables/sensor_stats/scan", params={"limit": 2}).status_code == 200
        assert dashboards.get("/v1/cluster").status_code == 403
    with https(stack, pki, cert=(str(ops.cert), str(ops.key))) as unnamed:
        r = unnamed.get("/v1/tables/sensor_stats/keys/sensor-1")
        assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"
        assert unnamed.get("/v1/tables").status_code == 401
        # A token, when sent, decides.
        assert unnamed.get("/v1/cluster", headers={"authorization": "Bearer admin-token-of-the-test"}).status_code == 200

    # gRPC: Get answered by the front, BatchGet and ListTables relayed to grpc.aio.
    ca_pem = p["ca"].cert.read_bytes()

    def calls(cert, metadata=()):
        creds = grpc.ssl_channel_credentials(ca_pem, cert.key.read_bytes(), cert.cert.read_bytes())
        out = []
        with grpc.secure_channel(stack.config.grpc_address, creds) as channel:
            stub = router_pb2_grpc.RouterStub(channel)
            for call in (lambda: stub.Get(router_pb2.GetRequest(table="sensor_stats", key="sensor-1"), timeout=5,
                                          metadata=metadata),
                         lambda: stub.Get(router_pb2.GetRequest(table="area_counts", key="cabin"), timeout=5,
                                          metadata=metadata),
                         lambda: stub.BatchGet(router_pb2.BatchGetRequest(table="sensor_stats", keys=["sensor-1"]),
                                               timeout=5, metadata=metadata),
                         lambda: [t.name for t in stub.ListTables(router_pb2.ListTablesRequest(), timeout=5,
                                                                  metadata=metadata).tables]):
                try:
                    result = call()
                    out.append(result if isinstance(result, list) else grpc.StatusCode.OK)
                except grpc.RpcError as e:
                    out.append(e.code())
        return out

    OK, DENIED, UNAUTHENTICATED = grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED
    assert calls(p["client"]) == [OK, DENIED, OK, ["sensor_stats"]]
    assert calls(ops) == [UNAUTHENTICATED] * 4
    # A client cannot claim a subject with the relay's own metadata: the front drops it.
    spoof = (("x-freshroute-client-subject", "CN=dashboards"), ("x-freshroute-relay-key", "guess"))
    assert calls(ops, spoof) == [UNAUTHENTICATED] * 4


def test_sighup_puts_a_new_certificate_in_use_for_new_connections(stack, pki, tmp_path):
    p = pki
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(p["server"].cert, live / "server.crt")
    shutil.copy(p["server"].key, live / "server.key")
    restart_router(stack, "--tls-cert", str(live / "server.crt"), "--tls-key", str(live / "server.key"))
    host, port = stack.config.rest_url.removeprefix("http://").rsplit(":", 1)

    def serial() -> int:
        ctx = ssl.create_default_context(cafile=str(p["ca"].cert))
        with socket.create_connection((host, int(port)), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            from cryptography import x509

            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number

    before = serial()
    renewed = issue(p["ca"], tmp_path, "renewed", "router", hosts=("127.0.0.2", "127.0.0.1", "localhost"))
    shutil.copy(renewed.cert, live / "server.crt")
    shutil.copy(renewed.key, live / "server.key")
    stack.signal("router", signal.SIGHUP)
    wait_until(lambda: serial() != before, 10, "the renewed certificate in use")
    (live / "server.key").write_text("not a key")
    stack.signal("router", signal.SIGHUP)
    log = stack.components["router"].log
    wait_until(lambda: "TLS files not reloaded" in open(log).read(), 10, "the broken key to be refused")
    from cryptography import x509

    assert serial() == x509.load_pem_x509_certificate(renewed.cert.read_bytes()).serial_number


@pytest.mark.parametrize("flags, says", [
    (lambda p: ["--tls-cert", str(p["server"].cert), "--tls-key", str(p["client"].key)],
     "tls_cert/tls_key: "),
    (lambda p: ["--tls-cert", str(p["server"].cert), "--tls-key", str(p["server"].key),
                "--tls-client-ca", str(p["server"].key)], "tls_client_ca: "),
    (lambda p: ["--tls-cert", str(p["server"].cert)], "tls_cert and tls_key go together"),
])
def test_broken_tls_files_stop_the_router_at_start_naming_them(pki, flags, says):
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "router", "--rest-port", "0", "--grpc-port", "0",
                           *flags(pki)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "CONFIG_ERROR" in proc.stderr and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

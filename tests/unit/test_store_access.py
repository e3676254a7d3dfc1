"""A store node's ports closed to outsiders: its real read port (read by the routing core's real store client) and
gRPC server (its status), with TLS, the cluster secret and mTLS, on loopback."""

from __future__ import annotations

import asyncio
from types import MappingProxyType, SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from freshroute.cluster_access import SECRET_METADATA, NodeAccess, read_secrets
from freshroute.errors import ConfigError, ReplicaUnavailable
from tools.local.certs import issue, make_ca
from freshroute.bound import NO_BOUND
from freshroute.metadata.roles import Role
from freshroute.metadata.tables import TableSpec
from freshroute.routing.store import StoreNodeClient
from freshroute.wire import ReadStatus
from freshroute.tls import ClientTLS, ServerTLS
from proto import store_pb2, store_pb2_grpc
from store_node.access import ClusterSecret
from store_node.read_port import ReadPort
from store_node.read_port_front import start_read_port
from store_node.replica import Replica
from store_node.replica_store import ReplicaStore
from store_node.service import HealthReporter, StoreNodeService, create_server
from store_node.settings import StoreNodeSettings

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("one_event_loop")]

SPEC = TableSpec("users", "users-changelog", 4, "id")
SECRET = "s3cret-of-the-cluster-0123456789"


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio", {"use_uvloop": True}


@pytest.fixture(params=["compiled", "python"])
def front(request):
    """Each front of the read port (store_node/read_port_front.py)."""
    return request.param


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d)
    other = make_ca(d, "other-ca", "someone else's CA")
    return SimpleNamespace(ca=ca, other=other, node=issue(ca, d, "node", "node-1"),
                           client=issue(ca, d, "client", "router-1", server=False),
                           stranger=issue(other, d, "stranger", "stranger", server=False))


class Node:
    """A node's two ports over one real replica store, with the access settings given."""

    def __init__(self, tmp_path, pki, *, front: str, secret: bool = True, tls: bool = True, mtls: bool = False) -> None:
        self.tmp_path, self.pki, self.with_secret, self.tls, self.mtls = tmp_path, pki, secret, tls, mtls
        self.front = front

    async def __aenter__(self) -> "Node":
        store = ReplicaStore.open(self.tmp_path / "users" / "1")
        store.apply([(b"alice", b'{"age":31}')], 10)
        self.rep = Replica(SPEC, 1, Role.ACTIVE, store, lambda: 0, evidence_window_ms=1000, caught_up_threshold=0)
        node = SimpleNamespace(node_id="n1", serving=MappingProxyType({("users", 1): self.rep}), draining=False)
        self.service = StoreNodeService(node, lambda: 0)
        self.reads = ReadPort(node, lambda: 0)
        self.secret_file = self.tmp_path / "cluster.secret"
        self.secret_file.write_text(f"# the cluster's\n{SECRET}\n")
        self.secret = ClusterSecret(self.secret_file if self.with_secret else None)
        files = dict(tls_cert=self.pki.node.cert, tls_key=self.pki.node.key) if self.tls else {}
        if self.mtls:
            files["tls_client_ca"] = self.pki.ca.cert
        settings = StoreNodeSettings(node_id="n1", host="127.0.0.1", port=0, **files)
        self.grpc, port = create_server(settings, self.service, HealthReporter(lambda: True), self.secret,
                                        settings.server_tls(("h2",)))
        await self.grpc.start()
        read_tls = settings.server_tls()
        self.read_door = await start_read_port(self.reads, "127.0.0.1", 0, self.secret, read_tls, self.front)
        assert self.read_door.front == self.front
        self.address, self.read_address = f"127.0.0.1:{port}", f"127.0.0.1:{self.read_door.port}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.read_door.close()
        await self.grpc.stop(None)
        self.rep.close()


def access(pki, *, secret: str = SECRET, ca=None, cert=None) -> NodeAccess:
    cert = cert or SimpleNamespace(cert=None, key=None)
    return NodeAccess(secret, ClientTLS(ca if ca is not None else pki.ca.cert, cert.cert, cert.key))


async def read(node: Node, how: NodeAccess, port: str = "read_port"):
    """A read on the read port, or the status call on the gRPC port: each door, as ``how`` knocks on it."""
    if port == "grpc":
        return await status(node, how)
    client = StoreNodeClient(access=how)
    client.track({node.address: node.read_address})
    try:
        return await asyncio.wait_for(client.read(node.address, "users", 1, b"alice", NO_BOUND), 5)
    finally:
        await client.close()


async def status(node: Node, how: NodeAccess) -> store_pb2.NodeStatus:
    """The node's status over gRPC; a refusal or a failed handshake as the store client reports them."""
    tls = how.tls if how.tls is not None and how.tls.enabled else None
    channel = grpc.aio.secure_channel(node.address, tls.grpc_credentials()) if tls \
        else grpc.aio.insecure_channel(node.address)
    async with channel:
        try:
            return await store_pb2_grpc.StoreNodeStub(channel).Status(
                store_pb2.StatusRequest(), timeout=5, metadata=((SECRET_METADATA, how.secret),) if how.secret else ())
        except grpc.aio.AioRpcError as e:
            raise ReplicaUnavailable(f"store node {node.address}: {e.code().name}: {e.details()}") from None


def answered(got) -> bool:
    """A read answered OK, or the node's status with its replica."""
    if isinstance(got, store_pb2.NodeStatus):
        return got.node == "n1" and list(got.tables) == ["users/1"]
    return got.status is ReadStatus.OK


@pytest.mark.parametrize("port", ["read_port", "grpc"])
async def test_a_peer_with_the_secret_over_tls_reads(tmp_path, pki, front, port):
    async with Node(tmp_path, pki, front=front) as node:
        got = await read(node, access(pki), port)
        assert answered(got)
        if port == "read_port":
            assert got.value == b'{"age":31}' and got.replica.node == "n1"
            client = StoreNodeClient(access=access(pki))
            client.track({node.address: node.read_address})
            rows = await client.read_range(node.address, "users", 1, b"", b"", 10, None, NO_BOUND)
            await client.close()
            assert rows.status is ReadStatus.OK and rows.entries == [(b"alice", b'{"age":31}')]


@pytest.mark.parametrize("port", ["read_port", "grpc"])
async def test_without_or_with_a_wrong_secret_the_node_refuses_before_any_read(tmp_path, pki, front, port,
                                                                              monkeypatch):
    async with Node(tmp_path, pki, front=front) as node:
        reads = []
        real = node.reads.reader
        monkeypatch.setattr(node.reads, "reader", lambda: reads.append(1) or real())
        for secret in ("", "not-the-secret-of-the-cluster"):
            with pytest.raises(ReplicaUnavailable) as refused:
                await read(node, access(pki, secret=secret), port)
            assert "cluster secret is missing or wrong" in refused.value.message
            assert secret not in refused.value.message or not secret
        assert reads == []
        # Health checks stay open: orchestrators probe them without the secret.
        async with grpc.aio.secure_channel(node.address, ClientTLS(pki.ca.cert).grpc_credentials()) as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("port", ["read_port", "grpc"])
async def test_a_node_with_an_unknown_ca_or_a_plaintext_peer_is_refused_at_the_handshake(tmp_path, pki, front, port):
    async with Node(tmp_path, pki, front=front) as node:
        with pytest.raises(ReplicaUnavailable):
            await read(node, access(pki, ca=pki.other.cert), port)
        with pytest.raises(ReplicaUnavailable):
            await read(node, NodeAccess(SECRET), port)  # TLS port, plaintext peer


@pytest.mark.parametrize("port", ["read_port", "grpc"])
async def test_with_client_certificates_required_only_the_cluster_cas_peers_read(tmp_path, pki, front, port):
    async with Node(tmp_path, pki, front=front, secret=False, mtls=True) as node:
        assert answered(await read(node, access(pki, secret="", cert=pki.client), port))
        for stranger in (None, pki.stranger):
            with pytest.raises(ReplicaUnavailable):
                await read(node, access(pki, secret="", cert=stranger), port)


async def test_a_node_without_settings_serves_any_peer_and_ignores_a_secret(tmp_path, pki, front):
    async with Node(tmp_path, pki, front=front, secret=False, tls=False) as node:
        for secret in ("", SECRET):
            assert (await read(node, NodeAccess(secret))).status is ReadStatus.OK


async def test_sighup_reload_takes_a_new_secret_and_keeps_the_old_ones_when_the_file_is_broken(tmp_path, pki, front):
    async with Node(tmp_path, pki, front=front) as node:
        rotated = "the-next-secret-of-the-cluster-42"
        node.secret_file.write_text(f"{SECRET}\n{rotated}\n")
        assert node.secret.reload()
        for secret in (SECRET, rotated):
            assert (await read(node, access(pki, secret=secret))).status is ReadStatus.OK
        node.secret_file.write_text("short\n")
        assert not node.secret.reload()
        assert (await read(node, access(pki, secret=rotated))).status is ReadStatus.OK


def test_a_bad_secret_file_is_a_config_error_naming_the_setting_and_line_never_the_secret(tmp_path):
    f = tmp_path / "secret"
    with pytest.raises(ConfigError) as e:
        read_secrets(f)
    assert e.value.message.startswith("cluster_secret_file: cannot read")
    f.write_text("# nothing here\n\n")
    with pytest.raises(ConfigError, match="holds no secret"):
        read_secrets(f)
    f.write_text(f"{SECRET}\ntoo short\n")
    with pytest.raises(ConfigError) as e:
        read_secrets(f)
    assert "line 2" in e.value.message and "too short" not in e.value.message
    f.write_text(f"{SECRET}\n  {SECRET}-next \n")
    assert read_secrets(f) == (SECRET, f"{SECRET}-next")


def test_bad_tls_files_are_config_errors_naming_the_setting(tmp_path, pki):
    with pytest.raises(ConfigError) as e:
        ClientTLS(tmp_path / "missing.crt", names=("cluster_ca", "cluster_cert", "cluster_key")).context()
    assert e.value.message.startswith("cluster_ca: cannot read")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(ConfigError, match="^ca: .* is not a PEM CA certificate"):
        ClientTLS(not_pem).context()
    with pytest.raises(ConfigError, match="^tls_cert/tls_key"):
        ServerTLS(pki.node.cert, pki.client.key)


@pytest.mark.parametrize("component, flags, says", [
    ("store-node", lambda p, d: ["--cluster-secret-file", str(d / "missing")], "cluster_secret_file: cannot read"),
    ("store-node", lambda p, d: ["--cluster-secret-file", str(d / "short")], "cluster_secret_file: "),
    ("store-node", lambda p, d: ["--tls-cert", str(p.node.cert), "--tls-key", str(p.client.key)], "tls_cert/tls_key: "),
    ("store-node", lambda p, d: ["--tls-cert", str(p.node.cert)], "tls_cert and tls_key go together"),
    ("router", lambda p, d: ["--cluster-ca", str(d / "short")], "cluster_ca: "),
    ("router", lambda p, d: ["--cluster-secret-file", str(d / "short")], "cluster_secret_file: "),
])
def test_broken_access_files_stop_a_component_at_start_naming_them(pki, tmp_path, component, flags, says):
    import subprocess
    import sys

    (tmp_path / "short").write_text("tiny\n")
    extra = ["--node-id", "n1", "--data-dir", str(tmp_path / "data")] if component == "store-node" else \
        ["--rest-port", "0", "--grpc-port", "0"]
    proc = subprocess.run([sys.executable, "-m", "tools.cli", component, *extra, *flags(pki, tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "CONFIG_ERROR" in proc.stderr and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "tiny" not in proc.stderr  # a secret is never echoed

"""The secrets of ``local up --secure``: a throwaway CA, certificates, a cluster secret, two tokens.

Written under the stack's home (``secure/``, files readable by their owner only): the tokens
themselves go to ``tokens.json`` for the person running the stack; the auth file the router
reads holds only their SHA-256. Each store node gets a certificate for its own address when
it first starts (:func:`node_certificate`); routers and clients present ``cluster.secret``.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from tools.local.certs import Issued, issue, make_ca
from router.auth import token_hash

# One token that may read sensor_stats only, and one that may read everything and see the cluster.
READER, ADMIN = "reader", "admin"


@dataclass(frozen=True)
class StackSecrets:
    dir: Path
    ca: Path
    router_cert: Path
    router_key: Path
    client_cert: Path
    client_key: Path
    auth_file: Path
    cluster_secret_file: Path
    tokens: dict[str, str]

    def to_dict(self) -> dict[str, object]:
        return {"ca": str(self.ca), "router_cert": str(self.router_cert), "client_cert": str(self.client_cert),
                "client_key": str(self.client_key), "auth_file": str(self.auth_file),
                "cluster_secret_file": str(self.cluster_secret_file), "tokens": self.tokens}


def make_secrets(home: Path, hosts: tuple[str, ...]) -> StackSecrets:
    """Fresh secrets for a stack whose routers listen on ``hosts``."""
    d = home / "secure"
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    ca = make_ca(d)
    router = issue(ca, d, "router", "freshroute router", hosts=(*hosts, "localhost"))
    client = issue(ca, d, "client", "freshroute local client", server=False)
    # A prefix: secret scanners can recognise them, and none begins with "-" (which a command line takes
    # for an option).
    tokens = {READER: "frt_" + secrets.token_urlsafe(24), ADMIN: "frt_" + secrets.token_urlsafe(24)}
    auth = d / "auth.json"
    auth.write_text(json.dumps({"principals": [
        {"name": READER, "token_sha256": token_hash(tokens[READER]), "tables": ["sensor_stats"]},
        {"name": ADMIN, "token_sha256": token_hash(tokens[ADMIN]), "tables": ["*"], "cluster": True}]}, indent=2))
    (d / "tokens.json").write_text(json.dumps(tokens, indent=2))
    cluster = d / "cluster.secret"
    cluster.write_text(secrets.token_urlsafe(32) + "\n")
    for path in (auth, d / "tokens.json", cluster):
        path.chmod(0o600)
    return StackSecrets(d, ca.cert, router.cert, router.key, client.cert, client.key, auth, cluster, tokens)


def node_certificate(s: StackSecrets, node_id: str, host: str) -> Issued:
    """The certificate of store node ``node_id`` at ``host``, issued by the stack's CA the first time it is asked."""
    cert, key = s.dir / f"{node_id}.crt", s.dir / f"{node_id}.key"
    if cert.exists() and key.exists():
        return Issued(cert, key)
    ca = Issued(s.ca, s.dir / "ca.key")
    return issue(ca, s.dir, node_id, f"freshroute store node {node_id}", hosts=(host, "localhost"))


def load_secrets(home: Path) -> StackSecrets | None:
    d = home / "secure"
    if not (d / "tokens.json").exists():
        return None
    return StackSecrets(d, d / "ca.crt", d / "router.crt", d / "router.key", d / "client.crt", d / "client.key",
                        d / "auth.json", d / "cluster.secret", json.loads((d / "tokens.json").read_text()))

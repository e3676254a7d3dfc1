"""The secrets of ``local up --secure``: a throwaway CA, the router's and a client's certificates, two tokens.

Written under the stack's home (``secure/``, files readable by their owner only): the tokens
themselves go to ``tokens.json`` for the person running the stack; the auth file the router
reads holds only their SHA-256.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from freshroute.local.certs import issue, make_ca
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
    tokens: dict[str, str]

    def to_dict(self) -> dict[str, object]:
        return {"ca": str(self.ca), "router_cert": str(self.router_cert), "client_cert": str(self.client_cert),
                "client_key": str(self.client_key), "auth_file": str(self.auth_file), "tokens": self.tokens}


def make_secrets(home: Path, hosts: tuple[str, ...]) -> StackSecrets:
    """Fresh secrets for a stack whose routers listen on ``hosts``."""
    d = home / "secure"
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    ca = make_ca(d)
    router = issue(ca, d, "router", "freshroute router", hosts=(*hosts, "localhost"))
    client = issue(ca, d, "client", "freshroute local client", server=False)
    tokens = {READER: secrets.token_urlsafe(24), ADMIN: secrets.token_urlsafe(24)}
    auth = d / "auth.json"
    auth.write_text(json.dumps({"principals": [
        {"name": READER, "token_sha256": token_hash(tokens[READER]), "tables": ["sensor_stats"]},
        {"name": ADMIN, "token_sha256": token_hash(tokens[ADMIN]), "tables": ["*"], "cluster": True}]}, indent=2))
    (d / "tokens.json").write_text(json.dumps(tokens, indent=2))
    for path in (auth, d / "tokens.json"):
        path.chmod(0o600)
    return StackSecrets(d, ca.cert, router.cert, router.key, client.cert, client.key, auth, tokens)


def load_secrets(home: Path) -> StackSecrets | None:
    d = home / "secure"
    if not (d / "tokens.json").exists():
        return None
    return StackSecrets(d, d / "ca.crt", d / "router.crt", d / "router.key", d / "client.crt", d / "client.key",
                        d / "auth.json", json.loads((d / "tokens.json").read_text()))

"""Who may use a store node's ports: the cluster secret, and what a peer needs to reach a node.

A store node's ports — gRPC and the read port — are internal: routers, tools and trusted
clients read them. A node given ``cluster_secret_file`` serves only peers that present one of
the secrets in it (the first batch on a read-port connection carries it; on gRPC it is the
metadata ``x-freshroute-cluster-secret``); a node given ``tls_client_ca`` serves only peers with
a certificate that CA signed. The file holds one secret per line: a peer presents the first, a
node accepts any, so a secret is rotated by adding the new one to every node, moving peers to
it, then removing the old.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from freshroute.errors import ConfigError

if TYPE_CHECKING:
    import ssl

    from freshroute.tls import ClientTLS

SECRET_METADATA = "x-freshroute-cluster-secret"

# Short secrets can be guessed; the ones `local up --secure` makes are 43 characters.
MIN_SECRET_LENGTH = 16


def read_secrets(path: str | Path, setting: str = "cluster_secret_file") -> tuple[str, ...]:
    """The secrets in ``path``, one per line (blank lines and ``#`` comments skipped); errors never echo a secret."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise ConfigError(f"{setting}: cannot read {path} ({why})", setting=setting) from None
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        # gRPC metadata values are printable ASCII; a space would split nothing but is surely a mistake.
        if not all("!" <= ch <= "~" for ch in line) or len(line) < MIN_SECRET_LENGTH:
            raise ConfigError(f"{setting}: {path}, line {number}: a secret is at least {MIN_SECRET_LENGTH} printable "
                              f"ASCII characters without spaces", setting=setting)
        found.append(line)
    if not found:
        raise ConfigError(f"{setting}: {path} holds no secret", setting=setting)
    return tuple(found)


class SecretCheck:
    """A node's accepted secrets, compared in constant time; with none, every peer is admitted."""

    def __init__(self, secrets: tuple[str, ...] = ()) -> None:
        self._accepted = tuple(s.encode() for s in secrets)

    @property
    def required(self) -> bool:
        return bool(self._accepted)

    def admits(self, presented: str | bytes) -> bool:
        if not self._accepted:
            return True
        given = presented.encode() if isinstance(presented, str) else presented
        # Every secret is compared, so the time taken says nothing about which one nearly matched.
        matched = False
        for secret in self._accepted:
            matched |= hmac.compare_digest(secret, given)
        return matched


@dataclass(frozen=True)
class NodeAccess:
    """How a peer reaches store nodes' read ports: the secret it presents, and TLS (trusting the nodes' CA, with a
    certificate of its own for mTLS). The default reaches nodes without either."""

    secret: str = ""
    tls: "ClientTLS | None" = None
    ssl_context: "ssl.SSLContext | None" = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Built once, here: a bad file fails where the peer is configured, not at its first read.
        if self.tls is not None and self.tls.enabled:
            object.__setattr__(self, "ssl_context", self.tls.context())

    @classmethod
    def of(cls, secret_file: str | Path | None = None, tls: "ClientTLS | None" = None,
           setting: str = "cluster_secret_file") -> "NodeAccess":
        return cls(read_secrets(secret_file, setting)[0] if secret_file else "", tls)

"""What the compiled path's tests share: the principals of their auth file, and the router's metrics."""

from __future__ import annotations

import ssl

import httpx
import orjson

from router.auth import token_hash

from .router_deployment import TABLE, WINDOWED

GOOD, RATED, NARROW = "good-token-71c3", "rated-token-0d4e", "narrow-token-9a2b"
RATE, BURST = 20, 10


def write_auth_file(path, *, good: str = GOOD) -> None:
    path.write_text(orjson.dumps({"principals": [
        {"name": "good", "token_sha256": token_hash(good), "tables": ["*"], "cluster": True},
        {"name": "rated", "token_sha256": token_hash(RATED), "tables": [TABLE],
         "rate": {"reads_per_s": RATE, "burst": BURST}},
        {"name": "narrow", "token_sha256": token_hash(NARROW), "tables": [WINDOWED]}]}).decode())


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def metrics(base: str, token: str | None = None, verify: ssl.SSLContext | None = None) -> dict[str, float]:
    """The router's metrics (asked with ``token``, over TLS trusting ``verify``), by series."""
    text = httpx.get(f"{base}/metrics", headers=bearer(token) if token else None, timeout=5,
                     verify=verify if verify is not None else True).text
    return {name: float(value) for line in text.splitlines() if line and not line.startswith("#")
            for name, _, value in [line.rpartition(" ")]}

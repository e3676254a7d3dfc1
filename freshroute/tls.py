"""TLS for a server port: a context from certificate files, client certificates for mTLS, reloaded in place.

One :class:`ServerTLS` per port (its ALPN differs: ``h2`` for gRPC, ``http/1.1`` for REST).
:meth:`ServerTLS.reload` loads the files into a scratch context first, so a broken new file
changes nothing, then into the live one: connections open stay as they are, new handshakes
get the new certificate.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from freshroute.errors import ConfigError

log = logging.getLogger(__name__)


def _reason(e: BaseException) -> str:
    if isinstance(e, ssl.SSLError):
        return e.reason or str(e)
    return getattr(e, "strerror", None) or str(e)


class ServerTLS:
    """A server-side SSLContext from ``cert`` and ``key`` (PEM), requiring client certificates from ``client_ca``."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None, alpn: tuple[str, ...] = ()) -> None:
        self.cert, self.key, self.client_ca, self.alpn = cert, key, client_ca, alpn
        self.context = self._fresh()
        self._load(self.context)

    def _fresh(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.alpn:
            ctx.set_alpn_protocols(list(self.alpn))
        return ctx

    def _load(self, ctx: ssl.SSLContext) -> None:
        for setting, path in (("tls_cert", self.cert), ("tls_key", self.key)):
            if not Path(path).is_file():
                raise ConfigError(f"{setting}: {path} is not a readable file", setting=setting)
        try:
            ctx.load_cert_chain(str(self.cert), str(self.key))
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"tls_cert/tls_key: {self.cert} and {self.key} are not a PEM certificate and its "
                              f"private key ({_reason(e)})", setting="tls_cert") from None
        if self.client_ca is not None:
            try:
                ctx.load_verify_locations(cafile=str(self.client_ca))
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"tls_client_ca: {self.client_ca} is not a PEM CA certificate ({_reason(e)})",
                                  setting="tls_client_ca") from None
            ctx.verify_mode = ssl.CERT_REQUIRED

    def reload(self) -> bool:
        """Load the files again (SIGHUP); True if the live context now holds them."""
        try:
            self._load(self._fresh())  # a broken file must not touch the live context
            self._load(self.context)
        except ConfigError as e:
            log.error("TLS files not reloaded, the previous certificate stays in use: %s", e.message)
            return False
        log.info("TLS certificate reloaded from %s", self.cert)
        return True


def client_context(ca: str | Path | None = None, cert: str | Path | None = None,
                   key: str | Path | None = None) -> ssl.SSLContext | None:
    """A client's TLS context: trust ``ca`` (default: the system's), present ``cert``/``key`` (mTLS); None when
    neither is given (the defaults do)."""
    if not (ca or cert):
        return None
    ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
    if cert:
        ctx.load_cert_chain(str(cert), str(key) if key else None)
    return ctx


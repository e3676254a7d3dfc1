"""TLS from certificate files: a server port's (client certificates for mTLS, reloaded in place), and a peer's.

One :class:`ServerTLS` per port (its ALPN differs: ``h2`` for gRPC, ``http/1.1`` for REST).
:meth:`ServerTLS.reload` loads the files into a scratch context first, so a broken new file
changes nothing, then into the live one: connections open stay as they are, new handshakes
get the new certificate. A grpc.aio port follows it through :func:`grpc_server_credentials`.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from freshroute.errors import ConfigError

if TYPE_CHECKING:
    import grpc

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
        self.generation = 0  # counts reloads, so that a grpc.aio port notices one
        self.pem = self._pem()

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
            self.pem = self._pem()
        except ConfigError as e:
            log.error("TLS files not reloaded, the previous certificate stays in use: %s", e.message)
            return False
        self.generation += 1
        log.info("TLS certificate reloaded from %s", self.cert)
        return True

    def _pem(self) -> tuple[bytes, bytes, bytes | None]:
        """The files as loaded (certificate, key, client CA), for gRPC's credentials."""
        try:
            return (Path(self.cert).read_bytes(), Path(self.key).read_bytes(),
                    Path(self.client_ca).read_bytes() if self.client_ca is not None else None)
        except OSError as e:
            raise ConfigError(f"tls_cert: cannot read {e.filename} ({e.strerror})", setting="tls_cert") from None


def grpc_server_credentials(tls: ServerTLS) -> grpc.ServerCredentials:
    """Credentials of a grpc.aio port that follow ``tls``: the first handshake after a reload gets the new files."""
    import grpc  # the server's: a client's install has no gRPC

    def configuration() -> grpc.ServerCertificateConfiguration:
        cert, key, ca = tls.pem
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    seen = [tls.generation]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC on every handshake: it must be cheap while nothing changed.
        if tls.generation == seen[0]:
            return None
        seen[0] = tls.generation
        return configuration()

    return grpc.dynamic_ssl_server_credentials(configuration(), fetch,
                                               require_client_authentication=tls.client_ca is not None)


@dataclass(frozen=True)
class ClientTLS:
    """A peer's TLS: trust ``ca`` (default: the system's CAs), present ``cert``/``key`` (for mTLS).

    ``names`` are the settings the three files came from, for errors that name them."""

    ca: str | Path | None = None
    cert: str | Path | None = None
    key: str | Path | None = None
    names: tuple[str, str, str] = ("ca", "cert", "key")

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.cert)

    def _read(self, index: int) -> bytes | None:
        path = (self.ca, self.cert, self.key)[index]
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"{self.names[index]}: cannot read {path} ({e.strerror})",
                              setting=self.names[index]) from None

    def context(self) -> ssl.SSLContext | None:
        """An SSLContext checking the server's certificate and name; None when neither ca nor cert is given."""
        if not self.enabled:
            return None
        ca, cert = self._read(0), self._read(1)
        try:
            ctx = ssl.create_default_context(cadata=ca.decode("ascii", "replace") if ca else None)
        except (ssl.SSLError, ValueError) as e:
            raise ConfigError(f"{self.names[0]}: {self.ca} is not a PEM CA certificate ({_reason(e)})",
                              setting=self.names[0]) from None
        if cert:
            self._read(2)
            try:
                ctx.load_cert_chain(str(self.cert), str(self.key) if self.key else None)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"{self.names[1]}/{self.names[2]}: {self.cert} and {self.key} are not a PEM "
                                  f"certificate and its private key ({_reason(e)})", setting=self.names[1]) from None
        return ctx

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        """The same trust and certificate for a gRPC channel (checked by :meth:`context` first)."""
        import grpc  # the server's: a client's install has no gRPC

        self.context()
        return grpc.ssl_channel_credentials(self._read(0), self._read(2), self._read(1))


def peer_subject(transport: object) -> str | None:
    """The subject (RFC 4514) of the certificate the peer of a TLS ``transport`` presented; None without one.

    Only a port that requires client certificates has verified it: elsewhere there is none."""
    get = getattr(transport, "get_extra_info", None)
    ssl_object = get("ssl_object") if get is not None else None
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return None
    from cryptography import x509

    return x509.load_der_x509_certificate(der).subject.rfc4514_string()

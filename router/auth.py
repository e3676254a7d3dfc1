"""Who may read what through a router: principals from an auth file, their tables, their rate.

The auth file (YAML or JSON) names principals; each has a bearer token given as its SHA-256
(so the file holds no secret), the tables it may read (names or globs), whether it may see
the cluster and metadata endpoints, and an optional rate limit::

    principals:
      - name: dashboards
        token_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
        tables: [sensor_stats, "area_*"]
        rate: {reads_per_s: 200, burst: 400}
      - name: ops
        token_sha256: …
        tables: ["*"]
        cluster: true
      - name: billing-service
        certificate_subject: "CN=billing,O=Acme"
        tables: [invoices]

A principal named by ``certificate_subject`` (RFC 4514) is whoever presents a client
certificate with that subject on a router that requires them (``tls_client_ca``) and sends no
token; a token, when sent, always decides. A :class:`Guard` answers every request from an immutable :class:`Principals` snapshot, which
:meth:`Guard.reload` swaps whole; a file that fails to load leaves the old one in place. Rates are counted by
:mod:`router.rate_limit`: in buckets every router process shares, when the router has Redis.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshroute.errors import ConfigError, PermissionDenied, Unauthenticated
from router.rate_limit import LocalRates, Rate, RateLimits

log = logging.getLogger(__name__)

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.@:=,/ -]{1,200}$")
_KEYS = {"name", "token_sha256", "certificate_subject", "tables", "cluster", "rate"}
_MAX_ACCEPTED = 10_000  # header values remembered per loaded file
_MAX_JUDGED = 10_000  # tables remembered per principal
# What a 401 says the router accepts (RFC 6750).
WWW_AUTHENTICATE = 'Bearer realm="freshroute"'


class AuthFileError(ConfigError):
    """The auth file cannot be read or says something inconsistent; the message names file and line."""


@dataclass(frozen=True)
class Principal:
    name: str
    tables: tuple[str, ...]
    cluster: bool = False
    rate: Rate | None = None
    # Tables already judged: a glob match per request would cost more than the rest of the check.
    _judged: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def may_read(self, table: str) -> bool:
        judged = self._judged.get(table)
        if judged is None:
            judged = any(fnmatch.fnmatchcase(table, pattern) for pattern in self.tables)
            if len(self._judged) < _MAX_JUDGED:
                self._judged[table] = judged
        return judged


@dataclass(frozen=True)
class Principals:
    """One loaded auth file: principals by their token's SHA-256."""

    by_token_hash: dict[str, Principal] = field(default_factory=dict)
    source: str = ""
    by_subject: dict[str, Principal] = field(default_factory=dict)  # RFC 4514 subject, canonical form
    # Authorization header values already accepted: hashing each request's token would cost more
    # than the rest of the check. Only accepted values are kept, so a flood of bad tokens cannot grow it.
    accepted: dict[str | bytes, Principal] = field(default_factory=dict, compare=False, repr=False)


class Guard:
    """Authentication, per-table authorization and rate limits of one router process; ``rates`` counts the
    reads (this process's own buckets unless given shared ones)."""

    def __init__(self, path: Path, rates: RateLimits | None = None) -> None:
        self.path = path
        self.principals = load_auth_file(path)
        self.rates = rates if rates is not None else LocalRates()

    def reload(self) -> bool:
        """Load the file again (SIGHUP); a file that fails keeps the principals in force. True if swapped."""
        try:
            fresh = load_auth_file(self.path)
        except AuthFileError as e:
            log.error("auth file not reloaded, the previous principals stay in force: %s", e.message)
            return False
        self.principals = fresh
        # A principal's bucket survives a reload (a changed rate takes effect on it at the next read).
        every = {p.name: p for p in (*fresh.by_token_hash.values(), *fresh.by_subject.values())}
        self.rates.keep(every)
        log.info("auth file reloaded: %d principal(s)", len(every))
        return True

    def authenticate(self, authorization: str | bytes | None, subject: str | None = None) -> Principal:
        """The principal an ``Authorization: Bearer <token>`` value names, else the one the verified client
        certificate's ``subject`` names; Unauthenticated otherwise."""
        principals = self.principals
        if authorization is not None:
            known = principals.accepted.get(authorization)
            if known is not None:
                return known
        raw = authorization
        if isinstance(authorization, bytes):
            authorization = authorization.decode("latin-1")
        if not authorization:
            by_certificate = principals.by_subject.get(subject) if subject else None
            if by_certificate is not None:
                return by_certificate
            raise Unauthenticated("authentication required: send Authorization: Bearer <token>")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("authentication required: send Authorization: Bearer <token>")
        digest = token_hash(token.strip())
        principal = principals.by_token_hash.get(digest)
        if principal is None:
            raise Unauthenticated("the token is not valid")  # never echoes the token
        if raw is not None and len(principals.accepted) < _MAX_ACCEPTED:
            principals.accepted[raw] = principal
        return principal

    async def admit(self, principal: Principal) -> None:
        """Count one request against the principal's rate; RateLimited when over it."""
        if principal.rate is not None:
            await self.rates.admit(principal.name, principal.rate)

    async def principal(self, authorization: str | bytes | None, subject: str | None = None) -> Principal:
        """Any authenticated principal, admitted by its rate (what the list of tables needs)."""
        principal = self.authenticate(authorization, subject)
        await self.admit(principal)
        return principal

    async def table(self, authorization: str | bytes | None, table: str, subject: str | None = None) -> Principal:
        """A read of ``table`` (one per request, however many keys): authenticated, allowed, admitted."""
        principal = self.authenticate(authorization, subject)
        if not principal.may_read(table):
            # The same answer for a table that does not exist: names cannot be probed.
            raise PermissionDenied(f"principal {principal.name!r} may not read table {table!r}", table=table)
        await self.admit(principal)
        return principal

    async def cluster(self, authorization: str | bytes | None, subject: str | None = None) -> Principal:
        """The cluster and metadata endpoints (``/v1/cluster``, key metadata, ``/metrics``, ``/docs``)."""
        principal = self.authenticate(authorization, subject)
        if not principal.cluster:
            raise PermissionDenied(f"principal {principal.name!r} may not see the cluster's metadata")
        await self.admit(principal)
        return principal


def load_auth_file(path: Path) -> Principals:
    """Parse and check an auth file; every mistake is an AuthFileError naming the file (and line where known)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise AuthFileError(f"auth file {path}: cannot read it: {getattr(e, 'strerror', None) or e}",
                            setting="auth_file") from None
    doc = _parse(path, text)
    if not isinstance(doc, dict) or not isinstance(doc.get("principals"), list):
        raise AuthFileError(f"auth file {path}: expected a mapping with a list 'principals'", setting="auth_file")
    out: dict[str, Principal] = {}
    by_subject: dict[str, Principal] = {}
    names: set[str] = set()
    for i, entry in enumerate(doc["principals"]):
        name = entry.get("name") if isinstance(entry, dict) else None
        earlier = sum(1 for e in doc["principals"][:i] if isinstance(e, dict) and e.get("name") == name)
        where = f"auth file {path}, principal {i + 1}{f' {name!r}' if isinstance(name, str) else ''}" \
                f"{_line(text, name, earlier)}"
        principal, digest, subject = _principal(entry, where)
        if principal.name in names:
            raise AuthFileError(f"{where}: the name {principal.name!r} is used twice", setting="auth_file")
        if digest is not None:
            if digest in out:
                raise AuthFileError(f"{where}: principal {out[digest].name!r} has the same token_sha256", setting="auth_file")
            out[digest] = principal
        if subject is not None:
            if subject in by_subject:
                raise AuthFileError(f"{where}: principal {by_subject[subject].name!r} has the same "
                                    f"certificate_subject",
                                    setting="auth_file")
            by_subject[subject] = principal
        names.add(principal.name)
    return Principals(out, str(path), by_subject)


def _parse(path: Path, text: str) -> Any:
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        import json

        try:
            return json.loads(text)
        except ValueError as e:
            raise AuthFileError(f"auth file {path}, line {getattr(e, 'lineno', '?')}: not valid JSON: "
                                f"{getattr(e, 'msg', e)}", setting="auth_file") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark is not None else ""
        raise AuthFileError(f"auth file {path}{line}: not valid YAML: {getattr(e, 'problem', None) or e}",
                            setting="auth_file") from None


def _line(text: str, name: Any, earlier: int) -> str:
    """`` (line N)`` of the entry named ``name`` that follows ``earlier`` entries of that name, when it can be found."""
    if isinstance(name, str):
        found = [number for number, line in enumerate(text.splitlines(), 1)
                 if re.search(r"[\"']?name[\"']?\s*:\s*[\"']?" + re.escape(name) + r"[\"']?\s*[,}]?\s*$", line.strip())]
        if len(found) > earlier:
            return f" (line {found[earlier]})"
    return ""


def _principal(entry: Any, where: str) -> tuple[Principal, str | None, str | None]:
    def bad(why: str) -> AuthFileError:
        return AuthFileError(f"{where}: {why}", setting="auth_file")

    if not isinstance(entry, dict):
        raise bad("expected a mapping with name, token_sha256 and tables")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise bad(f"unknown field(s) {unknown} (known: {sorted(_KEYS)})")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad("name must be a non-empty string of letters, digits and _.@:=,/ -")
    digest, subject = entry.get("token_sha256"), entry.get("certificate_subject")
    if digest is None and subject is None:
        raise bad("give token_sha256 (a bearer token's SHA-256) or certificate_subject (a client certificate's "
                  "subject), or both")
    if digest is not None and (not isinstance(digest, str) or not _HEX64.match(digest.lower())):
        raise bad("token_sha256 must be the token's SHA-256 as 64 hex digits (sha256sum of the token), "
                  "not the token itself")
    if subject is not None:
        subject = canonical_subject(subject)
        if subject is None:
            raise bad('certificate_subject must be a distinguished name as RFC 4514 writes it, e.g. "CN=billing,O=Acme"')
    tables = entry.get("tables", [])
    if isinstance(tables, str):
        tables = [tables]
    if not isinstance(tables, list) or not all(isinstance(t, str) and t for t in tables):
        raise bad("tables must be a list of table names or globs")
    cluster = entry.get("cluster", False)
    if not isinstance(cluster, bool):
        raise bad("cluster must be true or false")
    rate = None
    if entry.get("rate") is not None:
        r = entry["rate"]
        if not isinstance(r, dict) or set(r) - {"reads_per_s", "burst"} or "reads_per_s" not in r:
            raise bad("rate must be {reads_per_s: N, burst: M}")
        per_s, burst = r["reads_per_s"], r.get("burst", r["reads_per_s"])
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in (per_s, burst)):
            raise bad("rate.reads_per_s and rate.burst must be positive numbers")
        if burst < 1:
            raise bad("rate.burst must be at least 1")
        rate = Rate(float(per_s), float(burst))
    return Principal(name, tuple(tables), cluster, rate), digest.lower() if digest else None, subject


def canonical_subject(subject: Any) -> str | None:
    """``subject`` as a client certificate's subject is compared (RFC 4514, as the certificate orders it); None if
    it is not a distinguished name."""
    from cryptography import x509

    if not isinstance(subject, str) or not subject.strip():
        return None
    for text in (subject.strip(), re.sub(r"\s*([,+])\s*", r"\1", subject.strip())):
        try:
            return x509.Name.from_rfc4514_string(text).rfc4514_string()
        except ValueError:
            continue
    return None


def token_hash(token: str) -> str:
    """What an auth file holds for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()

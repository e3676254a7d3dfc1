"""Principals from an auth file: tokens by hash, tables by glob, cluster access, rates, reloads, broken files."""

from __future__ import annotations

import asyncio
import json

import pytest

from freshroute.errors import PermissionDenied, RateLimited, Unauthenticated
from router.auth import AuthFileError, Guard, load_auth_file, token_hash
from router.rate_limit import LocalRates

DASH, OPS = "dash-token-1", "ops-token-2"


def write(tmp_path, body: str, name: str = "auth.yaml"):
    path = tmp_path / name
    path.write_text(body)
    return path


def auth_yaml(rate: str = "") -> str:
    return f"""
principals:
  - name: dashboards
    token_sha256: {token_hash(DASH)}
    tables: [sensor_stats, "area_*"]
{rate}
  - name: ops
    token_sha256: {token_hash(OPS).upper()}
    tables: ["*"]
    cluster: true
"""


def run(call):
    return asyncio.run(call)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_tokens_name_principals_and_tables_are_checked_by_name_or_glob(tmp_path):
    guard = Guard(write(tmp_path, auth_yaml()))
    assert run(guard.table(f"Bearer {DASH}", "sensor_stats")).name == "dashboards"
    assert run(guard.table(f"bearer  {DASH} ".encode(), "area_counts")).name == "dashboards"
    with pytest.raises(PermissionDenied) as denied:
        run(guard.table(f"Bearer {DASH}", "payments"))
    with pytest.raises(PermissionDenied) as missing:
        run(guard.table(f"Bearer {DASH}", "no_such_table"))
    assert denied.value.http_status == missing.value.http_status == 403
    assert run(guard.table(f"Bearer {OPS}", "payments")).name == "ops"
    assert run(guard.cluster(f"Bearer {OPS}")).name == "ops"
    with pytest.raises(PermissionDenied, match="cluster"):
        run(guard.cluster(f"Bearer {DASH}"))


def test_a_certificate_subject_names_a_principal_when_no_token_is_sent(tmp_path):
    guard = Guard(write(tmp_path, auth_yaml() + """
  - name: billing
    certificate_subject: "CN=billing, O=Acme"
    tables: [invoices]
"""))
    assert run(guard.table(None, "invoices", "CN=billing,O=Acme")).name == "billing"
    assert run(guard.principal(b"", "CN=billing,O=Acme")).name == "billing"
    with pytest.raises(PermissionDenied):
        run(guard.table(None, "sensor_stats", "CN=billing,O=Acme"))
    with pytest.raises(Unauthenticated):
        run(guard.table(None, "invoices", "CN=billing,O=Other"))
    with pytest.raises(Unauthenticated):
        run(guard.table(None, "invoices"))  # no certificate, no token
    # A token, when sent, decides: a wrong one is refused even with a known certificate.
    assert run(guard.table(f"Bearer {OPS}", "invoices", "CN=billing,O=Acme")).name == "ops"
    with pytest.raises(Unauthenticated):
        run(guard.table("Bearer wrong-token", "invoices", "CN=billing,O=Acme"))


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic dXNlcjpwdw==", "Bearer wrong-token", f"Token {DASH}"])
def test_no_or_unknown_credentials_are_unauthenticated_and_never_echoed(tmp_path, header):
    guard = Guard(write(tmp_path, auth_yaml()))
    with pytest.raises(Unauthenticated) as e:
        run(guard.table(header, "sensor_stats"))
    assert e.value.http_status == 401
    assert "wrong-token" not in str(e.value.to_body()) and "dXNlcjpwdw" not in str(e.value.to_body())


def test_a_rate_limit_refuses_past_its_burst_and_admits_again_as_it_refills(tmp_path):
    clock = Clock()
    guard = Guard(write(tmp_path, auth_yaml("    rate: {reads_per_s: 2, burst: 3}")), LocalRates(clock))
    for _ in range(3):
        run(guard.table(f"Bearer {DASH}", "sensor_stats"))
    with pytest.raises(RateLimited) as e:
        run(guard.table(f"Bearer {DASH}", "sensor_stats"))
    assert e.value.http_status == 429 and e.value.details["retry_after_s"] == 1
    clock.t += 0.5  # one read's worth refilled
    run(guard.table(f"Bearer {DASH}", "sensor_stats"))
    for _ in range(10):
        run(guard.table(f"Bearer {OPS}", "sensor_stats"))  # no rate: never limited


def test_a_reload_swaps_principals_and_a_broken_file_keeps_the_old_ones(tmp_path, caplog):
    path = write(tmp_path, auth_yaml())
    guard = Guard(path)
    path.write_text("principals:\n  - name: dashboards\n    token_sha256: nothex\n")
    assert guard.reload() is False
    assert "previous principals stay in force" in caplog.text
    assert run(guard.table(f"Bearer {DASH}", "sensor_stats")).name == "dashboards"
    path.write_text(json.dumps({"principals": [{"name": "only", "token_sha256": token_hash("new"), "tables": ["x"]}]}))
    assert guard.reload() is True
    assert run(guard.table("Bearer new", "x")).name == "only"
    with pytest.raises(Unauthenticated):
        run(guard.table(f"Bearer {DASH}", "sensor_stats"))


@pytest.mark.parametrize("body, says", [
    ("principals:\n  - name: a\n  token: [", "line 3: not valid YAML"),
    ("{\"principals\": [}", "line 1: not valid JSON"),
    ("principals: {}", "expected a mapping with a list 'principals'"),
    (f"principals:\n  - name: a\n    token_sha256: {DASH}\n", "principal 1 'a' (line 2): token_sha256 must be the token's SHA-256"),
    (f"principals:\n  - name: a\n    token_sha256: {token_hash('x')}\n    tabels: [t]\n", "unknown field(s) ['tabels']"),
    (f"principals:\n  - name: a\n    token_sha256: {token_hash('x')}\n  - name: a\n    token_sha256: {token_hash('y')}\n",
     "principal 2 'a' (line 4): the name 'a' is used twice"),
    (f"principals:\n  - name: a\n    token_sha256: {token_hash('x')}\n    rate: {{reads_per_s: 0}}\n",
     "principal 1 'a' (line 2): rate.reads_per_s and rate.burst must be positive"),
    (f"principals:\n  - name: ok\n    token_sha256: {token_hash('y')}\n  - name: b\n    token_sha256: {token_hash('x')}\n"
     "    rate: {reads_per_s: -5, burst: 10}\n", "principal 2 'b' (line 4): rate.reads_per_s and rate.burst must be positive"),
    ("principals:\n  - name: a\n    tables: [t]\n", "give token_sha256 (a bearer token's SHA-256) or certificate_subject"),
    ("principals:\n  - name: a\n    certificate_subject: not a name\n", "certificate_subject must be a distinguished name"),
    ("principals:\n  - name: a\n    certificate_subject: CN=x\n  - name: b\n    certificate_subject: 'CN=x'\n",
     "principal 2 'b' (line 4): principal 'a' has the same certificate_subject"),
])
def test_a_broken_auth_file_is_refused_naming_file_and_line(tmp_path, body, says):
    path = write(tmp_path, body)
    with pytest.raises(AuthFileError) as e:
        load_auth_file(path)
    assert str(path) in e.value.message and says in e.value.message, e.value.message
    assert DASH not in e.value.message  # a token pasted by mistake is not repeated in logs


def test_a_missing_auth_file_is_named(tmp_path):
    with pytest.raises(AuthFileError, match="cannot read it"):
        load_auth_file(tmp_path / "absent.yaml")


@pytest.mark.parametrize("path, needs", [
    (b"/healthz", "open"), (b"/readyz", "open"), (b"/console", "open"), (b"/console/console.js", "open"),
    (b"/v1/cluster/summary", "cluster"), (b"/v1/cluster/tables/sensor_stats", "cluster"), (b"/consoles", "cluster"),
    (b"/v1/tables/sensor_stats/keys/sensor-1", "table"), (b"/v1/tables/sensor_stats/keys/a%2Fb", "table"),
    (b"/v1/tables/sensor_stats/keys:batchGet", "table"), (b"/v1/tables/sensor_stats/scan", "table"),
    (b"/v1/tables", "principal"), (b"/v1/tables/", "principal"),
    (b"/v1/tables/sensor_stats/keys/sensor-1/metadata", "cluster"), (b"/v1/cluster", "cluster"),
    (b"/metrics", "cluster"), (b"/docs", "cluster"), (b"/openapi.json", "cluster"), (b"/no/such/route", "cluster"),
])
def test_each_rest_path_needs_what_its_kind_of_request_needs(tmp_path, path, needs):
    from router.rest.routes import admit, route_of

    guard = Guard(write(tmp_path, auth_yaml()))
    route = route_of(path)
    assert route.need == needs

    def check(token: str | None):
        return run(admit(guard, route, f"Bearer {token}".encode() if token else None, None))

    if needs == "open":
        assert check(None) is None
        return
    with pytest.raises(Unauthenticated):
        check(None)
    assert check(OPS).name == "ops"  # the admin may do everything
    if needs == "cluster":
        with pytest.raises(PermissionDenied):
            check(DASH)
    else:
        assert check(DASH).name == "dashboards"

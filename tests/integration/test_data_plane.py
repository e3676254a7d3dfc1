"""The compiled lookup path against the Python path, side by side over the same store nodes: every REST request
answered alike — lookups it serves itself, and everything it relays or hands over — and its work counted."""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
import time
import uuid

import httpx
import orjson
import pytest

from freshroute.bound import NO_BOUND
from freshroute.client import AsyncClient
from freshroute.metadata.progress import InputMark
from freshroute.metadata.store import MetadataStore
from freshroute.position import Position
from freshroute.write_tokens.token import WriteToken
from tools.local.certs import issue, make_ca
from tools.local.services import free_port

from .data_plane_support import BURST, GOOD, NARROW, RATE, RATED, bearer, metrics, write_auth_file
from .router_deployment import (FED, FED_INPUT_RECORDS, KEYS, LAYOUT, NODES, PARTITIONS, TABLE, WATERMARK_MS,
                                WINDOW_STARTS, WINDOWED, Deployment, Procs, value_of)

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no Spark, no shared stack: runs beside the others


@pytest.fixture(scope="module")
def routers(tmp_path_factory, broker, redis_service):
    """(the compiled path's REST address, the Python path's) in front of one deployment's store nodes."""
    d = Deployment(Procs(tmp_path_factory.mktemp("data-plane")), broker, redis_service.address,
                   f"t{uuid.uuid4().hex[:10]}", fed=True)
    try:
        d.up()
        python_port = free_port()
        d.start_router("router-python", rest_port=python_port, grpc_port=free_port(),
                       settings={"FRESHROUTE_DATA_PLANE": "python"})
        assert "REST lookups by the compiled path" in d.procs.log("router")
        assert "REST lookups by the Python front (data_plane is python)" in d.procs.log("router-python")
        yield d, f"http://127.0.0.1:{python_port}"
    finally:
        d.procs.stop_all()


IMPORTED_MS, LATER_MS = int(time.time() * 1000), 4_102_444_800_000  # 2100-01-01
READ_0 = WriteToken(reads={TABLE: {0: 1}}).encode()  # a session's token that read partition 0 of the table
REQUESTS = [
    *(f"/v1/tables/{TABLE}/keys/sensor-{i}" for i in range(KEYS)),
    f"/v1/tables/{TABLE}/keys/sensor%2D1", f"/v1/tables/{TABLE}/keys/nope", f"/v1/tables/{TABLE}/keys/it's",
    f"/v1/tables/{TABLE}/keys/caf%C3%A9", f"/v1/tables/{TABLE}/keys/%ZZ", f"/v1/tables/{TABLE}/keys/%FF%FE",
    f"/v1/tables/{TABLE}/keys/sensor-2?max_lag=0", f"/v1/tables/{TABLE}/keys/sensor-2?max_staleness_ms=600000",
    f"/v1/tables/{TABLE}/keys/sensor-2?max_lag=0&max_staleness_ms=600000", f"/v1/tables/{TABLE}/keys/sensor-2?max_lag=",
    f"/v1/tables/{TABLE}/keys/sensor-2?max_lag=-1", f"/v1/tables/{TABLE}/keys/sensor-2?max_lag=x",
    f"/v1/tables/{TABLE}/keys/sensor-2?max_lag=99999999999999999999", f"/v1/tables/{TABLE}/keys/sensor-2?other=1",
    f"/v1/tables/{TABLE}/keys/sensor-2?min_position=nonsense", f"/v1/tables/{TABLE}/keys/sensor-2?max_input_lag_ms=0",
    f"/v1/tables/{TABLE}/keys/sensor-2?as_of=now", "/v1/tables/nope/keys/k", f"/v1/tables/{WINDOWED}/keys/sensor-1",
    f"/v1/tables/{WINDOWED}/keys/sensor-1/windows?from=0&to=30000", f"/v1/tables/{TABLE}/keys/sensor-1/versions",
    *(f"/v1/tables/{WINDOWED}/keys/{key}/windows?{q}" for key, q in (
        ("sensor-2", "from=10000&to=20000"), ("sensor-2", "from=10001&to=20001&max_lag=0"), ("nope", "from=0&to=30000"),
        ("sensor%2D3", "to=30000&from=0&max_staleness_ms=600000"), ("sensor-3", "from=20000&to=10000"),
        ("sensor-3", "from=0&to=99999999999"), ("sensor-3", "from=0"), ("sensor-3", "from=x&to=1"),
        ("sensor-3", "from=%30&to=30000"), ("sensor-3", "from=0&to=30000&max_input_lag_ms=0"),
        ("sensor-3", "from=0&to=9223372036854775808"), ("sensor-3", "from=0&to=30000&max_lag=x"))),
    f"/v1/tables/{TABLE}/keys/sensor-1/windows?from=0&to=30000",
    # Each key has one version, from when the deployment wrote it: after this module's import.
    *(f"/v1/tables/{TABLE}/keys/{key}?as_of={at}" for key, at in (
        ("sensor-4", IMPORTED_MS), ("sensor-4", LATER_MS), ("nope", LATER_MS), ("sensor-4", 1),
        ("sensor-4", f"{LATER_MS}&max_lag=0"), ("sensor-4", "2099-01-01T00:00:00Z"), ("sensor-4", f"{LATER_MS}0000"),
        ("it's", LATER_MS))),
    f"/v1/tables/{WINDOWED}/keys/sensor-4?as_of={LATER_MS}",
    f"/v1/tables/{TABLE}/keys/sensor-1/nothing", "/v1/tables", "/v1/tables/", "/nowhere", "/readyz",
    # Write tokens: what a session read of the table is served here, the rest is the Python path's to refuse.
    *(f"/v1/tables/{TABLE}/keys/sensor-2?{q}" for q in (
        f"after={WriteToken(reads={TABLE: {0: 1, 1: 1, 2: 1, 3: 1}}).encode()}",
        f"after={READ_0}&wait_ms=500&max_lag=5", f"after={WriteToken(reads={TABLE: {9: 1}}).encode()}",
        f"after={WriteToken(reads={WINDOWED: {0: 1}}).encode()}", f"after={WriteToken({'elsewhere': {0: 1}}).encode()}",
        "after=nonsense", "after=w1.e30.00000000", f"after={READ_0[:-1]}0", f"after={READ_0}&as_of=1", "wait_ms=100",
        "wait_ms=0", "wait_ms=60001", f"after={READ_0}&wait_ms=x")),
    f"/v1/tables/{WINDOWED}/keys/sensor-2/windows?from=0&to=30000&after={WriteToken(reads={WINDOWED: {0: 1}}).encode()}"
    f"&wait_ms=100",
]


def served_elsewhere(body: dict) -> dict:
    """A body without the replica that served it (equally fresh replicas are picked at random) and what depends on
    the moment it was asked (the table's input lag; where a page of versions starts by default, and is complete to;
    the oldest time versions are kept from)."""
    inner = body.get("error", body)
    for name in ("served_by", "input_lag", "from", "complete_to", "oldest_retained"):
        inner.pop(name, None)
    if inner.get("code") == "VERSION_NOT_RETAINED":
        inner.pop("message")  # it names the oldest time, which moves on with the clock
    return body


@pytest.mark.parametrize("path", REQUESTS)
def test_every_request_is_answered_as_the_python_path_answers_it(routers, path):
    d, python = routers
    compiled, reference = httpx.get(d.rest + path, timeout=10), httpx.get(python + path, timeout=10)
    assert compiled.status_code == reference.status_code, (compiled.text, reference.text)
    assert compiled.headers.get("content-type") == reference.headers.get("content-type")
    if compiled.headers.get("content-type") != "application/json":
        return
    got, want = compiled.json(), reference.json()
    served = got.get("error", got).get("served_by")
    if served is not None:
        assert served["node"] in LAYOUT[got.get("error", got)["partition"]]
    assert served_elsewhere(got) == served_elsewhere(want)


def test_a_connection_mixing_what_is_answered_relayed_and_handed_over_keeps_its_order(routers):
    d, _ = routers
    port = int(d.rest.rsplit(":", 1)[1])
    raw = b"".join(f"GET {p} HTTP/1.1\r\nHost: r\r\n\r\n".encode() for p in (
        f"/v1/tables/{TABLE}/keys/sensor-1", f"/v1/tables/{TABLE}/keys/sensor-2?max_lag=x",
        f"/v1/tables/{TABLE}/keys/sensor-3", f"/v1/tables/{TABLE}/keys/sensor-1/metadata", "/v1/tables",
        f"/v1/tables/{TABLE}/keys/sensor-4"))
    before = metrics(d.rest)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        f = sock.makefile("rb")
        answers = []
        for _ in range(6):
            status = int(f.readline().split()[1])
            length = 0
            while (line := f.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            answers.append((status, orjson.loads(f.read(length))))
    assert [s for s, _ in answers] == [200, 400, 200, 200, 200, 200]
    assert [answers[i][1]["value"] for i in (0, 2, 5)] == [value_of(1), value_of(3), value_of(4)]
    assert answers[1][1]["error"]["field"] == "max_lag"
    assert answers[3][1]["partition"] in LAYOUT and {t["name"] for t in answers[4][1]["tables"]} == set(d.tables)
    # The connection's socket went to the Python front with the last request unread there (as did the metrics
    # request's after it): nothing spliced.
    handoffs = 'freshroute_router_compiled_path_handoffs_total{how="%s"}'
    after = metrics(d.rest)
    assert (after[handoffs % "adopted"] - before[handoffs % "adopted"],
            after[handoffs % "handed_over"] - before[handoffs % "handed_over"]) == (2, 0)


def test_the_paths_work_is_counted_in_the_routers_metrics(routers):
    d, _ = routers
    before = metrics(d.rest)
    for i in range(20):
        assert httpx.get(f"{d.rest}/v1/tables/{TABLE}/keys/sensor-{i}", timeout=5).status_code == 200
    assert httpx.get(f"{d.rest}/v1/tables/{TABLE}/keys/sensor-1?max_lag=x", timeout=5).status_code == 400
    after = metrics(d.rest)
    ok = 'freshroute_router_lookups_total{outcome="ok",role="%s"}'
    assert sum(after[ok % r] - before[ok % r] for r in ("active", "standby")) >= 20
    invalid = 'freshroute_router_lookups_total{outcome="invalid",role="none"}'
    assert after[invalid] == before[invalid] + 1  # counted by the Python path it was relayed to
    relayed = 'freshroute_router_compiled_path_handoffs_total{how="relayed"}'
    assert after[relayed] == before[relayed] + 1
    assert after['freshroute_router_lookup_seconds_count'] - before['freshroute_router_lookup_seconds_count'] >= 21


def test_windows_are_served_here_with_each_windows_end_and_finality(routers):
    d, python = routers
    before = metrics(d.rest)
    for i in range(KEYS):
        got = httpx.get(f"{d.rest}/v1/tables/{WINDOWED}/keys/sensor-{i}/windows", params={"from": 0, "to": 30_000},
                        timeout=5).json()
        assert [(w["start"], w["end"], w["value"], w["final"]) for w in got["windows"]] == [
            (start, start + 10_000, {"count": i}, start + 10_000 <= WATERMARK_MS) for start in WINDOW_STARTS]
        assert got["watermark_ms"] == WATERMARK_MS and got["served_by"]["node"] in LAYOUT[got["partition"]]
    relayed = 'freshroute_router_compiled_path_handoffs_total{how="relayed"}'
    assert metrics(d.rest)[relayed] == before[relayed]  # answered by the compiled path itself


def test_reads_as_of_a_time_are_served_here_with_the_versions_interval(routers):
    d, _ = routers
    before = metrics(d.rest)
    for i in range(KEYS):
        got = httpx.get(f"{d.rest}/v1/tables/{TABLE}/keys/sensor-{i}", params={"as_of": LATER_MS}, timeout=5).json()
        assert got["value"] == value_of(i) and got["as_of"] == LATER_MS and got["final"] is False
        assert IMPORTED_MS <= got["valid_from"] <= time.time() * 1000 and got["valid_to"] is None
        earlier = httpx.get(f"{d.rest}/v1/tables/{TABLE}/keys/sensor-{i}", params={"as_of": IMPORTED_MS - 1},
                            timeout=5)
        assert earlier.status_code == 404 and earlier.json()["error"]["valid_from"] is None
        assert earlier.json()["error"]["final"] is True  # the replicas are caught up: nothing can change it now
    relayed = 'freshroute_router_compiled_path_handoffs_total{how="relayed"}'
    assert metrics(d.rest)[relayed] == before[relayed]


def test_positions_are_served_here_and_what_they_refuse_is_answered_as_the_python_path_does(routers):
    d, python = routers
    first = httpx.get(f"{d.rest}/v1/tables/{TABLE}/keys/sensor-3", timeout=5).json()
    before = metrics(d.rest)
    again = httpx.get(f"{d.rest}/v1/tables/{TABLE}/keys/sensor-3", params={"min_position": first["position"]},
                      timeout=5)
    assert again.status_code == 200 and again.json()["position"] == first["position"]
    relayed = 'freshroute_router_compiled_path_handoffs_total{how="relayed"}'
    assert metrics(d.rest)[relayed] == before[relayed]  # answered by the compiled path itself
    partition = first["partition"]
    ahead = Position(TABLE, {partition: 10**9}).encode()
    other = Position(WINDOWED, {partition: 1}).encode()
    for token in (ahead, other):
        compiled = httpx.get(f"{d.rest}/v1/tables/{TABLE}/keys/sensor-3", params={"min_position": token}, timeout=10)
        reference = httpx.get(f"{python}/v1/tables/{TABLE}/keys/sensor-3", params={"min_position": token}, timeout=10)
        assert compiled.status_code == reference.status_code, (compiled.text, reference.text)
        got, want = compiled.json()["error"], reference.json()["error"]
        assert (got["code"], got.get("field")) == (want["code"], want.get("field"))
    assert metrics(d.rest)[relayed] == before[relayed] + 2


def test_reads_after_a_write_token_wait_here_for_its_events_and_end_as_the_python_path_ends_them(routers):
    d, python = routers
    key = "sensor-3"
    partition = httpx.get(f"{d.rest}/v1/tables/{FED}/keys/{key}", timeout=5).json()["partition"]

    def asked(base: str, table: str, token: WriteToken, wait_ms: int | None = None) -> tuple[httpx.Response, float]:
        params = {"after": token.encode(), **({"wait_ms": wait_ms} if wait_ms is not None else {})}
        started = time.monotonic()
        got = httpx.get(f"{base}/v1/tables/{table}/keys/{key}", params=params, timeout=10)
        return got, time.monotonic() - started

    relayed = 'freshroute_router_compiled_path_handoffs_total{how="relayed"}'
    before = metrics(d.rest)
    # Written straight to the table's changelog: a position one past the write.
    for table in (TABLE, FED):
        direct = WriteToken({d.topic(table): {partition: 0}})
        (compiled, _), (reference, _) = (asked(base, table, direct) for base in (d.rest, python))
        assert compiled.status_code == reference.status_code == 200, (compiled.text, reference.text)
        assert served_elsewhere(compiled.json()) == served_elsewhere(reference.json())
    # Input events no row reflects and no mark speaks for: both wait out wait_ms and say the same.
    events = WriteToken({d.input_topic: {0: 4, 1: FED_INPUT_RECORDS - 1}}, written_ms=int(time.time() * 1000))
    (compiled, took), (reference, _) = asked(d.rest, FED, events, 300), asked(python, FED, events, 300)
    assert compiled.status_code == reference.status_code == 503, (compiled.text, reference.text)
    assert compiled.json() == reference.json()
    assert compiled.json()["error"]["code"] == "NOT_YET_VISIBLE"
    assert 0.29 <= took < 1.5, took
    waited = metrics(d.rest)
    assert waited[relayed] == before[relayed], "answered here, the wait too"
    again = 'freshroute_router_retries_total{reason="after"}'
    assert waited[again] - before.get(again, 0) >= 50, "its replicas asked again every few ms, counted"
    # A mark past the events: answered at once, from a replica that applied the changelog to where it says.
    meta = MetadataStore.from_url(d.redis_url, d.namespace)
    try:
        meta.publish_input_marks(FED, [InputMark({0: 5, 1: FED_INPUT_RECORDS}, {p: 1 for p in range(PARTITIONS)},
                                                 int(time.time() * 1000))])
        deadline = time.monotonic() + 10
        while asked(d.rest, FED, events, 50)[0].status_code != 200:
            assert time.monotonic() < deadline, "the mark never reached the compiled path"
            time.sleep(0.05)
        (compiled, took), (reference, _) = asked(d.rest, FED, events), asked(python, FED, events)
        assert compiled.status_code == reference.status_code == 200
        assert served_elsewhere(compiled.json()) == served_elsewhere(reference.json())
        assert took < 0.5
        assert metrics(d.rest)[relayed] == before[relayed]
        # An event the pipeline rejected: the Python path says why, as it would have.
        meta.publish_rejections(d.input_topic, {0: [(7, "not JSON")]})
        rejected = WriteToken({d.input_topic: {0: 7}}, written_ms=int(time.time() * 1000))
        deadline = time.monotonic() + 10
        while (compiled := asked(d.rest, FED, rejected, 2000)[0]).status_code != 409:
            assert time.monotonic() < deadline, compiled.text
        reference = asked(python, FED, rejected, 2000)[0]
        assert compiled.json() == reference.json()
        assert compiled.json()["error"]["code"] == "WRITE_REJECTED"
        assert metrics(d.rest)[relayed] > before[relayed]
    finally:
        meta.redis.close()


def test_the_clients_compiled_reads_answer_as_its_python_path_does(routers):
    """A client reading the store nodes through DirectReads (freshroute.client.compiled) and one reading them by its
    Python path give the same answers, labelled with a replica of the key's partition; a bound the compiled path does
    not judge is still answered, by the Python path."""
    d, _ = routers
    keys = [f"sensor-{i}" for i in range(KEYS)] + [f"absent-{i}" for i in range(10)]

    async def main() -> None:
        async with AsyncClient(d.redis_url, namespace=d.namespace) as compiled, \
                AsyncClient(d.redis_url, namespace=d.namespace, compiled=False) as python:
            assert compiled._compiled is not None, "the extension is built: the compiled path is on"
            assert python._compiled is None  # every read by the Python path
            await compiled.get(TABLE, "sensor-0")  # the first view is in, and the read ports are being connected
            deadline = time.monotonic() + 10
            while len(compiled._compiled._transports) < len(NODES):
                assert time.monotonic() < deadline, "the client never reached every node's read port"
                await asyncio.sleep(0.05)
            # Asked directly, the compiled path answers every key itself (None would hand it to the Python path).
            direct = []
            for key in keys:
                pending = compiled._compiled.get(TABLE, TABLE, key, NO_BOUND)
                assert pending is not None, f"the compiled path took {key}"
                direct.append(await pending)
            assert all(answer is not None for answer in direct), [k for k, a in zip(keys, direct) if a is None]
            got = [await compiled.get(TABLE, key) for key in keys]
            want = [await python.get(TABLE, key) for key in keys]
            for key, a, b, c in zip(keys, direct, got, want):
                fields = [(x.table, x.key, x.found, x.value, x.partition, x.value_format) for x in (a, b, c)]
                assert fields[0] == fields[1] == fields[2], key
                assert (a.found, a.value) == ((True, value_of(int(key[7:]))) if key.startswith("sensor-")
                                              else (False, None))
                for x in (a, b, c):
                    # Replicas of the layout, caught up: either may answer, with its own labels.
                    assert x.node in LAYOUT[x.partition] and x.role in ("active", "standby"), x
                    assert x.lag_offsets is not None and x.lag_offsets >= 0 and x.lag_ms is not None, x
                    assert x.applied_offset > 0 and x.table_version == 1, x
            # A batch, likewise: the compiled path reads it whole, and it answers as the Python path's does.
            batch = compiled._compiled.get_many(TABLE, TABLE, keys, NO_BOUND)
            assert batch is not None
            many = await batch
            assert many is not None, "every group answered"
            assert [(x.key, x.found, x.value, x.partition) for x in many] == \
                [(x.key, x.found, x.value, x.partition) for x in await python.get_many(TABLE, keys)]
            assert compiled._compiled._engine.in_flight() == 0
            # A wait and a version are the Python path's to judge: the compiled client still answers them.
            for limits in ({"wait_ms": 500}, {"version": 1}, {"max_input_lag_ms": 60_000}):
                answer = await compiled.get(TABLE, "sensor-5", **limits)
                assert (answer.found, answer.value, answer.node in LAYOUT[answer.partition]) == (
                    True, value_of(5), True), limits
            assert compiled._compiled._engine.in_flight() == 0

    asyncio.run(main())


@pytest.fixture(scope="module")
def secured(routers, tmp_path_factory):
    """(the compiled path's REST address, the Python path's, the compiled router's process, the auth file) of two
    routers that authenticate by one auth file."""
    d, _ = routers
    path = tmp_path_factory.mktemp("data-plane-auth") / "auth.json"
    write_auth_file(path)
    compiled, python = free_port(), free_port()
    proc = d.start_router("router-auth", rest_port=compiled, grpc_port=free_port(),
                          settings={"FRESHROUTE_AUTH_FILE": str(path)})
    d.start_router("router-auth-python", rest_port=python, grpc_port=free_port(),
                   settings={"FRESHROUTE_AUTH_FILE": str(path), "FRESHROUTE_DATA_PLANE": "python"})
    assert "REST lookups by the compiled path" in d.procs.log("router-auth")
    return f"http://127.0.0.1:{compiled}", f"http://127.0.0.1:{python}", proc, path


# Written as they are sent, spaces and a tab included (httpx would refuse the last ones).
CREDENTIALS = [b"", b"Authorization: Bearer " + GOOD.encode(), b"Authorization: Bearer wrong-token",
               b"Authorization: Basic Z29vZA==", b"Authorization: Bearer ", b"authorization: bearer   " +
               GOOD.encode(), b"Authorization: Bearer " + GOOD.encode() + b"\t", b"Authorization: Bearer " +
               NARROW.encode(), b"Authorization: Bearer wrong\r\nAuthorization: Bearer " + GOOD.encode(),
               b"Authorization: Bearer caf\xc3\xa9"]


def raw_get(base: str, path: str, header: bytes) -> tuple[int, dict[str, str], dict]:
    """(status, headers, JSON body) of one GET with ``header`` as written, on a connection of its own."""
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: r\r\n%sConnection: close\r\n\r\n"
                     % (path.encode(), header + b"\r\n" if header else b""))
        raw = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, orjson.loads(body)


@pytest.mark.parametrize("header", CREDENTIALS, ids=[f"credentials{i}" for i in range(len(CREDENTIALS))])
@pytest.mark.parametrize("path", [f"/v1/tables/{TABLE}/keys/sensor-1", f"/v1/tables/{TABLE}/keys/nope",
                                  "/v1/tables/nope/keys/k", f"/v1/tables/{TABLE}/keys/sensor-1?max_lag=x",
                                  f"/v1/tables/{TABLE}/keys/sensor-1/metadata"])
def test_credentials_are_judged_as_the_python_path_judges_them(secured, path, header):
    compiled, python, _, _ = secured
    (status, headers, got), (reference, reference_headers, want) = raw_get(compiled, path, header), \
        raw_get(python, path, header)
    assert status == reference, (got, want)
    assert headers.get("www-authenticate") == reference_headers.get("www-authenticate")
    assert served_elsewhere(got) == served_elsewhere(want)


def test_good_tokens_are_served_here_and_bad_ones_refused_here(secured):
    compiled, _, _, _ = secured
    before = metrics(compiled, GOOD)
    with httpx.Client(base_url=compiled, timeout=10) as client:
        for i in range(20):
            assert client.get(f"/v1/tables/{TABLE}/keys/sensor-{i}", headers=bearer(GOOD)).json()["value"] == \
                value_of(i)
        for i in range(20):
            refused = client.get(f"/v1/tables/{TABLE}/keys/sensor-{i}", headers=bearer(f"bad-{i}"))
            assert refused.status_code == 401 and refused.json()["error"] == {
                "code": "UNAUTHENTICATED", "message": "the token is not valid"}
    after = metrics(compiled, GOOD)
    relayed = 'freshroute_router_compiled_path_handoffs_total{how="relayed"}'
    assert after[relayed] == before[relayed]  # the metrics' own request is handed over, not relayed
    ok = 'freshroute_router_lookups_total{outcome="ok",role="%s"}'
    assert sum(after[ok % r] - before[ok % r] for r in ("active", "standby")) == 20


def test_a_rated_principal_is_served_what_its_bucket_holds_here_and_refused_the_rest(secured):
    compiled, _, _, _ = secured
    before = metrics(compiled, GOOD)
    statuses = []
    with httpx.Client(base_url=compiled, timeout=10, headers=bearer(RATED)) as client:
        time.sleep(BURST / RATE + 0.2)  # a full bucket
        start = time.monotonic()
        for _ in range(150):  # about 3 s of lookups at 50/s: 2.5 times the rate
            statuses.append(client.get(f"/v1/tables/{TABLE}/keys/sensor-1"))
            time.sleep(0.02)
        elapsed = time.monotonic() - start
    served = sum(r.status_code == 200 for r in statuses)
    refused = [r for r in statuses if r.status_code != 200]
    assert all(r.status_code == 429 and r.json()["error"]["code"] == "RATE_LIMITED" and
               int(r.headers["retry-after"]) >= 1 for r in refused)
    granted = BURST + RATE * elapsed
    assert 0.8 * granted <= served <= granted + 1, (served, granted)
    after = metrics(compiled, GOOD)
    relayed = after['freshroute_router_compiled_path_handoffs_total{how="relayed"}'] - \
        before['freshroute_router_compiled_path_handoffs_total{how="relayed"}']
    assert relayed - len(refused) < served / 2, (relayed, served)  # most served lookups spent a lease here


def test_a_reloaded_auth_file_takes_effect_on_the_path_at_once(secured):
    compiled, _, proc, path = secured
    with httpx.Client(base_url=compiled, timeout=10) as client:
        assert client.get(f"/v1/tables/{TABLE}/keys/sensor-1", headers=bearer(GOOD)).status_code == 200
        write_auth_file(path, good="renewed-token-55aa")
        try:
            proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while client.get(f"/v1/tables/{TABLE}/keys/sensor-1", headers=bearer(GOOD)).status_code != 401:
                assert time.monotonic() < deadline, "the old token still served after a reload"
                time.sleep(0.05)
            assert client.get(f"/v1/tables/{TABLE}/keys/sensor-1",
                              headers=bearer("renewed-token-55aa")).json()["value"] == value_of(1)
        finally:
            write_auth_file(path)
            proc.send_signal(signal.SIGHUP)


@pytest.fixture(scope="module")
def over_tls(routers, secured, tmp_path_factory):
    """(the compiled path's https address, the Python path's, the compiled router's process, its certificate files,
    the CA's certificate) of two routers speaking TLS, authenticating by the auth file of ``secured``."""
    d, _ = routers
    pki = tmp_path_factory.mktemp("data-plane-tls")
    ca = make_ca(pki)
    server = issue(ca, pki, "router", "router one")
    tls = {"FRESHROUTE_TLS_CERT": str(server.cert), "FRESHROUTE_TLS_KEY": str(server.key),
           "FRESHROUTE_AUTH_FILE": str(secured[3])}
    compiled, python = free_port(), free_port()
    verify = ssl.create_default_context(cafile=str(ca.cert))
    proc = d.start_router("router-tls", rest_port=compiled, grpc_port=free_port(), settings=tls, verify=verify)
    d.start_router("router-tls-python", rest_port=python, grpc_port=free_port(),
                   settings={**tls, "FRESHROUTE_DATA_PLANE": "python"}, verify=verify)
    assert "REST lookups by the compiled path" in d.procs.log("router-tls")
    return f"https://127.0.0.1:{compiled}", f"https://127.0.0.1:{python}", proc, server, ca


@pytest.mark.parametrize("path", [f"/v1/tables/{TABLE}/keys/sensor-1", f"/v1/tables/{TABLE}/keys/nope",
                                  f"/v1/tables/{TABLE}/keys/sensor-1?max_lag=x", "/v1/tables", "/healthz",
                                  f"/v1/tables/{TABLE}/keys/sensor-1/metadata", "/nowhere"])
@pytest.mark.parametrize("token", [GOOD, "wrong-token"])
def test_over_tls_every_request_is_answered_as_the_python_path_answers_it(over_tls, path, token):
    compiled, python, _, _, ca = over_tls
    verify = ssl.create_default_context(cafile=str(ca.cert))
    got, want = (httpx.get(base + path, headers=bearer(token), verify=verify, timeout=10) for base in (compiled, python))
    assert got.status_code == want.status_code, (got.text, want.text)
    assert got.headers.get("content-type") == want.headers.get("content-type")
    if got.headers.get("content-type") == "application/json":
        assert served_elsewhere(got.json()) == served_elsewhere(want.json())


def test_over_tls_lookups_are_served_here_on_kept_alive_connections(over_tls):
    compiled, _, _, _, ca = over_tls
    verify = ssl.create_default_context(cafile=str(ca.cert))
    before = metrics(compiled, GOOD, verify)
    with httpx.Client(base_url=compiled, verify=verify, headers=bearer(GOOD), timeout=10) as client:
        for i in range(KEYS):
            assert client.get(f"/v1/tables/{TABLE}/keys/sensor-{i}").json()["value"] == value_of(i)
    after = metrics(compiled, GOOD, verify)
    relayed = 'freshroute_router_compiled_path_handoffs_total{how="relayed"}'
    connections = 'freshroute_router_compiled_path_connections_total{port="rest"}'
    assert after[relayed] == before[relayed]
    assert after[connections] - before[connections] == 2  # one for the lookups, one for the metrics
    # The metrics request's connection, whose TLS session is the path's, was spliced through to the Python front.
    handoffs = 'freshroute_router_compiled_path_handoffs_total{how="%s"}'
    assert (after[handoffs % "handed_over"] - before[handoffs % "handed_over"], after[handoffs % "adopted"]) == (1, 0)
    with socket.create_connection(("127.0.0.1", int(compiled.rsplit(":", 1)[1])), timeout=10) as raw:
        context = ssl.create_default_context(cafile=str(ca.cert))
        context.set_alpn_protocols(["h2", "http/1.1"])
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.selected_alpn_protocol() == "http/1.1" and tls.version() in ("TLSv1.3", "TLSv1.2")


def test_plain_http_on_the_tls_port_is_closed_and_lookups_go_on(over_tls):
    compiled, _, _, _, ca = over_tls
    with socket.create_connection(("127.0.0.1", int(compiled.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(f"GET /v1/tables/{TABLE}/keys/sensor-1 HTTP/1.1\r\nHost: r\r\n\r\n".encode())
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    assert not answer.startswith(b"HTTP/1.1 200")  # a TLS alert, or nothing: never a value in the clear
    verify = ssl.create_default_context(cafile=str(ca.cert))
    assert httpx.get(f"{compiled}/v1/tables/{TABLE}/keys/sensor-1", headers=bearer(GOOD), verify=verify,
                     timeout=10).status_code == 200


def test_a_reloaded_certificate_is_presented_by_new_handshakes(over_tls, tmp_path):
    compiled, _, proc, server, ca = over_tls
    port = int(compiled.rsplit(":", 1)[1])

    def presented() -> str:
        context = ssl.create_default_context(cafile=str(ca.cert))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return dict(x[0] for x in tls.getpeercert()["subject"])["commonName"]

    assert presented() == "router one"
    original = server.cert.read_bytes(), server.key.read_bytes()
    renewed = issue(ca, tmp_path, "renewed", "router two")
    try:
        server.cert.write_bytes(renewed.cert.read_bytes())
        server.key.write_bytes(renewed.key.read_bytes())
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while presented() != "router two":
            assert time.monotonic() < deadline, "the old certificate still presented after a reload"
            time.sleep(0.05)
    finally:
        server.cert.write_bytes(original[0])
        server.key.write_bytes(original[1])
        proc.send_signal(signal.SIGHUP)

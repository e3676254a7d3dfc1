"""The compiled lookup path's routing view and its replica order, held to the Python routing's (freshroute.routing)."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import orjson
import pytest

from freshroute.metadata.progress import InputEnds, InputLag, InputMark
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.table_versions import TableVersion, VersionedTable, VersionState
from freshroute.metadata.tables import TableSpec
from freshroute.routing.counts import LATENCY_BUCKETS, OUTCOMES, ROLES
from freshroute.routing.policy import RoutingPolicy, TableBound
from freshroute.routing.selection import FreshestFirst, LoadTracker
from freshroute.routing.snapshot import LagOverlay, NodeView, ReplicaView, Snapshot
from freshroute.bound import Bound
from freshroute.position import Position
from freshroute.windows import hopping
from freshroute.routing.compiled_view import snapshot_doc

dataplane = pytest.importorskip("freshroute_dataplane", reason="the compiled path is built by ./dev (native/dataplane)")
ROOT = Path(__file__).resolve().parents[2]
NOW = 1_000_000
CONFIG = {"attempt_timeout_ms": 500, "hedge": True, "hedge_quantile": 0.95, "hedge_min_ms": 5.0, "hedge_budget": 0.1,
          "max_windows": 1000,
          "freshness_tolerance_offsets": 0, "freshness_tolerance_ms": 0, "view_trust_ms": 1000,
          "failure_backoff_ms": 1000, "node_expiry_ms": 2000, "cluster_secret": "", "keep_alive_s": 5.0,
          "authenticates": False}


def view(node: str, table: str = "t", partition: int = 0, role: Role = Role.STANDBY,
         state: ReplicaState | None = ReplicaState.STANDBY, applied: int = 10, end: int | None = 10,
         staleness_ms: int = 0, observed_ms: int = NOW, alive: bool = True, draining: bool = False) -> ReplicaView:
    return ReplicaView(node, f"{node}:7000", table, partition, role, state, applied, end, staleness_ms, observed_ms,
                       alive, draining)


def snapshot(tables: list[TableSpec], views: list[ReplicaView], **kw) -> Snapshot:
    replicas: dict[tuple[str, int], tuple[ReplicaView, ...]] = {}
    for v in views:
        replicas[(v.table, v.partition)] = (*replicas.get((v.table, v.partition), ()), v)
    nodes = {v.node: NodeView(v.node, v.address, v.alive, v.draining, None, f"127.0.0.1:{7100 + i}")
             for i, v in enumerate(views)}
    return Snapshot({t.name: t for t in tables}, replicas, nodes, None, NOW, True, **kw)


def test_the_view_serves_keyed_string_tables_with_their_default_bounds_and_input_lag():
    tables = [TableSpec("plain", "plain-changelog", 2, "k", default_max_lag=7, input_topic="in"),
              TableSpec("bounded", "b-changelog", 1, "k", default_max_lag=3, default_max_staleness_ms=9,
                        history_retention_ms=60_000),
              TableSpec("json_keys", "j", 1, "k", key_format="json", value_format="bytes"),
              TableSpec("windowed", "w", 1, "k", window=hopping("10s", "5s", retention="1h")),
              TableSpec("windowed_json_keys", "wj", 1, "k", key_format="json", window=hopping("10s", "5s"))]
    snap = snapshot(tables, [view("n1", "plain", 1, applied=4, end=None)],
                    input_lag={"plain": InputLag(5, NOW - 100, NOW - 50, {0: 11}, NOW)},
                    input_ends={"in": InputEnds({0: 16}, NOW - 10)},
                    input_marks={"plain": (InputMark({0: 3}, {0: 5, 1: 2}, NOW - 30), InputMark({0: 9}, {0: 8}, NOW))},
                    rejected={"in": {0: {4: "not JSON", 6: "no sensor"}}, "other": {0: {1: "x"}}})
    policy = RoutingPolicy(table_bounds={"bounded": TableBound(max_staleness_ms=100)})
    doc = orjson.loads(snapshot_doc(snap, policy))
    assert doc["tables"]["plain"] == {
        "partitions": 2, "served": True, "window": None, "history_retention_ms": None, "value_format": "json",
        "max_lag": 7, "max_staleness_ms": None,
        "input_lag": {"records": 5, "caught_up_ms": NOW - 100, "at_ms": NOW - 50, "alive_ms": NOW,
                      "offsets": {"0": 11}},
        "input_ends": {"at_ms": NOW - 10, "ends": {"0": 16}}, "version": 1, "physical": "plain",
        # What a read after a write token narrows it by: its topics, its marks (oldest first), the input's rejections.
        "input_topic": "in", "changelog_topic": "plain-changelog",
        "marks": [[{"0": 3}, {"0": 5, "1": 2}], [{"0": 9}, {"0": 8}]], "rejected": {"0": [4, 6]}}
    # The router's override replaces the pipeline's defaults whole, as RoutingCore.bound_for does.
    assert (doc["tables"]["bounded"]["max_lag"], doc["tables"]["bounded"]["max_staleness_ms"]) == (None, 100)
    assert doc["tables"]["bounded"]["history_retention_ms"] == 60_000  # read as of a time within it
    assert doc["tables"]["json_keys"]["served"] is False and doc["tables"]["json_keys"]["value_format"] == "bytes"
    # Windows of string keys are served, as their window says; of other keys, not at all.
    assert (doc["tables"]["windowed"]["served"], doc["tables"]["windowed"]["window"]) == (
        False, {"size_ms": 10_000, "slide_ms": 5_000, "retention_ms": 3_600_000})
    assert doc["tables"]["windowed_json_keys"]["window"] is None
    assert doc["replicas"] == [["plain", 1, [["n1", "127.0.0.1:7100", "standby", "STANDBY", 4, None, 0, NOW, True,
                                              False]]]]
    dataplane.Front(-1, 1, orjson.dumps(CONFIG).decode()).update(snapshot_doc(snap, policy))
    with pytest.raises(ValueError, match="routing snapshot"):
        dataplane.Front(-1, 1, orjson.dumps(CONFIG).decode()).update(b"{}")


def test_the_view_serves_a_table_by_its_name_from_the_version_it_serves():
    """A table serving version N is listed by its name as version N's own table (``t-v2``): that table's spec, input
    lag and replicas, read by the name ``physical``; no version's own name is listed, served or not, nor are the
    replicas of a version not served (the Python path reads those, and a version named by number)."""
    def record(name: str, serving: int, building: int | None = None) -> VersionedTable:
        versions = {n: TableVersion(n, VersionState.SERVING if n == serving else VersionState.PREVIOUS, f"f{n}", NOW)
                    for n in range(1, serving + 1)}
        if building is not None:
            versions[building] = TableVersion(building, VersionState.BUILDING, f"f{building}", NOW)
        return VersionedTable(name, serving, versions)
    tables = [TableSpec("t", "t-changelog", 1, "k", default_max_lag=1, input_topic="in"),
              TableSpec("t-v2", "t-v2-changelog", 4, "k", default_max_lag=2, history_retention_ms=60_000,
                        value_format="string", input_topic="in2"),
              TableSpec("w", "w-changelog", 1, "k", window=hopping("10s", "5s")),
              TableSpec("w-v3", "w-v3-changelog", 1, "k", window=hopping("20s", "10s", retention="1h")),
              TableSpec("kept", "kept-changelog", 1, "k", history_retention_ms=60_000),
              TableSpec("kept-v2", "kept-v2-changelog", 1, "k"),
              TableSpec("retired-v2", "retired-v2-changelog", 1, "k"),
              TableSpec("plain", "plain-changelog", 1, "k")]
    # The replicas of versions not served are on node "old".
    views = [view("old" if t.name in ("t", "w", "kept-v2") else "n1", t.name) for t in tables] + [view("n2", "t-v2", 3)]
    snap = snapshot(tables, views, versions={"t": record("t", 2), "w": record("w", 3), "kept": record("kept", 1, 2),
                                             "retired": record("retired", 2)},
                    input_lag={"t": InputLag(1, NOW, NOW, {0: 1}, NOW), "t-v2": InputLag(5, NOW - 100, NOW - 50,
                                                                                        {0: 11}, NOW)},
                    input_ends={"in": InputEnds({0: 1}, NOW), "in2": InputEnds({0: 16}, NOW - 10)})
    policy = RoutingPolicy(table_bounds={"w": TableBound(max_lag=9)})
    doc = orjson.loads(snapshot_doc(snap, policy))
    assert set(doc["tables"]) == {"t", "w", "kept", "retired", "plain"}
    assert doc["tables"]["t"] == {
        "partitions": 4, "served": True, "window": None, "history_retention_ms": 60_000, "value_format": "string",
        "max_lag": 2, "max_staleness_ms": None,
        "input_lag": {"records": 5, "caught_up_ms": NOW - 100, "at_ms": NOW - 50, "alive_ms": NOW,
                      "offsets": {"0": 11}},
        "input_ends": {"at_ms": NOW - 10, "ends": {"0": 16}}, "version": 2, "physical": "t-v2",
        "input_topic": "in2", "changelog_topic": "t-v2-changelog", "marks": [], "rejected": {}}
    # Windows of version 3's spec; the router's override, by the table's name, over that spec's defaults.
    assert {k: doc["tables"]["w"][k] for k in ("served", "window", "max_lag", "version", "physical")} == {
        "served": False, "window": {"size_ms": 20_000, "slide_ms": 10_000, "retention_ms": 3_600_000}, "max_lag": 9,
        "version": 3, "physical": "w-v3"}
    # Version 1 served while version 2 is built beside it; version 1 retired, its table gone.
    assert {k: doc["tables"]["kept"][k] for k in ("served", "history_retention_ms", "version", "physical")} == {
        "served": True, "history_retention_ms": 60_000, "version": 1, "physical": "kept"}
    assert (doc["tables"]["retired"]["version"], doc["tables"]["retired"]["physical"]) == (2, "retired-v2")
    assert (doc["tables"]["plain"]["version"], doc["tables"]["plain"]["physical"]) == (1, "plain")
    # Each table's reads go to its served version's replicas, listed under its name.
    replicas = {(table, partition): [r[0] for r in row] for table, partition, row in doc["replicas"]}
    assert replicas == {("t", 0): ["n1"], ("t", 3): ["n2"], ("w", 0): ["n1"], ("kept", 0): ["n1"],
                        ("retired", 0): ["n1"], ("plain", 0): ["n1"]}
    dataplane.Front(-1, 1, orjson.dumps(CONFIG).decode()).update(snapshot_doc(snap, policy))


def test_the_compiled_order_is_freshest_firsts():
    """Random partitions of up to four replicas, random lags, views, states and liveness, random bounds: the compiled
    path asks the replicas FreshestFirst would put within the bound or cannot judge (an old view, or one behind the
    position alone), in its order."""
    rng = random.Random(11)
    spec = TableSpec("t", "t-changelog", 1, "k")
    for case in range(400):
        end = rng.randrange(100, 200)
        views = []
        for i in range(rng.randrange(1, 5)):
            known = rng.random() < 0.85
            views.append(view(f"n{i}", applied=end - rng.randrange(0, 25) * 4 - i, end=end if known else None,
                              staleness_ms=rng.choice((0, 0, 50, 400, 5000)) + i,
                              observed_ms=NOW - rng.choice((0, 10, 900, 1500, 4000)),
                              state=rng.choice((ReplicaState.ACTIVE, ReplicaState.STANDBY, ReplicaState.STANDBY,
                                                ReplicaState.RESTORING, ReplicaState.FAILED, None)),
                              alive=rng.random() < 0.85))
        position = rng.choice((None, None, Position("t", {0: end - rng.randrange(0, 60)}), Position("t", {1: 5})))
        bound = Bound(max_lag=rng.choice((None, None, 0, 5, 30)), max_staleness_ms=rng.choice((None, None, 100, 2000)),
                      min_position=position)
        python = FreshestFirst(LoadTracker(), LagOverlay(), clock_ms=lambda: NOW, rng=random.Random(1))
        want = [c.replica.node for c in python.select(views, bound).candidates]
        got = dataplane.order(snapshot_doc(snapshot([spec], views), RoutingPolicy()), orjson.dumps(CONFIG).decode(),
                              "t", 0, bound.max_lag, bound.max_staleness_ms, bound.min_offset(0), NOW)
        assert got == want, (case, views, bound)


def test_the_compiled_counts_are_labelled_and_bucketed_as_the_routers_metrics():
    """The path counts lookups into the same series as the Python path (freshroute.routing.counts): the same
    latency buckets, outcomes and roles."""
    counts = dataplane.Front(-1, 1, orjson.dumps(CONFIG).decode()).counts()
    assert tuple(counts["bucket_bounds"]) == LATENCY_BUCKETS
    assert len(counts["buckets"]) == len(LATENCY_BUCKETS) + 1
    assert set(counts["lookups"]) <= {(o, r) for o in OUTCOMES for r in ROLES}


def test_the_crates_own_tests_pass():
    """``cargo test`` of native/dataplane: its parsers, bodies, hash and order against values of the Python code."""
    rustup = Path.home() / ".cargo/bin/cargo"  # as ./dev finds it: rustup's, else the one on the PATH
    cargo = str(rustup) if rustup.exists() else "cargo"
    env = {**os.environ, "CARGO_TARGET_DIR": str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                                                 / "freshroute" / "cargo-test")}
    # The dev profile: the tests time nothing, and it compiles in half the CPU of --release (53 s against 113).
    done = subprocess.run([cargo, "test", "--quiet", "--manifest-path",
                           str(ROOT / "native/dataplane/Cargo.toml")], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "test result: ok" in done.stdout


def test_principals_are_pushed_with_the_tables_the_guard_lets_them_read(tmp_path):
    from router.auth import load_auth_file, token_hash
    from router.data_plane import principals_doc

    path = tmp_path / "auth.json"
    path.write_text(orjson.dumps({"principals": [
        {"name": "dash", "token_sha256": token_hash("d"), "tables": ["sensor_*", "area_counts"],
         "rate": {"reads_per_s": 5, "burst": 8}},
        {"name": "ops", "token_sha256": token_hash("o"), "tables": ["*"], "cluster": True},
        {"name": "billing", "certificate_subject": "CN=billing", "tables": ["invoices"]}]}).decode())
    doc = orjson.loads(principals_doc(load_auth_file(path), {"sensor_stats", "area_counts", "invoices", "sensors"}))
    assert doc == {"principals": [
        {"name": "dash", "token_sha256": token_hash("d"), "tables": ["area_counts", "sensor_stats"],
         "rate": {"reads_per_s": 5.0, "burst": 8.0}},
        {"name": "ops", "token_sha256": token_hash("o"), "tables": ["area_counts", "invoices", "sensor_stats",
                                                                    "sensors"], "rate": None}]}


def test_principals_are_pushed_with_the_tables_by_the_names_reads_give(tmp_path):
    """Once version 1 of a table is retired only its version 2's own table (``t-v2``) is left, and reads still name
    the table: a principal that may read it is pushed with the table's name."""
    from router.auth import Guard, token_hash
    from router.data_plane import DataPlane
    from router.metrics import RouterMetrics
    from router.rate_limit import LocalRates
    from router.settings import RouterSettings

    path = tmp_path / "auth.json"
    path.write_text(orjson.dumps({"principals": [
        {"name": "dash", "token_sha256": token_hash("d"), "tables": ["t"]}]}).decode())

    class Front:
        def __init__(self) -> None:
            self.pushed: list[list[str]] = []

        def update(self, doc: bytes) -> None:
            pass

        def principals(self, doc: bytes) -> None:
            self.pushed.append(orjson.loads(doc)["principals"][0]["tables"])

    plane = DataPlane(RouterSettings(auth_file=path), RouterMetrics(), Guard(path, LocalRates()))
    plane._front = front = Front()
    record = VersionedTable("t", 2, {1: TableVersion(1, VersionState.RETIRED, "f1", NOW),
                                     2: TableVersion(2, VersionState.SERVING, "f2", NOW)})
    plane.on_snapshot(snapshot([TableSpec("t-v2", "t-v2-changelog", 1, "k")], [], versions={"t": record}))
    assert front.pushed == [["t"]]


def test_the_path_is_leased_about_a_tenth_of_a_second_of_its_demand_from_the_principals_bucket(tmp_path):
    import asyncio

    from router.auth import Guard, token_hash
    from router.data_plane import DataPlane
    from router.metrics import RouterMetrics
    from router.rate_limit import LocalRates
    from router.settings import RouterSettings

    path = tmp_path / "auth.json"
    path.write_text(orjson.dumps({"principals": [
        {"name": "dash", "token_sha256": token_hash("d"), "tables": ["*"], "rate": {"reads_per_s": 1000, "burst": 50}},
        {"name": "idle", "token_sha256": token_hash("i"), "tables": ["*"], "rate": {"reads_per_s": 9, "burst": 9}}
    ]}).decode())

    class Front:
        """What the compiled front reports: dash asked for 100 lookups since each look, spent what it was leased."""
        def __init__(self) -> None:
            self.granted: list[tuple[str, int]] = []

        def rates(self) -> dict[str, tuple[int, int]]:
            return {"dash": (0, 100), "idle": (3, 0), "gone": (0, 100)}

        def grant(self, name: str, tokens: int) -> bool:
            self.granted.append((name, tokens))
            return True

    async def main() -> list[tuple[str, int]]:
        guard = Guard(path, LocalRates())
        plane = DataPlane(RouterSettings(auth_file=path), RouterMetrics(), guard)
        plane._front = front = Front()
        task = asyncio.create_task(plane.lease())
        await asyncio.sleep(0.16)
        task.cancel()
        return front.granted

    granted = asyncio.run(main())
    assert granted and {name for name, _ in granted} == {"dash"}  # the idle one asked nothing, "gone" has no rate
    # 100 asked per 50 ms is 2,000/s: 200 a lease, capped at half the burst; the burst refills by 50 per 50 ms.
    assert all(1 <= tokens <= 25 for _, tokens in granted) and granted[0] == ("dash", 25), granted


def test_store_nodes_over_tls_keep_the_compiled_path_unless_rustls_cannot_use_the_files(tmp_path):
    from router.data_plane import cluster_files, why_not
    from router.settings import RouterSettings
    from tools.local.certs import issue, make_ca

    ca = make_ca(tmp_path)
    client = issue(ca, tmp_path, "router", "router", server=False)
    plain = RouterSettings()
    assert why_not(plain) is None and cluster_files(plain) is None
    trusted = RouterSettings(cluster_ca=ca.cert, cluster_cert=client.cert, cluster_key=client.key)
    assert why_not(trusted) is None
    assert cluster_files(trusted) == (ca.cert.read_bytes(), client.cert.read_bytes(), client.key.read_bytes())
    not_a_ca = tmp_path / "not-a-ca.pem"
    not_a_ca.write_text("nothing here\n")
    assert "rustls cannot reach store nodes with these files: cluster_ca holds no certificate" in \
        why_not(RouterSettings(cluster_ca=not_a_ca))
    assert "cluster_cert without cluster_ca" in why_not(RouterSettings(cluster_cert=client.cert,
                                                                       cluster_key=client.key))

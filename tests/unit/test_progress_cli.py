"""A version building, on the command line: the bar and the estimate as text, the lines ``freshroute table list``
shows under a table with versions, and ``freshroute table progress`` following a version until it has caught up,
is served, fails or its time is up (over an in-memory Redis, the metadata store as the commands read it)."""

from __future__ import annotations

import io
import json

import pytest

from freshroute.errors import TableVersionNotFound
from freshroute.lag import now_ms
from freshroute.metadata.progress import InputEnds, InputLag
from freshroute.metadata.reports import NodeReport, ReplicaReport
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.tables import TableSpec
from freshroute.metadata.version_store import TableVersionStore
from tests.unit.memory_redis import MemoryRedis
from tools import progress_cli
from tools.cli import main
from tools.progress_cli import CAUGHT_UP, FAILED, TIMED_OUT, bar, duration_text, estimate_text, version_line

T, V2 = "stats", "stats-v2"
SPECS = [TableSpec(n, f"{n}-changelog", 2, "id", {"n": "long"}, 1, input_topic="readings") for n in (T, V2)]


# ---- the text -----------------------------------------------------------------------------------------------------

def test_the_bar_is_plain_text_rounded_down_and_unknown_says_so():
    assert bar(0.45) == "[#########-----------] 45%"
    assert bar(0.0) == "[--------------------] 0%"
    assert bar(0.999) == "[###################-] 99%"  # 100% only once all is
    assert bar(1.0) == "[####################] 100%"
    assert bar(None) == "[--------------------] ?%"
    assert bar(0.5, width=10) == "[#####-----] 50%"


def test_the_estimate_reads_as_a_person_says_it():
    assert [duration_text(ms) for ms in (400, 45_000, 59_500, 180_000, 3_599_000, 7_500_000, 3 * 86_400_000)] == \
        ["1 s", "45 s", "60 s", "3 min", "1 h", "2 h 5 min", "3 d"]
    assert duration_text(7_200_000) == "2 h" and duration_text(0) == "0 s"
    assert estimate_text(180_000) == "caught up in ~3 min"
    assert estimate_text(0) == "caught up"
    assert estimate_text(None) == "catch-up time unknown"


def test_a_version_as_a_line():
    building = {"version": 2, "state": "building", "input_lag": {"records": 120_000, "ms": 42_000},
                "progress": 0.45, "caught_up_in_ms": 180_000}
    assert version_line(building) == ("v2 building  input lag 120000 records (42 s)  [#########-----------] 45%  "
                                      "caught up in ~3 min")
    assert version_line({**building, "progress": None, "caught_up_in_ms": None}).endswith(
        "[--------------------] ?%  catch-up time unknown")
    assert version_line({"version": 1, "state": "serving", "input_lag": {"records": 0, "ms": 0}}) == \
        "v1 serving   input lag 0 records"
    assert version_line({"version": 2, "state": "building"}).startswith("v2 building  input lag unknown  [")
    assert version_line({"version": 3, "state": "failed", "reason": "Spark: [UNRESOLVED_COLUMN] top"}) == \
        "v3 failed    Spark: [UNRESOLVED_COLUMN] top"


# ---- over the metadata store --------------------------------------------------------------------------------------

class Stores:
    """The metadata store and the version records over one in-memory Redis: table ``stats`` serving version 1, and
    version 2 building from input topic ``readings``."""

    def __init__(self) -> None:
        self.redis = MemoryRedis()
        self.metadata = MetadataStore(self.redis.sync, "ns")
        self.versions = TableVersionStore(self.redis.sync, "ns")
        self.metadata.register_tables(SPECS)
        self.versions.adopt(T, "fp1", 1_000)
        self.versions.begin(T, "fp2", 2_000)

    def behind(self, records: int, now: int, falling: float | None = 100.0, switch_lag: int = 100) -> None:
        """Version 2 ``records`` behind an input of 2,000 records (none deleted), as the pipeline publishes it."""
        self.metadata.publish_input_lag(V2, InputLag(records, now - 5_000, now, {0: 1_000 - records, 1: 1_000}, now,
                                                     falling, switch_lag))
        self.metadata.publish_input_ends({"readings": InputEnds({0: 1_000, 1: 1_000}, now, {0: 0, 1: 0})})

    def replicas_caught_up(self, now: int) -> None:
        self.metadata.publish_node(NodeReport("n1", "127.0.0.1:1", now, tuple(
            ReplicaReport(V2, p, Role.ACTIVE, ReplicaState.ACTIVE, 100, 100, 10) for p in (0, 1))), 60_000)


@pytest.fixture
def stores(monkeypatch) -> Stores:
    s = Stores()
    # The commands' own way to the metadata store, to this one.
    monkeypatch.setattr(MetadataStore, "from_url", classmethod(lambda cls, *a, **k: s.metadata))
    monkeypatch.setenv("FRESHROUTE_NAMESPACE", "ns")
    return s


def test_table_list_shows_each_version_with_its_input_lag_and_the_building_ones_progress(stores, capsys):
    stores.behind(900, now_ms())
    assert main(["table", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("stats ") and "1 (2 building)" in out[1]
    assert out[2] == "  v1 serving   input lag 0 records"
    assert out[3].startswith("  v2 building  input lag 900 records (")
    assert out[3].endswith("[" + "#" * 11 + "-" * 9 + "] 55%  caught up in ~8 s")  # 1,100 of 2,000 records read
    assert main(["table", "list", "--json"]) == 0
    [table] = json.loads(capsys.readouterr().out)["tables"]
    assert table["versions"][1]["progress"] == pytest.approx(1_100 / 2_000)
    assert table["versions"][1]["caught_up_in_ms"] == 8_000 and table["versions"][1]["input_lag"]["records"] == 900


class Clock:
    """A clock ``sleep`` moves on, doing what the test says happens meanwhile."""

    def __init__(self, meanwhile=None) -> None:
        self.ms = now_ms()
        self.slept: list[float] = []
        self.meanwhile = meanwhile or (lambda clock: None)

    def __call__(self) -> int:
        return self.ms

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.ms += int(seconds * 1000)
        self.meanwhile(self)


def follow(stores: Stores, clock: Clock, tty: bool = False, every_ms: int = 1_000, timeout_ms: int = 60_000,
           version: int | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = progress_cli.follow(stores.metadata, stores.versions, T, version, every_ms, timeout_ms, None, out, err,
                               tty, clock_ms=clock, sleep=clock.sleep)
    return code, out.getvalue(), err.getvalue()


def test_progress_follows_a_version_until_it_is_served(stores):
    def meanwhile(clock: Clock) -> None:
        stores.behind(900 - 300 * len(clock.slept), clock.ms)
        if len(clock.slept) == 2:
            stores.versions.switch(T, 2, clock.ms, 60_000)

    clock = Clock(meanwhile)
    stores.behind(900, clock.ms)
    code, out, err = follow(stores, clock)
    lines = out.splitlines()
    assert code == CAUGHT_UP and err == ""
    assert len(lines) == 3 and all(line.startswith("stats v2 building  input lag ") for line in lines[:2])
    assert "] 55%  caught up in ~8 s" in lines[0] and "] 70%  caught up in ~5 s" in lines[1]  # one line per look
    assert lines[2] == "table stats: version 2 is served"
    assert clock.slept == [1.0, 1.0]


def test_progress_stops_at_a_failure_naming_its_reason(stores):
    def meanwhile(clock: Clock) -> None:
        stores.versions.fail(T, 2, "Spark: [UNRESOLVED_COLUMN] top")

    clock = Clock(meanwhile)
    stores.behind(900, clock.ms)
    code, out, err = follow(stores, clock)
    assert code == FAILED and code != 0
    assert err == "table stats: version 2 is failed: Spark: [UNRESOLVED_COLUMN] top\n"


def test_progress_gives_up_when_its_time_is_up(stores):
    clock = Clock(lambda c: stores.behind(900, c.ms, falling=None))  # stuck: the lag does not fall
    stores.behind(900, clock.ms, falling=None)
    code, out, err = follow(stores, clock, every_ms=1_000, timeout_ms=3_500)
    assert code == TIMED_OUT
    assert len(out.splitlines()) == 5 and all("catch-up time unknown" in line for line in out.splitlines())
    assert clock.slept == [1.0, 1.0, 1.0, 0.5]  # not past the timeout
    assert err == "table stats: version 2 is still building after 4 s (--timeout)\n"


def test_progress_ends_once_caught_up_with_its_input_and_its_replicas_with_their_changelog(stores):
    clock = Clock()
    stores.behind(50, clock.ms)  # within switch_lag (100) of its input…
    code, out, _ = follow(stores, clock, timeout_ms=1_000)
    assert code == TIMED_OUT  # …but no replica is caught up with its changelog: not yet
    assert "caught up  (stats-v2: partitions 0, 1 have no active replica within 100 offsets" in out
    stores.replicas_caught_up(clock.ms)
    code, out, _ = follow(stores, clock)
    assert code == CAUGHT_UP and out.splitlines()[-1].startswith(
        "table stats: version 2 has caught up with its input and its replicas with its changelog")


def test_on_a_terminal_the_bar_is_redrawn_on_its_line(stores):
    def meanwhile(clock: Clock) -> None:
        stores.behind(900 - 300 * len(clock.slept), clock.ms)
        if len(clock.slept) == 2:
            stores.versions.switch(T, 2, clock.ms, 60_000)

    clock = Clock(meanwhile)
    stores.behind(900, clock.ms)
    _, out, _ = follow(stores, clock, tty=True)
    drawn, said = out.rsplit("\n", 2)[0], out.rsplit("\n", 2)[1]
    assert drawn.count("\r") == 2 and "\n" not in drawn
    assert said == "table stats: version 2 is served"


def test_progress_of_a_table_with_nothing_building_is_named(stores):
    stores.versions.switch(T, 2, now_ms(), 60_000)
    with pytest.raises(TableVersionNotFound, match="table 'stats' has no version building .it serves version 2."):
        follow(stores, Clock())
    code, out, _ = follow(stores, Clock(), version=2)  # named, and served: nothing to wait for
    assert code == CAUGHT_UP and out == "table stats: version 2 is served\n"
    with pytest.raises(TableVersionNotFound, match="has no version 7"):
        follow(stores, Clock(), version=7)


def test_the_command_from_its_flags(stores, capsys):
    stores.behind(900, now_ms(), falling=None)
    assert main(["table", "progress", T, "--every", "1s", "--timeout", "0"]) == TIMED_OUT
    captured = capsys.readouterr()
    assert captured.out.startswith("stats v2 building  input lag 900 records")
    assert captured.err == "table stats: version 2 is still building after 0 s (--timeout)\n"
    with pytest.raises(SystemExit):
        main(["table", "progress", T, "--every", "0"])
    assert main(["table", "progress", "nope"]) == 2  # a named error: no version record
    assert "TABLE_VERSION_NOT_FOUND" in capsys.readouterr().err

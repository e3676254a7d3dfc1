"""``freshroute table deploy``: the request and its answer in Redis, the pipeline's taking of it (a definition in the
place of its tables file's, or a refusal naming why) and the command that asks and waits."""

from __future__ import annotations

import argparse
import threading
import time

import pytest

from freshroute.errors import ConfigError, TableDeployInProgress
from freshroute.metadata.deploys import DeployAnswer, DeployRequest, Deploys
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.table_versions import VersionState
from freshroute.metadata.version_store import TableVersionStore
from pipeline.deploys import DeployWatcher, Taken
from pipeline.settings import DEMO_TABLES_FILE
from pipeline.tables_file import load_tables
from pipeline.versions import PlannedVersion, VersionPlan
from tests.unit.memory_redis import MemoryRedis
from tools import deploy_cli

DEMO = DEMO_TABLES_FILE.read_text()
EDITED = DEMO.replace("GROUP BY area", "WHERE reading > 0 GROUP BY area")


def request(table: str = "area_counts", text: str = EDITED, at: int = 1_000) -> DeployRequest:
    return DeployRequest(table, text, "edited.py", "ana@host", at)


def test_one_deploy_of_a_table_at_a_time_and_none_while_a_version_builds():
    redis = MemoryRedis()
    deploys = Deploys(redis.sync, "ns")
    deploys.request(request())
    with pytest.raises(TableDeployInProgress, match="the deploy of table area_counts from edited.py by ana@host is "
                                                    "not taken yet: one deploy of a table at a time"):
        deploys.request(request(at=2_000))
    assert list(deploys.pending()) == ["area_counts"] and deploys.pending()["area_counts"].requested_ms == 1_000
    deploys.answer(DeployAnswer("area_counts", 1_000, 1_500, 2, "version 2 is building"))
    assert deploys.pending() == {} and deploys.answered("area_counts", 1_000).version == 2
    assert deploys.answered("area_counts", 999) is None  # another request's answer is not this one's
    versions = TableVersionStore(redis.sync, "ns")
    versions.adopt("sensor_stats", "fp1", 1_000)
    versions.begin("sensor_stats", "fp2", 2_000)
    with pytest.raises(TableDeployInProgress, match="version sensor_stats-v2 is still building"):
        deploys.request(request(at=3_000))


class FakeDeploys:
    def __init__(self, *pending: DeployRequest) -> None:
        self._pending = {r.table: r for r in pending}
        self.answers: list[DeployAnswer] = []

    def pending(self):
        return dict(self._pending)

    def answer(self, a: DeployAnswer) -> None:
        self.answers.append(a)
        self._pending.pop(a.table, None)


def test_a_start_takes_a_deployed_definition_and_answers_what_it_cannot_take(tmp_path):
    other_source = EDITED.replace('reading DOUBLE NOT NULL"', 'reading DOUBLE NOT NULL, unit STRING"')
    assert other_source != EDITED
    fake = FakeDeploys(request(), request("no_such_table", at=2_000), request("sensor_stats", DEMO.replace(
        'name="sensor_stats"', 'name="renamed"'), 3_000))
    taken = Taken(fake)  # type: ignore[arg-type]
    pipeline_file = load_tables(DEMO_TABLES_FILE)
    taken.take(pipeline_file, tmp_path)
    assert set(taken.definitions) == {"area_counts"} and "reading > 0" in taken.definitions["area_counts"][0].sql
    assert (tmp_path / ".definitions" / f"{taken.definitions['area_counts'][1]}.py").read_text() == EDITED
    messages = {a.table: a.message for a in fake.answers}
    assert messages["no_such_table"].startswith("refused: the pipeline's tables file") and all(
        a.version is None for a in fake.answers)
    assert messages["sensor_stats"].startswith("refused: edited.py does not declare table sensor_stats (it declares "
                                               "renamed, area_counts")
    assert taken.seen == {("area_counts", 1_000), ("no_such_table", 2_000), ("sensor_stats", 3_000)}
    fake = FakeDeploys(request(text=other_source))
    taken = Taken(fake)  # type: ignore[arg-type]
    taken.take(pipeline_file, tmp_path)
    assert taken.definitions == {} and fake.answers[0].message == (
        f"refused: edited.py declares source 'readings' otherwise than the pipeline's tables file {DEMO_TABLES_FILE}, "
        f"whose other tables read it: change it there")
    # Answered as the plan made from it says.
    fake = FakeDeploys(request())
    taken = Taken(fake)  # type: ignore[arg-type]
    taken.take(pipeline_file, tmp_path)
    plan = VersionPlan(pipeline_file, {"area_counts-v2": PlannedVersion("area_counts", 2, VersionState.BUILDING)},
                       begun={"area_counts": 2})
    taken.answer(plan, {})
    assert (fake.answers[-1].version, fake.answers[-1].message) == (
        2, "version 2 is building beside the one served, from the input's beginning")
    taken.answer(plan, {"area_counts": "[UNRESOLVED_COLUMN] x"})
    assert fake.answers[-1].message == "refused: version 2 failed: [UNRESOLVED_COLUMN] x"
    taken.answer(VersionPlan(pipeline_file, refused={"area_counts": "version x-v2 is still building"}), {})
    assert fake.answers[-1].message == "refused: version x-v2 is still building"


def test_the_watcher_says_a_deploy_is_due_once_one_not_seen_is_asked_for(monkeypatch):
    from pipeline import deploys as module

    monkeypatch.setattr(module, "WATCH_EVERY_S", 0.01)
    fake, stop = FakeDeploys(request()), threading.Event()
    seen = DeployWatcher(fake, stop, frozenset({("area_counts", 1_000)}))  # type: ignore[arg-type]
    seen.start()
    time.sleep(0.1)
    assert not seen.due.is_set()
    fake._pending["sensor_stats"] = request("sensor_stats", at=5_000)
    assert seen.due.wait(2)
    stop.set()
    seen.join(2)


def cli_args(tmp_path, text: str = EDITED, name: str = "area_counts", timeout_ms: int = 5_000) -> argparse.Namespace:
    path = tmp_path / "edited.py"
    path.write_text(text)
    return argparse.Namespace(name=name, tables=path, timeout=timeout_ms, no_wait=False, namespace="ns")


def test_the_command_asks_and_waits_for_the_pipeline_s_answer(tmp_path, capsys):
    redis = MemoryRedis()
    metadata, deploys = MetadataStore(redis.sync, "ns"), Deploys(redis.sync, "ns")

    def pipeline_answers(version, message):
        for _ in range(200):
            pending = deploys.pending()
            if pending:
                r = pending["area_counts"]
                deploys.answer(DeployAnswer(r.table, r.requested_ms, r.requested_ms + 1, version, message))
                return
            time.sleep(0.01)

    t = threading.Thread(target=pipeline_answers, args=(2, "version 2 is building beside the one served, from the "
                                                           "input's beginning"))
    t.start()
    assert deploy_cli.run(cli_args(tmp_path), metadata) == 0
    t.join()
    assert capsys.readouterr().out == ("table area_counts: version 2 is building beside the one served, from the "
                                       "input's beginning (`freshroute table progress area_counts` follows it)\n")
    t = threading.Thread(target=pipeline_answers, args=(None, "refused: version sensor_stats-v3 is still building"))
    t.start()
    assert deploy_cli.run(cli_args(tmp_path), metadata) == 1
    t.join()
    assert "deploy of" in capsys.readouterr().err
    # No pipeline takes it: said, and it stays asked for.
    assert deploy_cli.run(cli_args(tmp_path, timeout_ms=300), metadata) == deploy_cli.NOT_TAKEN
    assert "no pipeline has taken the deploy" in capsys.readouterr().err and list(deploys.pending()) == ["area_counts"]
    with pytest.raises(TableDeployInProgress):
        deploy_cli.run(cli_args(tmp_path), metadata)


def test_the_command_refuses_a_file_that_does_not_declare_the_table(tmp_path):
    with pytest.raises(ConfigError, match="does not declare table nope"):
        deploy_cli.run(cli_args(tmp_path, name="nope"), MetadataStore(MemoryRedis().sync, "ns"))

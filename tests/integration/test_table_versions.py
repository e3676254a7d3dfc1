"""A table redefined on the real broker and Spark: the new definition is built beside the served one as a table of
its own, from the input's beginning, while the served one goes on by its own definition; a definition Spark refuses
fails its version only."""

from __future__ import annotations

from collections import defaultdict

import orjson
import pytest

from freshroute.metadata.store import MetadataStore
from freshroute.metadata.version_store import TableVersionStore
from pipeline.version_mirror import MIRROR

from .backfill_support import TABLES, backfill
from .pipeline_support import PipelineProcess, materialize, mismatches, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.beside]

SPENT = TABLES.replace('F.max("amount").alias("largest"))',
                       'F.max("amount").alias("largest"), F.sum("amount").alias("spent"))')
REFUSED = TABLES.replace("count(*) AS orders, sum(amount) AS revenue", "count(*) AS orders, sum(price) AS revenue")


def states(versions: TableVersionStore, table: str) -> dict[int, str]:
    record = versions.record(table)
    assert record is not None
    return {n: v.state.value for n, v in record.versions.items()}


@pytest.mark.timeout(900)
def test_a_redefined_table_is_built_beside_the_served_one_and_a_refused_one_fails_alone(broker, redis_url, namespace,
                                                                                       tmp_path):
    assert SPENT != TABLES and REFUSED != TABLES  # the replacements found their text
    env = backfill(broker, redis_url, namespace, tmp_path)
    versions = TableVersionStore(MetadataStore.from_url(redis_url, namespace).redis, namespace)
    assert states(versions, "customer_totals") == {1: "serving"}
    served_before = materialize(read_topic(broker, f"{namespace}customer_totals-changelog"))
    orders = [orjson.loads(v) for _p, _o, _t, _k, v in read_topic(broker, f"{namespace}shop-orders")]

    # A definition Spark refuses (a column the source does not have): its version fails, naming why; the others run.
    refused_file = tmp_path / "refused_tables.py"
    refused_file.write_text(REFUSED)
    run = PipelineProcess({**env, "FRESHROUTE_TABLES_FILE": str(refused_file)}, tmp_path / "pipeline-refused.log")
    assert run.wait_exit(600) == 0, run.tail()
    text = run.log.read_text()
    assert "table orders_per_minute: its definition changed" in text and "Traceback" not in text
    record = versions.record("orders_per_minute")
    assert record is not None and states(versions, "orders_per_minute") == {1: "serving", 2: "failed"}
    reason = record.versions[2].reason or ""
    assert reason.startswith(f"table 'orders_per_minute-v2' in {refused_file}: AnalysisException: "
                             f"[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name "
                             f"`price` cannot be resolved."), reason
    assert versions.building() is None  # the next version may begin

    # A new aggregate column: version 2 is built from the input's beginning as a table of its own, in a query of its
    # own; version 1 goes on being served by the definition it was built with.
    spent_file = tmp_path / "spent_tables.py"
    spent_file.write_text(SPENT)
    run = PipelineProcess({**env, "FRESHROUTE_TABLES_FILE": str(spent_file)}, tmp_path / "pipeline-spent.log")
    assert run.wait_exit(600) == 0, run.tail()
    text = run.log.read_text()
    assert ("table customer_totals: its definition changed (fingerprint ") in text
    assert ("version 2 is built beside version 1 as table customer_totals-v2, from the input's beginning as the "
            "broker holds it") in text
    assert "Traceback" not in text
    assert states(versions, "customer_totals") == {1: "serving", 2: "building"}
    assert versions.building() == "customer_totals-v2"

    want: dict[str, dict] = defaultdict(lambda: {"items": 0, "largest": float("-inf"), "spent": 0.0})
    for o in orders:
        row = want[o["customer"]]
        row["items"] += o["items"]
        row["largest"] = max(row["largest"], o["amount"])
        row["spent"] += o["amount"]
    built = materialize(read_topic(broker, f"{namespace}customer_totals-v2-changelog"))
    assert mismatches(built, dict(want)) == []
    served_after = materialize(read_topic(broker, f"{namespace}customer_totals-changelog"))
    assert served_after == served_before  # no row of the served version is of the new definition
    assert all("spent" not in row for row in served_after.values())

    specs = MetadataStore.from_url(redis_url, namespace).tables()
    assert specs["customer_totals-v2"].value_schema == {"items": "bigint", "largest": "double", "spent": "double"}
    assert specs["customer_totals"].value_schema == {"items": "bigint", "largest": "double"}
    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / "customer_totals-v2" / "commits").is_dir()  # the query of its own
    mirrored = orjson.loads((checkpoints / MIRROR).read_bytes())
    assert {v["version"]: v["state"] for v in mirrored["customer_totals"]["versions"]} == {1: "serving",
                                                                                       2: "building"}

    # Started again with the same tables file: the version building goes on; nothing new begins.
    run = PipelineProcess({**env, "FRESHROUTE_TABLES_FILE": str(spent_file)}, tmp_path / "pipeline-again.log")
    assert run.wait_exit(600) == 0, run.tail()
    assert "is built beside" not in run.log.read_text()
    assert states(versions, "customer_totals") == {1: "serving", 2: "building"}


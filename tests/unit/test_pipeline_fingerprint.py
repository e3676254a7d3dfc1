"""A table definition's fingerprint: the same for the same rows, whatever the layout or the serving settings, and
different for anything that changes what the table computes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pipeline.fingerprint import fingerprint
from pipeline.settings import DEMO_TABLES_FILE
from pipeline.tables_file import load_tables

FILE = '''
    from pipeline.tables import source, table, sql_table, tumbling

    source("clicks", schema="user STRING, page STRING, at TIMESTAMP", topic="web-clicks")

    @table(name="per_user", key="user", source="clicks"{table_args})
    def per_user(df):
        {body}

    sql_table(name="per_page", key="page", source="clicks",
              sql="""{sql}"""{sql_args})
'''
BODY = 'return df.groupBy("user").count()'
SQL = "SELECT page, count(*) AS n\n    FROM clicks GROUP BY page"


def prints(tmp_path: Path, mode: str = "realtime", **edits: str) -> dict[str, str]:
    """The fingerprints of the file's two tables, with ``edits`` to its parts."""
    parts = {"table_args": "", "body": BODY, "sql": SQL, "sql_args": "", **edits}
    path = tmp_path / f"tables-{abs(hash(tuple(sorted(parts.items()))))}.py"
    path.write_text(textwrap.dedent(FILE).format(**parts))
    d = load_tables(path)
    return {n: fingerprint(t, d.sources[t.source], mode) for n, t in d.tables.items()}


def test_the_same_definition_loaded_twice_or_laid_out_otherwise_has_the_same_fingerprint(tmp_path):
    first = prints(tmp_path)
    assert prints(tmp_path) == first
    assert prints(tmp_path, body=f"# counted per user\n        {BODY}  # one row a user",
                  sql="  SELECT page, count(*) AS n\n        FROM clicks GROUP BY page  ") == first
    demo = load_tables(DEMO_TABLES_FILE)
    again = load_tables(DEMO_TABLES_FILE)
    for name, t in demo.tables.items():
        assert fingerprint(t, demo.sources[t.source], "realtime") == \
            fingerprint(again.tables[name], again.sources[t.source], "realtime")


def test_what_changes_how_a_table_is_served_but_not_its_rows_leaves_it_alone(tmp_path):
    assert prints(tmp_path, table_args=", standby_replicas=2, trigger_ms=500",
                  sql_args=", query=\"pages\"") == prints(tmp_path)


@pytest.mark.parametrize("table,edit", [
    ("per_user", {"body": 'return df.groupBy("user").agg({"page": "count"})'}),
    ("per_user", {"table_args": ", delete_when=\"user IS NULL\""}),
    ("per_user", {"table_args": ", history_retention=\"1h\""}),
    ("per_page", {"sql": "SELECT page, count(DISTINCT user) AS n FROM clicks GROUP BY page"}),
    ("per_page", {"sql": "SELECT page, count(*) AS n FROM clicks WHERE page <> 'a  b' GROUP BY page"}),
])
def test_a_change_to_what_a_table_computes_changes_its_fingerprint(tmp_path, table, edit):
    before, after = prints(tmp_path), prints(tmp_path, **edit)
    assert after[table] != before[table]
    other = ({"per_user", "per_page"} - {table}).pop()
    assert after[other] == before[other]


def test_the_source_schema_and_the_mode_are_part_of_every_table_of_the_source(tmp_path):
    base = prints(tmp_path)
    assert all(a != b for a, b in zip(base.values(), prints(tmp_path, mode="microbatch").values()))
    d = load_tables(DEMO_TABLES_FILE)
    t = d.tables["sensor_stats"]
    from dataclasses import replace
    wider = replace(d.sources[t.source], schema=d.sources[t.source].schema + ", unit STRING")
    assert fingerprint(t, wider, "realtime") != fingerprint(t, d.sources[t.source], "realtime")
    assert fingerprint(t, wider, "realtime") == fingerprint(t, replace(wider, dead_letter_topic="x"), "realtime")


def test_a_release_that_lays_out_a_modes_queries_otherwise_changes_the_fingerprints_of_that_mode_only(tmp_path,
                                                                                                     monkeypatch):
    from pipeline import fingerprint as fingerprinting

    realtime, microbatch = prints(tmp_path), prints(tmp_path, mode="microbatch")
    # The demo table's fingerprint under this release's layouts.
    d = load_tables(DEMO_TABLES_FILE)
    t = d.tables["sensor_stats"]
    before = fingerprint(t, d.sources[t.source], "realtime")
    monkeypatch.setitem(fingerprinting.QUERY_LAYOUTS, "realtime", 2)
    assert all(a != b for a, b in zip(realtime.values(), prints(tmp_path).values()))
    assert prints(tmp_path, mode="microbatch") == microbatch
    assert fingerprint(t, d.sources[t.source], "realtime") != before

"""Loading tables files: both declaration forms, and a clear error for every kind of broken file."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pipeline.settings import DEMO_TABLES_FILE
from pipeline.tables import (TablesFileError, Table, check_output_columns, check_source_fields, hopping, source,
                             sql_table, table, tumbling)
from pipeline.tables_file import load_tables, queries


def write(tmp_path: Path, body: str, name: str = "tables.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_demo_file_declares_both_forms():
    d = load_tables(DEMO_TABLES_FILE)
    assert set(d.sources) == {"readings"}
    assert d.sources["readings"].schema == "sensor STRING NOT NULL, area STRING NOT NULL, reading DOUBLE NOT NULL"
    assert d.sources["readings"].topic == "readings"
    stats = d.tables["sensor_stats"]
    assert (stats.key, stats.source, stats.sql) == ("sensor", "readings", None)
    assert callable(stats.build)
    counts = d.tables["area_counts"]
    assert (counts.key, counts.source, counts.build) == ("area", "readings", None)
    assert "GROUP BY area" in (counts.sql or "")
    windows = d.tables["sensor_windows"]
    assert (windows.key, windows.window) == ("sensor", tumbling("10s", grace="5s", retention="1h"))
    assert stats.window is None


def test_function_and_sql_forms_load_from_any_path(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source, table, sql_table

        source("clicks", schema="user STRING, page STRING", topic="web-clicks")

        @table(name="clicks_per_user", key="user", source="clicks")
        def clicks_per_user(df):
            return df.groupBy("user").count()

        sql_table(name="clicks_per_page", key="page", source="clicks",
                  sql="SELECT page, count(*) AS n FROM clicks GROUP BY page")
    ''')
    d = load_tables(path)
    assert d.sources["clicks"].topic == "web-clicks"
    assert sorted(d.tables) == ["clicks_per_page", "clicks_per_user"]
    assert d.tables["clicks_per_user"].build.__name__ == "clicks_per_user"  # type: ignore[union-attr]
    assert d.path == path


def test_edited_file_is_loaded_afresh(tmp_path):
    body = '''
        from pipeline.tables import source, sql_table
        source("s", schema="a STRING")
        sql_table(name="{name}", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a")
    '''
    path = write(tmp_path, body.replace("{name}", "first"))
    assert list(load_tables(path).tables) == ["first"]
    path.write_text(textwrap.dedent(body.replace("{name}", "second")))
    assert list(load_tables(path).tables) == ["second"]


def test_declarations_outside_a_load_register_nowhere(tmp_path):
    s = source("free", schema="a STRING")
    t = sql_table(name="free_t", key="a", source="free", sql="SELECT a FROM free")
    assert (s.name, t.name) == ("free", "free_t")
    path = write(tmp_path, '''
        from pipeline.tables import source, sql_table
        source("s", schema="a STRING")
        sql_table(name="only", key="a", source="s", sql="SELECT a, 1 AS n FROM s")
    ''')
    assert list(load_tables(path).tables) == ["only"]


def test_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source
        source("s", schema="a STRING"
    ''')
    with pytest.raises(TablesFileError, match=rf"tables file {path}, line \d+: syntax error"):
        load_tables(path)


def test_runtime_error_names_file_line_and_cause(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source

        source("s", schema="a STRING")
        undefined_helper()
    ''')
    with pytest.raises(TablesFileError, match=rf"tables file {path}, line 5: NameError: name 'undefined_helper'") as e:
        load_tables(path)
    assert e.value.code == "TABLES_FILE_ERROR" and e.value.details["line"] == 5


def test_unknown_source_lists_declared_ones(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source, sql_table
        source("readings", schema="a STRING")
        sql_table(name="t", key="a", source="reading", sql="SELECT a FROM reading")
    ''')
    with pytest.raises(TablesFileError, match=r"table 't' reads source 'reading', which is not declared "
                                              r"\(declared sources: readings\)"):
        load_tables(path)


def test_duplicate_table_is_refused(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source, sql_table
        source("s", schema="a STRING")
        sql_table(name="t", key="a", source="s", sql="SELECT a FROM s")
        sql_table(name="t", key="a", source="s", sql="SELECT a FROM s")
    ''')
    with pytest.raises(TablesFileError, match="line 5: ValueError: table 't' is declared twice"):
        load_tables(path)


def test_file_without_tables_is_refused(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source
        source("s", schema="a STRING")
    ''')
    with pytest.raises(TablesFileError, match="declares no table"):
        load_tables(path)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(TablesFileError, match="does not exist"):
        load_tables(tmp_path / "nope.py")


def test_bad_names_and_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="plain identifier"):
        source("my-source", schema="a STRING")
    with pytest.raises(ValueError, match="needs a schema"):
        source("s", schema=" ")
    with pytest.raises(ValueError, match="needs a SQL query"):
        sql_table(name="t", key="a", source="s", sql="")
    with pytest.raises(ValueError, match="must decorate a function"):
        table(name="t", key="a", source="s")("not a function")  # type: ignore[arg-type]


def test_a_table_keeps_a_history_for_its_retention_and_a_bad_one_names_its_line(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source, table, sql_table

        source("s", schema="a STRING")

        @table(name="kept", key="a", source="s", history_retention="7d")
        def kept(df):
            return df.groupBy("a").count()

        sql_table(name="plain", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a")
    ''')
    d = load_tables(path)
    assert d.tables["kept"].history_retention_ms == 7 * 86_400_000 and d.tables["kept"].versioned
    assert d.tables["plain"].history_retention_ms == 0 and not d.tables["plain"].versioned
    for bad, why in [('"-1d"', "must be a duration"), ("-5", "must be a positive duration"),
                     ('"a week"', "must be a duration"), ('"7d", window=tumbling("10s")', "windowed table cannot keep")]:
        path = write(tmp_path, f'''
            from pipeline.tables import source, sql_table, tumbling

            source("s", schema="a STRING")
            sql_table(name="t", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a",
                      history_retention={bad})
        ''')
        with pytest.raises(TablesFileError, match=rf"tables file {path}, line 5: ValueError: table 't': .*{why}"):
            load_tables(path)


def test_source_fields_may_not_shadow_record_columns():
    s = source("s", schema="timestamp STRING, a STRING")
    with pytest.raises(TablesFileError, match=r"field\(s\) \['timestamp'\] clash with the Kafka record columns"):
        check_source_fields(s, ["timestamp", "a"])
    check_source_fields(s, ["ts", "a"])


def test_table_output_needs_its_key_and_a_value_column():
    t = Table("t", "sensor", "s", sql="x")
    with pytest.raises(TablesFileError, match="key column 'sensor' is not among its columns"):
        check_output_columns(t, ["area", "count"])
    with pytest.raises(TablesFileError, match="no value column"):
        check_output_columns(t, ["sensor"])
    check_output_columns(t, ["sensor", "count"])


def test_a_table_names_its_standby_count_in_either_form(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source, table, sql_table

        source("s", schema="a STRING")

        @table(name="two", key="a", source="s", standby_replicas=2)
        def two(df):
            return df.groupBy("a").count()

        sql_table(name="none", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a",
                  standby_replicas=0)
        sql_table(name="default", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a")
    ''')
    d = load_tables(path)
    assert {n: t.standby_replicas for n, t in d.tables.items()} == {"two": 2, "none": 0, "default": None}


@pytest.mark.parametrize("value", ["-1", "17", "'2'", "1.5", "True"])
def test_a_standby_count_outside_its_range_names_the_table_and_line(tmp_path, value):
    path = write(tmp_path, f'''
        from pipeline.tables import source, sql_table
        source("s", schema="a STRING")
        sql_table(name="t", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a",
                  standby_replicas={value})
    ''')
    with pytest.raises(TablesFileError, match=r"line 4: .*table 't': standby_replicas must be a whole number in 0\.\.16"):
        load_tables(path)


def test_delete_when_is_a_sql_expression_in_either_form_and_must_be_a_boolean(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source, table, sql_table
        source("s", schema="a STRING, v DOUBLE")

        @table(name="fn", key="a", source="s", delete_when="last < 0")
        def fn(df):
            return df.groupBy("a").agg({"v": "last"}).withColumnRenamed("last(v)", "last")

        sql_table(name="sql", key="a", source="s", sql="SELECT a, last(v) AS last FROM s GROUP BY a",
                  delete_when="last IS NULL")
    ''')
    d = load_tables(path)
    assert {n: t.delete_when for n, t in d.tables.items()} == {"fn": "last < 0", "sql": "last IS NULL"}
    from pipeline.tables import DELETE_COLUMN

    t = d.tables["fn"]
    check_output_columns(t, ["a", "last", DELETE_COLUMN], "boolean")  # the delete column is not a value column
    with pytest.raises(TablesFileError, match="no value column"):
        check_output_columns(t, ["a", DELETE_COLUMN], "boolean")
    with pytest.raises(TablesFileError, match="delete_when 'last < 0' is a double, not a boolean"):
        check_output_columns(t, ["a", "last", DELETE_COLUMN], "double")


@pytest.mark.parametrize("value", ["''", "42", "True"])
def test_a_delete_when_that_is_not_an_expression_names_the_table_and_line(tmp_path, value):
    path = write(tmp_path, f'''
        from pipeline.tables import source, sql_table
        source("s", schema="a STRING")
        sql_table(name="t", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a",
                  delete_when={value})
    ''')
    with pytest.raises(TablesFileError, match=r"line 4: .*table 't': delete_when must be a Spark SQL boolean"):
        load_tables(path)


def test_windowed_tables_in_either_form(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import hopping, source, sql_table, table, tumbling
        source("s", schema="a STRING, v DOUBLE, at TIMESTAMP")

        @table(name="fn", key="a", source="s", window=hopping("1 minute", "10s", grace="5s", time="at"))
        def fn(df):
            return df.groupBy("a", "window").count()

        sql_table(name="sql", key="a", source="s", window=tumbling(10_000),
                  sql="SELECT a, window, count(*) AS n FROM s GROUP BY a, window")
    ''')
    d = load_tables(path)
    assert d.tables["fn"].window == hopping(60_000, 10_000, grace=5_000, time="at")
    assert d.tables["sql"].window == tumbling("10s", retention="1 day")
    from pipeline.tables import WINDOW_START_COLUMN

    check_output_columns(d.tables["fn"], ["a", "count", WINDOW_START_COLUMN])  # the window start is not a value


@pytest.mark.parametrize("window,message", [('hopping("10s", "20s")', "slide .* must not exceed its size"),
                                            ("tumbling(0)", "size must be positive"),
                                            ('tumbling("ten seconds")', "window size must be a duration"),
                                            ('"10s"', "window must be tumbling")])
def test_a_window_that_cannot_work_stops_the_load_naming_the_line(tmp_path, window, message):
    path = write(tmp_path, f'''
        from pipeline.tables import hopping, source, sql_table, tumbling
        source("s", schema="a STRING")
        sql_table(name="t", key="a", source="s", sql="SELECT a, window, count(*) AS n FROM s GROUP BY a, window",
                  window={window})
    ''')
    # The line of the window's definition; a value that is no window at all is refused by the table, on line 4.
    with pytest.raises(TablesFileError, match=rf"line [45]: .*{message}"):
        load_tables(path)


def test_tables_naming_one_query_share_it_in_name_order(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source, sql_table, tumbling
        source("s", schema="a STRING, b STRING")
        sql_table(name="z_counts", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a", query="s_all")
        sql_table(name="b_counts", key="b", source="s", sql="SELECT b, count(*) AS n FROM s GROUP BY b", query="s_all")
        sql_table(name="w", key="a", source="s", sql="SELECT a, window, count(*) AS n FROM s GROUP BY a, window",
                  window=tumbling("10s"), query="s_all")
        sql_table(name="alone", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a")
    ''')
    grouped = queries(load_tables(path))
    assert {name: [t.name for t in tables] for name, tables in grouped.items()} == {
        "s_all": ["b_counts", "w", "z_counts"], "alone": ["alone"]}


@pytest.mark.parametrize("second, message", [
    ('source="other"', r"tables 'a' and 'b' share query 'q', so they must read the same source with the same "
                       r"trigger_ms \(they read 's' every the pipeline's trigger and 'other' every the pipeline's"),
    ('source="s", trigger_ms=2000', r"they read 's' every the pipeline's trigger and 's' every 2000 ms"),
])
def test_a_shared_query_its_tables_cannot_run_together_is_refused(tmp_path, second, message):
    first_window = ', window=tumbling("10s")' if "window" in second else ""
    path = write(tmp_path, f'''
        from pipeline.tables import source, sql_table, tumbling
        source("s", schema="a STRING")
        source("other", schema="a STRING")
        sql_table(name="a", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a", query="q"{first_window})
        sql_table(name="b", key="a", sql="SELECT a, count(*) AS n FROM s GROUP BY a", query="q", {second})
    ''')
    with pytest.raises(TablesFileError, match=message):
        load_tables(path)


def test_a_query_name_must_be_a_plain_identifier(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source, sql_table
        source("s", schema="a STRING")
        sql_table(name="a", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a", query="not a name")
    ''')
    with pytest.raises(TablesFileError, match=r"line 4: ValueError: query name 'not a name' must be a plain identifier"):
        load_tables(path)


def test_a_query_runs_in_one_mode_and_has_one_watermark(tmp_path):
    from pipeline.settings import PipelineSettings
    from pipeline.tables_file import check_modes

    path = write(tmp_path, '''
        from pipeline.tables import source, sql_table, tumbling
        source("s", schema="a STRING, b STRING")
        sql_table(name="x", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a", query="q")
        sql_table(name="y", key="b", source="s", sql="SELECT b, count(*) AS n FROM s GROUP BY b", query="q")
        sql_table(name="z", key="b", source="s", sql="SELECT b, count(*) AS n FROM s GROUP BY b",
                  pipeline_mode="microbatch")
        for name, grace in (("w1", "5s"), ("w2", "5s"), ("w3", "9s")):
            sql_table(name=name, key="a", source="s", sql="SELECT a, window, count(*) AS n FROM s GROUP BY a, window",
                      window=tumbling("10s", grace=grace), query="windows")
    ''')
    definition = load_tables(path)
    assert definition.tables["z"].pipeline_mode == "microbatch" and definition.tables["x"].pipeline_mode is None
    with pytest.raises(TablesFileError, match=r"windowed tables 'w1' and 'w3' share Real-time query 'windows', which "
                                              r"has one watermark: .* Give 'w3' a query of its own"):
        check_modes(definition, PipelineSettings(pipeline_mode="realtime").mode_of)
    with pytest.raises(TablesFileError, match=r"windowed tables \['w1', 'w2', 'w3'\] share query 'windows'; a "
                                              r"query has one watermark"):
        check_modes(definition, PipelineSettings(pipeline_mode="microbatch").mode_of)
    # A run to the input's end is micro-batches whatever the table says.
    settings = PipelineSettings(pipeline_mode="realtime", available_now=True)
    assert {settings.mode_of(t) for t in definition.tables.values()} == {"microbatch"}


def test_a_pipeline_mode_is_realtime_or_microbatch(tmp_path):
    path = write(tmp_path, '''
        from pipeline.tables import source, sql_table
        source("s", schema="a STRING")
        sql_table(name="x", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a", pipeline_mode="fast")
    ''')
    with pytest.raises(TablesFileError, match=r"line 4: .*pipeline_mode must be one of 'realtime', 'microbatch', "
                                              r"not 'fast'"):
        load_tables(path)


def test_a_sources_realtime_tables_share_one_query_each_window_that_can(tmp_path):
    from pipeline.settings import PipelineSettings

    path = write(tmp_path, '''
        from pipeline.tables import hopping, source, sql_table, tumbling
        source("s", schema="a STRING, b STRING")
        source("lone", schema="a STRING")
        agg = "SELECT a, window, count(*) AS n FROM s GROUP BY a, window"
        sql_table(name="keyed", key="a", source="s", sql="SELECT a, count(*) AS n FROM s GROUP BY a")
        sql_table(name="w5", key="a", source="s", sql=agg, window=tumbling("10s", grace="5s"))
        sql_table(name="w5_minute", key="a", source="s", sql=agg, window=tumbling("1m", grace="5s"))
        sql_table(name="w9", key="a", source="s", sql=agg, window=tumbling("10s", grace="9s"))
        sql_table(name="hop", key="a", source="s", sql=agg, window=hopping("10s", "5s", grace="5s"))
        sql_table(name="batched", key="b", source="s", sql="SELECT b, count(*) AS n FROM s GROUP BY b",
                  pipeline_mode="microbatch")
        sql_table(name="named", key="b", source="s", sql="SELECT b, count(*) AS n FROM s GROUP BY b", query="own")
        sql_table(name="only", key="a", source="lone", sql="SELECT a, count(*) AS n FROM lone GROUP BY a")
    ''')
    definition = load_tables(path)
    grouped = queries(definition, PipelineSettings(pipeline_mode="realtime").mode_of)
    assert {name: [t.name for t in tables] for name, tables in grouped.items()} == {
        "s.tables": ["keyed", "w5", "w5_minute"], "hop": ["hop"], "w9": ["w9"], "batched": ["batched"],
        "own": ["named"], "only": ["only"]}
    # In micro-batches every table names its query or has its own.
    assert len(queries(definition, PipelineSettings(pipeline_mode="microbatch").mode_of)) == 8

"""A query's checkpoint as the pipeline guards it: the tables it holds, and the changelogs it wrote to."""

from __future__ import annotations

import pytest

from pipeline.checkpoints import (QUERY_TABLES_FILE, ChangelogLost, QueryChanged, check_changelog_kept,
                                  check_query_tables, committed_batches, drop_unfinished_writes,
                                  frozen_shuffle_partitions, query_checkpoint_of, retire_superseded)


def test_a_vanished_changelog_with_committed_batches_is_refused(tmp_path):
    checkpoint = tmp_path / "sensor_stats"
    check_changelog_kept("t-changelog", existed=False, checkpoint=checkpoint)  # first start: nothing to lose
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / ".0.crc").write_text("")
    check_changelog_kept("t-changelog", existed=False, checkpoint=checkpoint)
    for i in range(3):
        (checkpoint / "commits" / str(i)).write_text("v1")
    assert committed_batches(checkpoint) == 3
    check_changelog_kept("t-changelog", existed=True, checkpoint=checkpoint)
    with pytest.raises(ChangelogLost, match=rf"changelog topic t-changelog does not exist, but the checkpoint "
                                            rf"{checkpoint} records 3 batch\(es\).*Delete {checkpoint}"):
        check_changelog_kept("t-changelog", existed=False, checkpoint=checkpoint)


def test_a_querys_checkpoint_is_resumed_only_with_the_tables_it_was_written_for(tmp_path):
    checkpoint = tmp_path / "readings"
    check_query_tables(checkpoint, "readings", ["area_counts", "sensor_stats"])  # first start: recorded
    assert (checkpoint / QUERY_TABLES_FILE).read_text() == '{"tables":["area_counts","sensor_stats"]}'
    (checkpoint / "commits").mkdir()
    (checkpoint / "commits" / "0").write_text("v1")
    check_query_tables(checkpoint, "readings", ["area_counts", "sensor_stats"])
    with pytest.raises(QueryChanged, match=r"query 'readings': its checkpoint .*readings was written for tables "
                                           r"\['area_counts', 'sensor_stats'\], and the tables file now puts "
                                           r"\['area_counts', 'sensor_stats', 'sensor_windows'\] in it\. Delete"):
        check_query_tables(checkpoint, "readings", ["area_counts", "sensor_stats", "sensor_windows"])
    (checkpoint / QUERY_TABLES_FILE).write_text("{not json")
    with pytest.raises(QueryChanged, match=r"with an unreadable freshroute-tables\.json"):
        check_query_tables(checkpoint, "readings", ["area_counts", "sensor_stats"])


def test_a_tables_checkpoint_is_found_through_its_querys_record(tmp_path):
    check_query_tables(tmp_path / "readings", "readings", ["area_counts", "sensor_stats"])
    assert query_checkpoint_of(tmp_path, "sensor_stats") == tmp_path / "readings"
    assert query_checkpoint_of(tmp_path, "other") == tmp_path / "other"


def test_a_checkpoint_from_before_shared_queries_is_its_one_tables_own(tmp_path):
    checkpoint = tmp_path / "sensor_stats"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text("v1")
    check_query_tables(checkpoint, "sensor_stats", ["sensor_stats"])
    assert (checkpoint / QUERY_TABLES_FILE).is_file()
    legacy = tmp_path / "area_counts"
    (legacy / "commits").mkdir(parents=True)
    (legacy / "commits" / "0").write_text("v1")
    with pytest.raises(QueryChanged, match=r"written for tables \['area_counts'\]"):
        check_query_tables(legacy, "area_counts", ["area_counts", "sensor_stats"])


def test_a_checkpoints_shuffle_partitions_are_read_from_its_latest_offset_log(tmp_path):
    assert frozen_shuffle_partitions(tmp_path / "none") is None  # never started
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    assert frozen_shuffle_partitions(tmp_path) is None
    meta = b'{"batchWatermarkMs":0,"conf":{"spark.sql.shuffle.partitions":"%d"}}'
    (offsets / "0").write_bytes(b"v1\n" + meta % 2 + b'\n{"readings":{"0":5}}')
    (offsets / "1").write_bytes(b"v1\n" + meta % 2 + b'\n{"readings":{"0":9}}')
    (offsets / ".1.crc").write_bytes(b"x")
    (offsets / "2").write_bytes(b"v1\n")  # being written
    assert frozen_shuffle_partitions(tmp_path) == 2


def committed(checkpoint, tables=None):
    """A checkpoint with one committed batch, recording ``tables`` (None: no record, as before shared queries)."""
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text("v1")
    if tables is not None:
        (checkpoint / QUERY_TABLES_FILE).write_text('{"tables": %s}' % str(tables).replace("'", '"'))
    return checkpoint


def test_checkpoints_of_tables_a_new_query_now_computes_are_moved_aside_once(tmp_path):
    committed(tmp_path / "sensor_stats", ["sensor_stats"])
    committed(tmp_path / "area_counts")  # its one table's own
    committed(tmp_path / "other", ["other"])
    committed(tmp_path / "readings.rejected", [])
    (tmp_path / "sensor_windows").mkdir()  # started, never committed: nothing to say
    fused = tmp_path / "readings.tables"
    moved = retire_superseded(fused, ["area_counts", "sensor_stats", "sensor_windows"], {"readings.tables", "other"})
    assert moved == [tmp_path / ".superseded" / "area_counts", tmp_path / ".superseded" / "sensor_stats"]
    assert committed_batches(moved[1]) == 1 and not (tmp_path / "sensor_stats").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".superseded", "other", "readings.rejected", "sensor_windows"]
    # No table is found in a checkpoint moved aside.
    assert query_checkpoint_of(tmp_path, "sensor_stats") == tmp_path / "sensor_stats"
    # Once the query has its own batches, or for a query of this run, nothing moves.
    committed(tmp_path / "sensor_stats", ["sensor_stats"])
    assert retire_superseded(tmp_path / "area_counts", ["sensor_stats"], {"area_counts", "sensor_stats"}) == []
    committed(fused, ["area_counts", "sensor_stats", "sensor_windows"])
    assert retire_superseded(fused, ["sensor_stats"], {"readings.tables"}) == []
    # A second move aside of one name keeps the first.
    root = tmp_path / "again"
    for n in ("", ".2"):
        committed(root / "x", ["t"])
        assert retire_superseded(root / "y", ["t"], {"y"}) == [root / ".superseded" / f"x{n}"]


def test_a_query_resumes_from_its_first_batchs_offsets_or_state_before_any_commit(tmp_path):
    from pipeline.checkpoints import resumable

    cp = tmp_path / "q"
    assert not resumable(cp)  # never started
    (cp / "offsets").mkdir(parents=True)
    (cp / "offsets" / ".0.crc").write_text("")
    assert not resumable(cp)  # a file being written is not a batch
    (cp / "offsets" / "0").write_text("v1")
    assert resumable(cp)  # a Real-time query commits at its checkpoint interval, but resumes from here
    other = tmp_path / "r"
    (other / "state" / "0").mkdir(parents=True)
    assert resumable(other)  # stopped in its first batch: its state's schema is left, which it resumes with


def test_the_half_written_log_files_a_killed_pipeline_left_are_removed_before_its_query_starts(tmp_path, caplog):
    # As a pipeline killed -9 while a Real-time query wrote its first checkpoint leaves it: Spark would refuse to
    # start the query afresh on logs holding any file (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY).
    checkpoint = tmp_path / "readings.rejected"
    for name in ("offsets", "commits", "sources/0"):
        (checkpoint / name).mkdir(parents=True)
    uuid = "5b7ab129-2013-4995-bbd4-302683ac8449"
    left = [checkpoint / "commits" / f".0.{uuid}.tmp", checkpoint / "commits" / f"..0.{uuid}.tmp.crc",
            checkpoint / "offsets" / f".0.{uuid}.tmp"]
    sources = checkpoint / "sources" / "0"
    kept = [checkpoint / "metadata", sources / "0", sources / f".1.{uuid}.tmp"]  # not the logs Spark checks
    for p in left + kept:
        p.write_text("")
    drop_unfinished_writes(checkpoint, "readings.rejected")
    assert list((checkpoint / "offsets").iterdir()) == [] and list((checkpoint / "commits").iterdir()) == []
    assert all(p.exists() for p in kept)
    assert "query readings.rejected: removed 3 half-written file(s)" in caplog.text

    # A checkpoint with batches: its batches' files are its own, whatever a kill left beside them.
    for i in range(2):
        (checkpoint / "offsets" / str(i)).write_text("v1")
        (checkpoint / "offsets" / f".{i}.crc").write_text("")
        (checkpoint / "commits" / str(i)).write_text("v1")
    (checkpoint / "offsets" / f".2.{uuid}.tmp").write_text("")
    drop_unfinished_writes(checkpoint, "readings.rejected")
    assert sorted(p.name for p in (checkpoint / "offsets").iterdir()) == [".0.crc", ".1.crc", "0", "1"]
    assert committed_batches(checkpoint) == 2
    drop_unfinished_writes(tmp_path / "never-started", "q")  # no checkpoint yet: nothing to do

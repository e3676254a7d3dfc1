"""The tables files versions were defined in, kept by their content beside the checkpoints."""

from __future__ import annotations

import pytest

from pipeline.definitions import DEFINITIONS, keep, load
from pipeline.fingerprint import fingerprint
from pipeline.settings import DEMO_TABLES_FILE
from pipeline.tables import TablesFileError
from pipeline.tables_file import load_tables


def test_a_tables_file_is_kept_once_by_its_content_and_loads_as_it_was(tmp_path):
    edited = tmp_path / "tables.py"
    edited.write_bytes(DEMO_TABLES_FILE.read_bytes())
    digest = keep(tmp_path / "checkpoints", edited)
    assert keep(tmp_path / "checkpoints", DEMO_TABLES_FILE) == digest  # the same content: the same copy
    assert [p.name for p in (tmp_path / "checkpoints" / DEFINITIONS).iterdir()] == [f"{digest}.py"]
    edited.write_bytes(edited.read_bytes().replace(b"GROUP BY area", b"WHERE reading > 0 GROUP BY area"))
    assert keep(tmp_path / "checkpoints", edited) != digest
    # The copy goes on computing what it did after the file moved on.
    kept, now = load(tmp_path / "checkpoints", digest), load_tables(edited)
    first = load_tables(DEMO_TABLES_FILE)
    for name, t in kept.tables.items():
        assert fingerprint(t, kept.sources[t.source], "realtime") == \
            fingerprint(first.tables[name], first.sources[t.source], "realtime")
    counts = now.tables["area_counts"]
    assert fingerprint(counts, now.sources[counts.source], "realtime") != \
        fingerprint(kept.tables["area_counts"], kept.sources[counts.source], "realtime")


def test_a_definition_not_kept_is_named(tmp_path):
    with pytest.raises(TablesFileError, match="the tables file of digest 0123456789abcdef is not kept"):
        load(tmp_path, "0123456789abcdef")

"""The bulk restore reader's table files are what a replica's store writes and can read: the same table options, and
a RocksDB library no newer than the one rocksdict bundles (a file is read by its own version or a later one)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import freshroute_bulkload
from rocksdict import Rdict

from store_node.replica_store import BLOOM_BITS_PER_KEY, COMPRESSION

TABLE_FILE = Path(__file__).resolve().parents[2] / "native" / "bulkload" / "src" / "table_file.rs"
# RocksDB's C API compression types (rocksdb/c.h).
C_COMPRESSION = {"none": 0, "snappy": 1, "zlib": 2, "bz2": 3, "lz4": 4, "lz4hc": 5, "xpress": 6, "zstd": 7}


def rust_const(name: str) -> str:
    found = re.search(rf"^const {name}: \w+ = ([\w.]+);$", TABLE_FILE.read_text(), re.MULTILINE)
    assert found, f"no const {name} in {TABLE_FILE}"
    return found.group(1)


def test_the_table_files_have_the_replica_stores_table_options():
    assert float(rust_const("BLOOM_BITS_PER_KEY")) == BLOOM_BITS_PER_KEY
    assert int(rust_const("LZ4_COMPRESSION")) == C_COMPRESSION[COMPRESSION]


def test_the_rocksdb_the_reader_links_is_no_newer_than_the_one_that_reads_its_files(tmp_path):
    extension = next(Path(freshroute_bulkload.__file__).parent.glob("*.so"))
    linked = re.search(r"librocksdb\.so\.(\d+)\.(\d+)", subprocess.run(["ldd", str(extension)], capture_output=True,
                                                                      text=True, check=True).stdout)
    assert linked, "the extension links no librocksdb"
    db = Rdict(str(tmp_path / "db"))
    db.close()
    bundled = re.search(r"RocksDB version: (\d+)\.(\d+)", (tmp_path / "db" / "LOG").read_text())
    assert bundled, "rocksdict's LOG names no version"
    assert tuple(map(int, linked.groups())) <= tuple(map(int, bundled.groups())), (linked.group(0), bundled.group(0))

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from freshroute.errors import StoreCorrupt
from freshroute.keys import prefix_end, scan_range
from store_node.replica_store import ReplicaStore

REPO = Path(__file__).resolve().parents[2]


def test_new_store_starts_at_offset_zero(tmp_path):
    store = ReplicaStore.open(tmp_path / "t" / "0")
    assert store.applied_offset == 0
    assert store.caught_up_at_ms == 0
    assert store.get(b"k") is None
    store.close()


def test_apply_writes_rows_and_offset_and_reopen_resumes(tmp_path):
    path = tmp_path / "t" / "0"
    store = ReplicaStore.open(path)
    store.apply([(b"a", b'{"v":1}'), (b"b", b'{"v":2}')], next_offset=2, caught_up_at_ms=1234)
    store.apply([(b"a", b'{"v":3}')], next_offset=3)
    assert store.get(b"a") == b'{"v":3}'
    store.close()

    again = ReplicaStore.open(path)
    assert again.applied_offset == 3
    assert again.caught_up_at_ms == 1234
    assert again.get(b"a") == b'{"v":3}'
    assert again.get(b"b") == b'{"v":2}'
    again.close()


def test_rewritten_keys_are_updated_in_place_and_read_back_at_their_latest(tmp_path):
    # A changelog rewrites a few keys again and again: each must be one memtable entry, not one per version,
    # or every read's seek walks all of them. Values of every size, shrinking and growing, read back right.
    path = tmp_path / "t" / "0"
    store = ReplicaStore.open(path)
    for i in range(1, 61):
        store.apply([(b"a", b'{"v":%d}' % (i % 10)), (b"b", b'{"v":"%s"}' % (b"x" * (7 - i % 7)))], next_offset=i)
    assert store.get_many([b"a", b"b", b"a"]) == [b'{"v":0}', b'{"v":"xxx"}', b'{"v":0}']
    entries = store._db.property_int_value("rocksdb.num-entries-active-mem-table")  # noqa: SLF001
    assert entries <= 2 + 60 // 7  # of 120 puts, only b's growing ones (one in seven) add an entry
    store.close()
    again = ReplicaStore.open(path)
    assert again.applied_offset == 60
    assert again.get_many([b"a", b"b"]) == [b'{"v":0}', b'{"v":"xxx"}']
    again.close()


def test_tombstone_deletes(tmp_path):
    store = ReplicaStore.open(tmp_path / "t" / "0")
    store.apply([(b"a", b"1"), (b"b", b"2")], 2)
    store.apply([(b"a", None)], 3)
    assert store.get(b"a") is None
    assert store.get(b"b") == b"2"
    assert store.scan(b"", None, 10) == [(b"b", b"2")]
    assert store.applied_offset == 3
    store.close()


def test_checkpoint_is_not_a_row(tmp_path):
    store = ReplicaStore.open(tmp_path / "t" / "0")
    store.apply([(b"applied", b"1")], 7)  # a row whose key collides with a checkpoint name
    assert store.get(b"applied") == b"1"
    assert store.applied_offset == 7
    assert store.scan(b"", None, 10) == [(b"applied", b"1")]
    store.close()


def test_scan_honours_prefix_start_end_and_limit(tmp_path):
    store = ReplicaStore.open(tmp_path / "t" / "0")
    rows = [(f"user-{i:02d}".encode(), b"{}") for i in range(20)] + [(b"zz", b"{}"), (b"user", b"{}")]
    store.apply(rows, len(rows))
    lower, upper = scan_range(b"user-", b"", b"")
    keys = [k for k, _ in store.scan(lower, upper, 100)]
    assert keys == [f"user-{i:02d}".encode() for i in range(20)]
    lower, upper = scan_range(b"user-", b"user-05", b"user-08")
    assert [k for k, _ in store.scan(lower, upper, 100)] == [b"user-05", b"user-06", b"user-07"]
    assert len(store.scan(*scan_range(b"", b"", b""), 3)) == 3
    store.close()


def test_prefix_end():
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") is None


def test_close_releases_the_database_so_it_reopens(tmp_path):
    path = tmp_path / "t" / "0"
    store = ReplicaStore.open(path)
    store.apply([(b"a", b"1")], 1)
    store.scan(b"", None, 10)
    store.close()
    with pytest.raises(StoreCorrupt):
        store.get(b"a")
    ReplicaStore.open(path).close()


def test_corrupt_store_is_detected_and_wiped(tmp_path):
    path = tmp_path / "t" / "0"
    store = ReplicaStore.open(path)
    store.apply([(b"a", b"1")], 5)
    store.close()
    (path / "CURRENT").write_text("garbage\n")

    with pytest.raises(StoreCorrupt):
        ReplicaStore.open(path)
    fresh, reason = ReplicaStore.open_or_wipe(path)
    assert reason is not None and "CURRENT" in reason
    assert fresh.applied_offset == 0
    assert fresh.get(b"a") is None
    fresh.close()


def test_corrupt_table_file_is_detected(tmp_path):
    path = tmp_path / "t" / "0"
    store = ReplicaStore.open(path)
    store.apply([(f"k{i}".encode(), b"x" * 100) for i in range(500)], 500)
    store.close()
    # Reopen once so the rows are flushed into a table file, then damage it.
    ReplicaStore.open(path).close()
    for sst in path.glob("*.sst"):
        data = bytearray(sst.read_bytes())
        for i in range(64, len(data) - 64, 7):
            data[i] ^= 0xFF
        sst.write_bytes(bytes(data))
    if not list(path.glob("*.sst")):
        pytest.skip("rows stayed in the write-ahead log")
    with pytest.raises(StoreCorrupt):
        store = ReplicaStore.open(path)
        store.get(b"k1")
        store.scan(b"", None, 1000)


def test_rows_without_checkpoint_are_not_trusted(tmp_path):
    from rocksdict import Options, Rdict

    path = tmp_path / "t" / "0"
    path.mkdir(parents=True)
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(str(path), opts)
    db.put(b"a", b"1")
    db.close()
    del db
    with pytest.raises(StoreCorrupt):
        ReplicaStore.open(path)


_WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from store_node.replica_store import ReplicaStore
    path, bulk = Path(sys.argv[1]), sys.argv[2] == "bulk"
    store = ReplicaStore.open(path, bulk_load=bulk)
    i = store.applied_offset
    print("ready", flush=True)
    while True:
        # Every batch rewrites all 50 rows with the batch's own offset: a torn batch would
        # leave rows from two batches, or rows ahead of (or behind) the checkpoint.
        store.apply([(f"k{j}".encode(), str(i).encode()) for j in range(50)], i + 1)
        i += 1
        if bulk and i % 500 == 0:
            # Written without a log, a bulk load keeps what its flushes wrote: flush now and then.
            store.close()
            store = ReplicaStore.open(path, bulk_load=True)
""")


@pytest.mark.parametrize("mode", ["logged", "bulk"])
def test_batch_is_atomic_across_a_kill(tmp_path, mode):
    """Kill a writer mid-stream: the rows always match the checkpoint written with them."""
    path = tmp_path / "t" / "0"
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), mode], cwd=REPO, stdout=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            assert proc.stdout.readline().strip() == b"ready"
            time.sleep(0.3)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        store = ReplicaStore.open(path)
        applied = store.applied_offset
        values = {store.get(f"k{j}".encode()) for j in range(50)}
        store.close()
        assert applied > 0 and len(values) == 1  # every row from one batch
        if mode == "logged":
            assert values == {str(applied - 1).encode()}
        else:
            # Flushed before their checkpoint, rows may be ahead of it (a replay from it rewrites them), never behind.
            assert int(values.pop()) >= applied - 1


def test_an_open_store_is_busy_not_corrupt(tmp_path):
    from store_node.replica_store import StoreBusy

    path = tmp_path / "t" / "0"
    store = ReplicaStore.open(path)
    store.apply([(b"a", b"1")], 1)
    with pytest.raises(StoreBusy):
        ReplicaStore.open_or_wipe(path)  # must not wipe a store that is merely open
    assert store.get(b"a") == b"1"
    store.close()


def test_a_bulk_load_is_written_in_the_background_and_reopened_for_reads(tmp_path):
    path = tmp_path / "t" / "0"
    store = ReplicaStore.open(path, bulk_load=True)
    rows = [(b"k%06d" % i, b'{"v":%d,"pad":"%s"}' % (i, b"x" * 100)) for i in range(20_000)]  # 2.5 MB: not at once
    store.apply(rows[:10_000], 10_000)
    store.apply(rows[10_000:], 20_000)
    deadline = time.monotonic() + 30
    while not store.flush_loaded():
        assert time.monotonic() < deadline, "the bulk load was not written within 30 s"
        time.sleep(0.01)
    served = store.reopened()
    assert store.closed and not served.bulk_load and served.applied_offset == 20_000
    assert served.get_many([b"k000000", b"k019999", b"k020000"]) == [rows[0][1], rows[-1][1], None]
    assert served.reopened() is served  # a store for reads stays open
    served.close()


def test_a_large_apply_is_written_in_chunks_with_the_checkpoint_last(tmp_path, monkeypatch):
    # rocksdict holds the GIL through a write: chunks bound how long the node's reads wait for one.
    from store_node import replica_store

    store = ReplicaStore.open(tmp_path / "t" / "0")
    written: list[tuple[int, bool]] = []  # (rows, whether a checkpoint is stored after the write)
    write = store._write

    def counting(rows, *checkpoint):
        write(rows, *checkpoint)
        written.append((len(rows), store._meta.get(b"applied") is not None))

    monkeypatch.setattr(store, "_write", counting)
    rows = [(b"k%05d" % i, b"%d" % i) for i in range(2 * replica_store.WRITE_CHUNK_ROWS + 500)]
    store.apply(rows, 4_500)
    chunk = replica_store.WRITE_CHUNK_ROWS
    # Every chunk full but the last, which carries the checkpoint.
    assert [n for n, _ in written] == [chunk, chunk, 500]
    assert [has_checkpoint for _, has_checkpoint in written] == [False, False, True]
    assert store.applied_offset == 4_500 and store.get(b"k04499") == b"4499"
    store.close()


@pytest.mark.parametrize("status, full", [
    ("IO error: No space left on device: While appending to file: /d/000012.log: No space left on device", True),
    ("IO error: NoSpace: ", True), ("Corruption: block checksum mismatch", False)])
def test_a_write_that_finds_no_space_is_a_full_disk_not_a_corrupt_store(tmp_path, status, full):
    from store_node.replica_store import DiskFull, _write_failure

    e = _write_failure(tmp_path, "write", Exception(status))
    assert isinstance(e, StoreCorrupt) and isinstance(e, DiskFull) is full
    assert ("no space left on the device" in e.message) is full

"""A versioned table's history in a replica store: every version at its time, late ones included; reads of a key as of
a time and of its versions; expiry of exactly the versions replaced for longer than the retention."""

import random

from freshroute.wire import Version
from store_node import history
from store_node.replica_store import ReplicaStore


def apply_versions(store, versions, next_offset, caught_up_at_ms=None):
    """What a replica of a versioned table commits: the latest rows that change and the history, with the checkpoint."""
    rows, writes = store.history.changes(versions)
    store.apply(rows, next_offset, caught_up_at_ms, history_rows=writes)


def expire(store, before_ms, limit):
    writes = store.history.expiring(before_ms, limit)
    store.apply([], store.applied_offset, history_rows=writes)
    return len(writes) // 2


def model_versions(records, key):
    """A key's versions recomputed from its records (key, time, value) in changelog order: one per time, the later
    record of a time winning; each valid until the next time."""
    at = {}
    for k, t, v in records:
        if k == key:
            at[t] = v
    times = sorted(at)
    return [Version(t, n, at[t]) for t, n in zip(times, times[1:] + [None])]


def as_of(versions, t):
    held = [v for v in versions if v.valid_from_ms <= t and (v.valid_to_ms is None or t < v.valid_to_ms)]
    return held[0] if held else None


def expiry_index(store):
    it = store.history._expiry.iter()
    it.seek_to_first()
    out = []
    while it.valid():
        out.append(history.split_expiry_key(it.key()))
        it.next()
    del it
    return out


def test_versions_in_order_and_late_ones_keep_the_latest_row(tmp_path):
    store = ReplicaStore.open(tmp_path / "t" / "0")
    apply_versions(store, [(b"k", 100, b'{"v":1}'), (b"k", 200, b'{"v":2}')], next_offset=2)
    apply_versions(store, [(b"k", 150, b'{"v":"late"}'), (b"other", 120, b'{"v":9}')], next_offset=4)
    assert store.applied_offset == 4
    # The latest row is the newest version's, never a late one's.
    assert store.get(b"k") == b'{"v":2}'
    assert store.history.versions(b"k", 0, 1 << 62, 10) == [Version(200, None, b'{"v":2}'), Version(150, 200, b'{"v":"late"}'),
                                                    Version(100, 150, b'{"v":1}')]
    assert store.history.versions(b"k", 160, 161, 1) == [Version(150, 200, b'{"v":"late"}')]
    assert store.history.versions(b"k", 99, 100, 1) == []  # before its first version: absent
    assert store.history.versions(b"k", 5000, 5001, 1) == [Version(200, None, b'{"v":2}')]  # after its last: the latest
    assert store.history.versions(b"nope", 0, 1 << 62, 10) == []
    # A page of versions valid in [120, 210), newest first, limited.
    assert [v.valid_from_ms for v in store.history.versions(b"k", 120, 210, 2)] == [200, 150]
    store.close()


def test_a_delete_is_a_version_and_the_latest_row_goes(tmp_path):
    store = ReplicaStore.open(tmp_path / "t" / "0")
    apply_versions(store, [(b"k", 100, b'{"v":1}'), (b"k", 200, None)], next_offset=2)
    assert store.get(b"k") is None
    assert store.history.versions(b"k", 0, 1 << 62, 10) == [Version(200, None, None), Version(100, 200, b'{"v":1}')]
    apply_versions(store, [(b"k", 300, b'{"v":3}')], next_offset=3)
    assert store.get(b"k") == b'{"v":3}'
    store.close()


def test_random_records_read_as_their_recomputation_and_survive_a_reopen(tmp_path):
    rng = random.Random(7)
    keys = [b"a", b"ab", b"b", b"a\x00"]  # prefixes of each other: their runs must not mix
    records = []
    path = tmp_path / "t" / "0"
    store = ReplicaStore.open(path)
    offset = 0
    for _ in range(40):
        batch = [(rng.choice(keys), rng.randrange(0, 1000), rng.choice([None, b'{"v":%d}' % rng.randrange(100)]))
                 for _ in range(rng.randrange(1, 12))]
        records += batch
        offset += len(batch)
        apply_versions(store, batch, next_offset=offset)
    store.close()
    store = ReplicaStore.open(path)
    assert store.applied_offset == offset
    for key in keys:
        want = model_versions(records, key)
        assert store.history.versions(key, 0, 1 << 62, 1000) == list(reversed(want)), key
        assert store.get(key) == (want[-1].value if want else None), key
        for t in range(0, 1001, 37):
            got = store.history.versions(key, t, t + 1, 1)
            expected = as_of(want, t)
            assert (got[0] if got else None) == expected, (key, t)
            assert store.history.at(key, t) == expected, (key, t)  # the read as of a time: one seek
    # Every key as of a time, between bounds and a page at a time: the keys present then, in byte order.
    for t in range(0, 1001, 53):
        present = [(k, as_of(model_versions(records, k), t)) for k in sorted(keys)]
        present = [(k, v) for k, v in present if v is not None and v.value is not None]
        assert store.history.rows_at(b"", None, t, 100) == present, t
        assert store.history.rows_at(b"a\x00", b"b", t, 100) == [(k, v) for k, v in present if b"a\x00" <= k < b"b"], t
        assert store.history.rows_at(b"", None, t, 2) == present[:2], t
        assert store.history.rows_at(b"ab", b"ab", t, 5) == [], t
    # The index holds, for each version, when its expiry clock started: replaced ones then, a latest delete at once.
    wanted_index = sorted((v.valid_to_ms if v.valid_to_ms is not None else v.valid_from_ms, history.version_key(k, v.valid_from_ms))
                          for k in keys for v in model_versions(records, k)
                          if v.valid_to_ms is not None or v.value is None)
    assert expiry_index(store) == wanted_index
    store.close()


def test_expiry_removes_exactly_the_versions_replaced_before_the_cutoff(tmp_path):
    store = ReplicaStore.open(tmp_path / "t" / "0")
    apply_versions(store, [(b"k", 100, b"1"), (b"k", 200, b"2"), (b"k", 300, b"3"), (b"gone", 150, b"x"),
                          (b"gone", 250, None), (b"kept", 50, b"only")], next_offset=6)
    # Before 260: k@100 (replaced at 200), gone@150 (at 250), gone@250 (a delete since 250); not k@200 (replaced at 300).
    assert expire(store, 260, 100) == 3
    assert store.history.versions(b"k", 0, 1 << 62, 10) == [Version(300, None, b"3"), Version(200, 300, b"2")]
    assert store.history.versions(b"gone", 0, 1 << 62, 10) == []
    assert store.history.versions(b"kept", 0, 1 << 62, 10) == [Version(50, None, b"only")]  # a latest value never expires
    assert store.get(b"k") == b"3" and store.get(b"kept") == b"only"
    assert expire(store, 260, 100) == 0
    # Bounded: one at a time.
    assert expire(store, 10_000, 1) == 1
    assert store.history.versions(b"k", 0, 1 << 62, 10) == [Version(300, None, b"3")]
    store.close()


def test_a_versioned_write_goes_with_its_checkpoint_and_unversioned_stores_have_empty_history(tmp_path):
    store = ReplicaStore.open(tmp_path / "t" / "0")
    store.apply([(b"k", b"1")], next_offset=1)
    assert store.history.versions(b"k", 0, 1 << 62, 10) == []
    apply_versions(store, [(b"k", 10, b"2")], next_offset=2, caught_up_at_ms=77)
    assert (store.applied_offset, store.caught_up_at_ms) == (2, 77)
    store.close()


def test_runs_of_versions_come_in_the_keys_own_order_and_never_mix():
    keys = sorted([b"", b"a", b"a\x00", b"a\x00\x00", b"a\x00\x01", b"a\x01", b"a\xff", b"ab", b"b", b"\x00"])
    keys_by_run = sorted(keys, key=lambda k: history.version_key(k, 5))
    assert keys_by_run == keys
    # The last version of a key sorts before the first of any other key after it.
    for a, b in zip(keys, keys[1:]):
        assert history.version_key(a, (1 << 63) - 1) < history.version_key(b, 0)
        assert not history.version_key(b, 0).startswith(history.key_prefix(a))
        assert history.key_of(history.key_prefix(a)) == a

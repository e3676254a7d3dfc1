"""A versioned table's history in a replica store: every version of a key, each valid from the time it became true
until the next one did.

Two column families beside the rows (which keep the latest version of each key, so that a plain lookup costs what it
always did):

- ``versions``: (key, valid from) → the value, or a delete (a version too: "absent from then"). The key is escaped
  and terminated (``\x00`` → ``\x00\xff``, then ``\x00\x01``), so that a key's versions are one contiguous run in
  time order and the runs come in the keys' own byte order.
- ``version_expiry``: (expires at, version key) → nothing. A version expires when it has been replaced for the
  table's history retention; a delete that is the latest version expires once it is that old itself (absent then or
  never held reads the same); a latest value never expires. Expiry reads this index from its start up to now minus
  the retention: it touches only what expires, never the whole history.

A record may come late (its time before the key's latest version, as a producer's own timestamps can be): it becomes
the version of its time, and the latest row changes only when it is the newest. Two records of one time: the later in
the changelog wins.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from rocksdict import Rdict

from freshroute.errors import StoreCorrupt
from freshroute.wire import Version

VERSIONS_CF = "versions"
EXPIRY_CF = "version_expiry"

_TIME = struct.Struct(">Q")
_END = b"\x00\x01"  # ends a key's escaped bytes: sorts before any escaped byte, so a key before its extensions
_VALUE, _DELETE = b"\x01", b"\x00"


def key_prefix(key: bytes) -> bytes:
    """The start of every version key of ``key``: its run."""
    return key.replace(b"\x00", b"\x00\xff") + _END


def version_key(key: bytes, at_ms: int) -> bytes:
    return _in_run(key_prefix(key), at_ms)


def _in_run(prefix: bytes, at_ms: int) -> bytes:
    """The version key at ``at_ms`` in the run ``prefix`` (a key's :func:`key_prefix`)."""
    return prefix + _TIME.pack(max(0, at_ms))


def key_of(prefix: bytes) -> bytes:
    """The key whose run :func:`key_prefix` starts."""
    return prefix[:-len(_END)].replace(b"\x00\xff", b"\x00")


def time_of(vkey: bytes) -> int:
    return _TIME.unpack_from(vkey, len(vkey) - _TIME.size)[0]


def expiry_key(expires_ms: int, vkey: bytes) -> bytes:
    return _TIME.pack(max(0, expires_ms)) + vkey


def split_expiry_key(raw: bytes) -> tuple[int, bytes]:
    """(expires at, version key) of an expiry index entry."""
    return _TIME.unpack_from(raw)[0], raw[_TIME.size:]


def encode_value(value: bytes | None) -> bytes:
    return _DELETE if value is None else _VALUE + value


def decode_value(raw: bytes) -> bytes | None:
    return None if raw[:1] == _DELETE else raw[1:]


def expires_at(at_ms: int, value: bytes | None, next_ms: int | None) -> int | None:
    """When a version's expiry clock starts: when it was replaced; a latest delete at once; a latest value never."""
    if next_ms is not None:
        return next_ms
    return at_ms if value is None else None


class KeyChanges(NamedTuple):
    """What new versions of one key write: version rows, expiry index entries to delete and to put, and the latest
    row's new value if the newest version changed (``latest_changed``)."""

    versions: list[tuple[int, bytes | None]]
    expiry_deletes: list[tuple[int, int]]  # (expires at, version time)
    expiry_puts: list[tuple[int, int]]  # (expires at, version time)
    latest_changed: bool
    latest: bytes | None


def key_changes(held: list[tuple[int, bytes | None]], new: dict[int, bytes | None]) -> KeyChanges:
    """The writes that take a key's ``new`` versions (time → value) into its history, of which ``held`` is every
    version from the last one before the earliest new time onward (ascending)."""
    before = dict(held)
    after = {**before, **new}
    times = sorted(after)
    old_times = sorted(before)
    old_expiry = {t: expires_at(t, before[t], n) for t, n in zip(old_times, old_times[1:] + [None])}
    deletes: list[tuple[int, int]] = []
    puts: list[tuple[int, int]] = []
    for t, n in zip(times, times[1:] + [None]):
        expiry = expires_at(t, after[t], n)
        was = old_expiry.get(t)
        if t in old_expiry and was == expiry:
            continue
        if was is not None:
            deletes.append((was, t))
        if expiry is not None:
            puts.append((expiry, t))
    newest = times[-1]
    changed = not old_times or newest != old_times[-1] or newest in new
    return KeyChanges(sorted(new.items()), deletes, puts, changed, after[newest])


def by_key(versions: Iterable[tuple[bytes, int, bytes | None]]) -> dict[bytes, dict[int, bytes | None]]:
    """Records' (key, time, value) in changelog order as each key's new versions (the later of one time wins)."""
    out: dict[bytes, dict[int, bytes | None]] = {}
    for key, at_ms, value in versions:
        out.setdefault(key, {})[max(0, at_ms)] = value
    return out


Write = tuple[Any, bytes, bytes | None]  # (column family, key, value or None to delete)


class History:
    """A replica store's versions and their expiry index: what a write of new versions writes, reads of a key's
    versions, and what expires. The store writes it all in its own batches, with its checkpoint."""

    def __init__(self, path: Path, db: Rdict) -> None:
        self._path = path
        self._versions_cf = db.get_column_family_handle(VERSIONS_CF)
        self._versions: Rdict | None = db.get_column_family(VERSIONS_CF)
        self._expiry_cf = db.get_column_family_handle(EXPIRY_CF)
        self._expiry: Rdict | None = db.get_column_family(EXPIRY_CF)

    def close(self) -> None:
        """Drop every handle, so that the database can close."""
        self._versions = self._expiry = self._versions_cf = self._expiry_cf = None

    def _family(self, family: Rdict | None) -> Rdict:
        if family is None:
            raise self._closed()
        return family

    def _closed(self) -> StoreCorrupt:
        return StoreCorrupt(f"replica store {self._path} is closed", path=str(self._path))

    def _failed(self, e: Exception) -> StoreCorrupt:
        return StoreCorrupt(f"cannot read the history of replica store {self._path}: {e}", path=str(self._path))

    def changes(self, versions: Iterable[tuple[bytes, int, bytes | None]]) -> tuple[list[tuple[bytes, bytes | None]],
                                                                                  list[Write]]:
        """The latest rows that change and the history writes that take records' (key, time, value) in."""
        rows: list[tuple[bytes, bytes | None]] = []
        writes: list[Write] = []
        for key, new in by_key(versions).items():
            change = key_changes(self._held(key, min(new)), new)
            for at_ms, value in change.versions:
                writes.append((self._versions_cf, version_key(key, at_ms), encode_value(value)))
            for expires_ms, at_ms in change.expiry_deletes:
                writes.append((self._expiry_cf, expiry_key(expires_ms, version_key(key, at_ms)), None))
            for expires_ms, at_ms in change.expiry_puts:
                writes.append((self._expiry_cf, expiry_key(expires_ms, version_key(key, at_ms)), b""))
            if change.latest_changed:
                rows.append((key, change.latest))
        return rows, writes

    def _held(self, key: bytes, from_ms: int) -> list[tuple[int, bytes | None]]:
        """The key's versions from the last one before ``from_ms`` onward, ascending."""
        family = self._family(self._versions)
        prefix = key_prefix(key)
        start = _in_run(prefix, from_ms)
        out = []
        try:
            it = family.iter()
            it.seek_for_prev(start)
            if not (it.valid() and it.key()[:-_TIME.size] == prefix):
                it.seek(start)
            while it.valid():
                vkey = it.key()
                if vkey[:-_TIME.size] != prefix:
                    break
                out.append((time_of(vkey), decode_value(it.value())))
                it.next()
            del it
        except Exception as e:
            raise self._failed(e) from None
        return out

    def at(self, key: bytes, at_ms: int) -> Version | None:
        """The version of ``key`` valid at ``at_ms`` (None: it had none): one seek, and one step for its end."""
        family = self._family(self._versions)
        prefix = key_prefix(key)
        try:
            it = family.iter()
            it.seek_for_prev(_in_run(prefix, at_ms))
            if not it.valid() or (found := it.key())[:-_TIME.size] != prefix:
                return None
            value = it.value()
            it.next()
            after = it.key() if it.valid() else None
            del it
        except Exception as e:
            raise self._failed(e) from None
        valid_to = time_of(after) if after is not None and after[:-_TIME.size] == prefix else None
        return Version(time_of(found), valid_to, decode_value(value))

    def versions(self, key: bytes, from_ms: int, to_ms: int, limit: int) -> list[Version]:
        """Up to ``limit`` versions of ``key`` valid at some time in ``[from_ms, to_ms)``, newest first."""
        family = self._family(self._versions)
        prefix = key_prefix(key)
        out: list[Version] = []
        try:
            it = family.iter()
            it.seek(_in_run(prefix, to_ms))
            valid_to = time_of(it.key()) if it.valid() and it.key()[:-_TIME.size] == prefix else None
            it.seek_for_prev(_in_run(prefix, to_ms - 1))
            while len(out) < limit and it.valid() and (valid_to is None or valid_to > from_ms):
                vkey = it.key()
                if vkey[:-_TIME.size] != prefix:
                    break
                at_ms = time_of(vkey)
                out.append(Version(at_ms, valid_to, decode_value(it.value())))
                valid_to = at_ms
                it.prev()
            del it
        except Exception as e:
            raise self._failed(e) from None
        return out

    def rows_at(self, start: bytes, end: bytes | None, at_ms: int, limit: int) -> list[tuple[bytes, Version]]:
        """Up to ``limit`` keys in ``[start, end)`` (``end`` None: unbounded), in byte order, each with its version valid
        at ``at_ms``; a key absent then (no version yet, or a delete) is left out."""
        family = self._family(self._versions)
        out: list[tuple[bytes, Version]] = []
        run, key, found, valid_to = b"", b"", None, None

        def close() -> None:
            if found is not None and (value := decode_value(found[1])) is not None:
                out.append((key, Version(found[0], valid_to, value)))

        try:
            it = family.iter()
            it.seek(key_prefix(start))
            while it.valid():
                vkey = it.key()
                if vkey[:-_TIME.size] != run:
                    close()
                    run, found, valid_to = vkey[:-_TIME.size], None, None
                    key = key_of(run)
                    if len(out) >= limit or (end is not None and key >= end):
                        run = b""
                        break
                at = time_of(vkey)
                if at > at_ms:
                    # The run's later versions say nothing more: on to the next key's.
                    valid_to = at
                    it.seek(run + b"\xff" * (_TIME.size + 1))
                    continue
                found = (at, it.value())
                it.next()
            del it
        except Exception as e:
            raise self._failed(e) from None
        if run:
            close()
        return out[:limit]

    def expiring(self, before_ms: int, limit: int) -> list[Write]:
        """The deletes of up to ``limit`` versions whose expiry clock started before ``before_ms``, and of their index
        entries: only the index's head is read."""
        family = self._family(self._expiry)
        writes: list[Write] = []
        try:
            it = family.iter()
            it.seek_to_first()
            while len(writes) < 2 * limit and it.valid():
                raw = it.key()
                expires_ms, vkey = split_expiry_key(raw)
                if expires_ms >= before_ms:
                    break
                writes.append((self._versions_cf, vkey, None))
                writes.append((self._expiry_cf, raw, None))
                it.next()
            del it
        except Exception as e:
            raise self._failed(e) from None
        return writes

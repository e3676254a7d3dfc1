"""What a client read returns: one frozen value per key, labelled with who answered and how fresh it was."""

from __future__ import annotations

import base64
from typing import Any, NamedTuple

import orjson

from freshroute.errors import FreshrouteError
from freshroute.metadata.table_versions import logical_of, physical_name
from freshroute.position import Position
from freshroute.routing.answers import served_by
from freshroute.routing.history import AsOf, Versions
from freshroute.routing.results import LookupResult, ScanPage, WindowsResult, optional_int, position_token
from freshroute.routing.selection import Candidate
from freshroute.wire import GroupResult


class Lookup(NamedTuple):
    """One key's answer; ``found`` False (``value`` None) when the table has no such key, still saying where and how fresh.

    Immutable; a tuple because a batch makes one per key and a tuple costs a fifth of a frozen dataclass to make.
    The row travels as the changelog's JSON bytes (``raw_value``) and is decoded when ``value`` is read: a
    batch's rows cost nothing to decode until used, and a caller passing rows on as JSON never decodes them.
    """

    table: str
    key: str
    found: bool
    raw_value: bytes | None  # the row's JSON as the changelog holds it; None when not found
    partition: int
    node: str
    role: str
    lag_offsets: int | None  # None: the serving replica did not know its changelog's end offset yet
    lag_ms: int | None  # None: the replica has never been caught up
    applied_offset: int  # the serving replica's position in the partition's changelog
    # How far the table's changelog was behind its input (the pipeline's lag): 0 while it keeps up.
    input_lag_records: int = 0
    input_lag_ms: int = 0
    # How the table holds values (freshroute.formats): "json" for every table the pipeline writes.
    value_format: str = "json"

    @property
    def value(self) -> Any:
        """The row, decoded from ``raw_value`` at each access (keep it to decode once); None when not found. A table
        of ``bytes`` values gives the bytes, one of ``string`` values the text."""
        raw = self.raw_value
        if raw is None:
            return None
        try:
            return decoded(self.value_format, raw)
        except orjson.JSONDecodeError as e:
            raise FreshrouteError(f"the row of {self.table}/{self.key!r} is not JSON: {e}", table=self.table,
                                  key=self.key) from None

    @property
    def position(self) -> str:
        """A position token: pass it as ``min_position`` to read at least this fresh later."""
        return position_token(self.table, self.partition, self.applied_offset)

    @property
    def table_version(self) -> int:
        """The version of the table that answered (``table`` is its own name: ``t``, or ``t-vN`` for N ≥ 2)."""
        return logical_of(self.table)[1]

    @classmethod
    def of(cls, r: LookupResult, input_lag: tuple[int, int] = (0, 0), value_format: str = "json") -> "Lookup":
        return cls(r.table, r.key, r.found, r.value if r.found else None, r.partition,
                   r.node, r.role, r.lag_offsets, r.lag_ms, r.applied, *input_lag, value_format)

    @classmethod
    def group(cls, table: str, keys: list[str], partition: int, cand: Candidate, answer: GroupResult,
              input_lag: tuple[int, int] = (0, 0), value_format: str = "json") -> list["Lookup"]:
        """A batch group's answers, built straight from the wire (a batch's per-key cost is most of its cost)."""
        # The same for every key of the group.
        tail = (partition, *served_by(cand, answer.replica), *input_lag, value_format)
        # tuple.__new__ rather than the class: a named tuple's own __new__ is a Python function, and half the
        # cost of building each key's answer. A group answers an absent key with empty bytes.
        new = tuple.__new__
        return [new(cls, (table, key, True, value) + tail) if value else
                new(cls, (table, key, False, None) + tail) for key, value in zip(keys, answer.values)]

    @classmethod
    def from_json(cls, doc: dict[str, Any], found: bool = True, input_lag: dict[str, Any] | None = None) -> "Lookup":
        """From a router's REST answer (a 200, a batch item with its batch's ``input_lag``, or a KEY_NOT_FOUND
        error's details)."""
        table, partition = answered(doc), int(doc["partition"])
        applied = Position.decode(doc["position"]).offset_for(partition) if doc.get("position") else 0
        served, lag = doc.get("served_by") or {}, doc.get("lag") or {}
        behind = input_lag or doc.get("input_lag") or {}
        raw, fmt = (base64.b64decode(doc["value_b64"]), "bytes") if "value_b64" in doc else \
            (orjson.dumps(doc.get("value")), "json")
        return cls(table, doc["key"], found, raw if found else None, partition,
                   served.get("node", ""), served.get("role", ""), optional_int(lag.get("offsets")),
                   optional_int(lag.get("ms")), applied, int(behind.get("records", 0)), int(behind.get("ms", 0)), fmt)


def answered(doc: dict[str, Any]) -> str:
    """The name of the table version a router's answer came from, as the client's answers name it."""
    return physical_name(doc["table"], int(doc.get("table_version") or 1))


def decoded(value_format: str, raw: bytes) -> Any:
    """A stored value as a client gives it: a JSON table's decoded, a string table's text, a bytes table's bytes."""
    if value_format == "bytes":
        return raw
    if value_format == "string":
        return raw.decode("utf-8")
    return orjson.loads(raw)


class WindowValue(NamedTuple):
    """One window of a key: ``final`` once no late record can revise it."""

    start: int  # ms since the epoch, inclusive
    end: int  # exclusive
    value: Any  # the row, decoded from JSON
    final: bool


class Windows(NamedTuple):
    """A key's windows in a time range (in start order), labelled with who answered and how fresh it was."""

    table: str
    key: str
    windows: tuple[WindowValue, ...]
    partition: int
    node: str
    role: str
    lag_offsets: int | None  # None: the serving replica did not know its changelog's end offset yet
    lag_ms: int | None  # None: the replica has never been caught up
    applied_offset: int
    watermark_ms: int | None  # the partition's watermark (event time − grace) as of the answer
    input_lag_records: int = 0  # as in Lookup
    input_lag_ms: int = 0

    @property
    def position(self) -> str:
        return position_token(self.table, self.partition, self.applied_offset)

    @property
    def table_version(self) -> int:
        """As :attr:`Lookup.table_version`."""
        return logical_of(self.table)[1]

    @classmethod
    def of(cls, r: WindowsResult, input_lag: tuple[int, int] = (0, 0)) -> "Windows":
        return cls(r.table, r.key, tuple(WindowValue(w.start, w.end, orjson.loads(w.value), w.final) for w in r.windows),
                   r.partition, r.node, r.role, r.lag_offsets, r.lag_ms, r.applied, r.watermark_ms, *input_lag)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Windows":
        """From a router's REST answer."""
        partition = int(doc["partition"])
        applied = Position.decode(doc["position"]).offset_for(partition) if doc.get("position") else 0
        served, lag = doc.get("served_by") or {}, doc.get("lag") or {}
        behind = doc.get("input_lag") or {}
        return cls(answered(doc), doc["key"], tuple(WindowValue(int(w["start"]), int(w["end"]), w["value"],
                                                               bool(w["final"])) for w in doc["windows"]),
                   partition, served.get("node", ""), served.get("role", ""), optional_int(lag.get("offsets")),
                   optional_int(lag.get("ms")), applied, doc.get("watermark_ms"), int(behind.get("records", 0)),
                   int(behind.get("ms", 0)))


class AsOfLookup(NamedTuple):
    """A versioned table's key as of a time: ``lookup`` holds the version valid then (``found`` False: the key was
    absent), valid over ``[valid_from_ms, valid_to_ms)``; ``final`` when no change can reach it any more."""

    lookup: Lookup
    as_of_ms: int
    valid_from_ms: int | None  # None: no version (the key had none then)
    valid_to_ms: int | None  # None: it is still the key's latest
    final: bool

    # What a session notes of any answer: where it was read, and how far.
    @property
    def table(self) -> str:
        return self.lookup.table

    @property
    def table_version(self) -> int:
        return self.lookup.table_version

    @property
    def partition(self) -> int:
        return self.lookup.partition

    @property
    def applied_offset(self) -> int:
        return self.lookup.applied_offset

    @property
    def found(self) -> bool:
        return self.lookup.found

    @property
    def value(self) -> Any:
        return self.lookup.value

    @classmethod
    def of(cls, answer: AsOf, input_lag: tuple[int, int] = (0, 0), value_format: str = "json") -> "AsOfLookup":
        v = answer.version
        return cls(Lookup.of(answer.lookup, input_lag, value_format), answer.as_of_ms, v.valid_from_ms if v else None,
                   v.valid_to_ms if v else None, answer.final)

    @classmethod
    def from_json(cls, doc: dict[str, Any], found: bool = True,
                  input_lag: dict[str, Any] | None = None) -> "AsOfLookup":
        """From a router's REST answer (a 200, a KEY_NOT_FOUND error's details, or a batch's or scan's item with
        their ``as_of``, ``final`` and ``input_lag``)."""
        return cls(Lookup.from_json(doc, found, input_lag), int(doc["as_of"]), optional_int(doc.get("valid_from")),
                   optional_int(doc.get("valid_to")), bool(doc.get("final")))


def scanned(page: ScanPage, input_lag: tuple[int, int], value_format: str) -> list[Lookup | AsOfLookup]:
    """A scan page's rows, each labelled by the replica that read its partition; as of a time, with its version."""
    rows: list[Lookup | AsOfLookup] = []
    as_of_ms = page.as_of_ms  # not None where a row has a version
    for (key, value, partition), version in page.items_with_versions():
        row = Lookup.of(page.served_by[partition]._replace(key=key, found=True, value=value), input_lag, value_format)
        rows.append(row if version is None or as_of_ms is None else
                    AsOfLookup(row, as_of_ms, version.valid_from_ms, version.valid_to_ms, page.final))
    return rows


class KeyVersion(NamedTuple):
    """One version of a key: its value (None for a delete) over ``[valid_from_ms, valid_to_ms)``."""

    value: Any
    valid_from_ms: int
    valid_to_ms: int | None  # None: the latest
    deleted: bool


class KeyVersions(NamedTuple):
    """A page of a key's versions, newest first, labelled with who answered and how fresh it was."""

    table: str
    key: str
    versions: tuple[KeyVersion, ...]
    next_page_token: str | None  # pass as page_token for older versions; None: no more
    complete_to_ms: int  # the serving replica had every version up to this time
    partition: int
    node: str
    role: str
    lag_offsets: int | None
    lag_ms: int | None  # None: the replica has never been caught up
    applied_offset: int

    @property
    def table_version(self) -> int:
        """As :attr:`Lookup.table_version`."""
        return logical_of(self.table)[1]

    @classmethod
    def of(cls, page: Versions, value_format: str = "json") -> "KeyVersions":
        r = page.lookup
        versions = tuple(KeyVersion(None if v.value is None else decoded(value_format, v.value), v.valid_from_ms,
                                    v.valid_to_ms, v.value is None) for v in page.versions)
        return cls(r.table, r.key, versions, None if page.next_to_ms is None else str(page.next_to_ms),
                   page.complete_ms, r.partition, r.node, r.role, r.lag_offsets, r.lag_ms, r.applied)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "KeyVersions":
        """From a router's REST answer."""
        partition = int(doc["partition"])
        applied = Position.decode(doc["position"]).offset_for(partition) if doc.get("position") else 0
        served, lag = doc.get("served_by") or {}, doc.get("lag") or {}
        versions = tuple(KeyVersion(base64.b64decode(v["value_b64"]) if "value_b64" in v else v.get("value"),
                                    int(v["valid_from"]), optional_int(v.get("valid_to")), bool(v["deleted"]))
                         for v in doc["versions"])
        return cls(answered(doc), doc["key"], versions, doc.get("next_page_token"), int(doc["complete_to"]), partition,
                   served.get("node", ""), served.get("role", ""), optional_int(lag.get("offsets")),
                   optional_int(lag.get("ms")), applied)

"""A table's versions: each definition of a table is built as a table of its own beside the one served, and reads
move to it with one metadata write once it has caught up (Venice's store versions, for tables a stream keeps).

Version 1 is the table as it always was (its own name, changelog and replicas); version N ≥ 2 is the table
``<name>-vN``, which no table of a tables file can be named (a name has no hyphen), with its own changelog, query,
checkpoint and replicas. A table's record says which version is served and what became of each other one: what
the routers resolve a name by, and what the switch, a rollback and a retirement change — each a transition here,
written whole by :class:`freshroute.metadata.version_store.TableVersionStore`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum
from types import MappingProxyType
from typing import Any, Callable, Mapping, TypeVar

import orjson

from freshroute.errors import NoPreviousTableVersion, TableVersionNotFound

T = TypeVar("T")
_PHYSICAL = re.compile(r"(?P<table>.+)-v(?P<version>[1-9][0-9]*)")


class VersionState(str, Enum):
    BUILDING = "building"  # computed from the input beside the served version; readable by its number
    SERVING = "serving"  # what a read of the table's name answers from
    PREVIOUS = "previous"  # served until the last switch, kept up to date for a rollback until its retire_at_ms
    FAILED = "failed"  # could not be built (its reason says why); never served
    RETIRED = "retired"  # its query stopped, its changelog and replicas deleted


# The states of a version whose query runs: what a pipeline computes, and a read may ask for by number.
LIVE = (VersionState.SERVING, VersionState.BUILDING, VersionState.PREVIOUS)


def physical_name(table: str, version: int) -> str:
    """The name version ``version`` of ``table`` is built, placed and stored under."""
    return table if version == 1 else f"{table}-v{version}"


def listing(record: "VersionedTable | None", input_lags: Mapping[int, Mapping[str, int]] | None = None,
            catch_ups: Mapping[int, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A table's ``version`` served and its ``versions``, as every listing gives them (no record: a topic served as it
    is, one version); ``input_lags``: how far each version's changelog is behind its input, where known. A version
    building also has its ``progress`` (0..1) and ``caught_up_in_ms``, from ``catch_ups``
    (:meth:`freshroute.metadata.catch_up.CatchUp.to_dict`): null where unknown, never 0."""
    if record is None:
        return {"version": 1, "versions": []}
    lags, ways = input_lags or {}, catch_ups or {}
    versions = []
    for v in record.listed():
        doc = v.to_dict()
        if v.version in lags:
            doc["input_lag"] = dict(lags[v.version])
        if v.state is VersionState.BUILDING:
            way = ways.get(v.version) or {}
            doc["progress"], doc["caught_up_in_ms"] = way.get("progress"), way.get("caught_up_in_ms")
        versions.append(doc)
    return {"version": record.serving, "versions": versions}


def served_specs(specs: Mapping[str, T], records: Mapping[str, "VersionedTable"],
                 renamed: Callable[[T, str], T]) -> dict[str, T]:
    """Each table by its name, as its served version's spec (``renamed`` to the table's name): a version's own table
    is listed as a version of its table, not as a table of its own."""
    out: dict[str, T] = {}
    for name in sorted({logical_of(n)[0] if logical_of(n)[0] in records else n for n in specs}):
        record = records.get(name)
        served = specs.get(record.physical()) if record is not None else None
        if served is None:
            served = specs.get(name)
        if served is not None:
            out[name] = served if record is None or record.serving == 1 else renamed(served, name)
    return out


def named(physical: str) -> dict[str, Any]:
    """How an answer names the table it came from: the table, and the version of it that answered."""
    table, version = logical_of(physical)
    return {"table": table, "table_version": version}


def logical_of(physical: str) -> tuple[str, int]:
    """(table, version) of a physical name: ``t-v3`` is version 3 of ``t``; any other name is its own version 1."""
    if "-" not in physical:  # no table name has a hyphen: the usual case, at the cost of a test
        return physical, 1
    m = _PHYSICAL.fullmatch(physical)
    return (m["table"], int(m["version"])) if m else (physical, 1)


@dataclass(frozen=True)
class TableVersion:
    version: int
    state: VersionState
    fingerprint: str  # of the definition it computes: a start with the same definition builds nothing new
    created_ms: int
    switched_ms: int | None = None  # when it last began to be served
    retire_at_ms: int | None = None  # a previous version's: when it is retired
    reason: str | None = None  # a failed version's: why (the tables file, the table, Spark's words)
    definition: str | None = None  # the digest of the tables file it was defined in, as the pipeline keeps it

    def to_dict(self) -> dict[str, Any]:
        """As the record keeps it and listings show it (what is not known or not set is left out)."""
        doc: dict[str, Any] = {"version": self.version, "state": self.state.value, "fingerprint": self.fingerprint,
                               "created_ms": self.created_ms}
        for name in ("switched_ms", "retire_at_ms", "reason", "definition"):
            if getattr(self, name) is not None:
                doc[name] = getattr(self, name)
        return doc


@dataclass(frozen=True)
class VersionedTable:
    """One table's versions and which of them is served."""

    name: str
    serving: int
    versions: Mapping[int, TableVersion]
    # The fingerprint of the table as the tables file defined it when the pipeline last started: a start whose tables
    # file still defines it so begins no version (one rolled back from is not built again); None: the newest's.
    proposed: str | None = None

    @classmethod
    def first(cls, name: str, fingerprint: str, now_ms: int, definition: str | None = None) -> "VersionedTable":
        """A table as it was before it had versions: its one definition, served."""
        return cls(name, 1, MappingProxyType({1: TableVersion(1, VersionState.SERVING, fingerprint, now_ms, now_ms,
                                                              definition=definition)}))

    def proposal(self) -> str:
        """The fingerprint of the definition the tables file last proposed for the table."""
        return self.proposed if self.proposed is not None else self.versions[max(self.versions)].fingerprint

    def listed(self) -> list[TableVersion]:
        """Its versions, oldest first."""
        return [self.versions[n] for n in sorted(self.versions)]

    def summary(self) -> str:
        """The served version, and what the others are doing that is not over: ``2 (1 previous, 3 building)``."""
        others = [f"{v.version} {v.state.value}" for v in self.listed()
                  if v.version != self.serving and v.state in (VersionState.BUILDING, VersionState.PREVIOUS)]
        return f"{self.serving} ({', '.join(others)})" if others else str(self.serving)

    def physical(self, version: int | None = None) -> str:
        """The physical name of ``version`` (default: the one served)."""
        return physical_name(self.name, self.serving if version is None else version)

    def of_state(self, state: VersionState) -> TableVersion | None:
        """The version in ``state`` (at most one is building, serving or previous at a time)."""
        return next((v for v in self.versions.values() if v.state is state), None)

    def version(self, version: int) -> TableVersion:
        """Version ``version``, whatever became of it; a named error if the table never had it."""
        v = self.versions.get(version)
        if v is None:
            raise TableVersionNotFound(f"table {self.name!r} has no version {version} (versions: "
                                       f"{', '.join(str(n) for n in sorted(self.versions))})", table=self.name,
                                       table_version=version)
        return v

    def readable(self, version: int) -> TableVersion:
        """Version ``version`` if a read may ask for it by number (building, serving or previous), else a named
        error saying what became of it."""
        v = self.version(version)
        if v.state in (VersionState.FAILED, VersionState.RETIRED):
            why = f": {v.reason}" if v.reason else ""
            raise TableVersionNotFound(f"version {version} of table {self.name!r} is {v.state.value}{why}",
                                       table=self.name, table_version=version, state=v.state.value)
        return v

    # ---- transitions: each gives the record the one write stores ----------------------------------

    def begun(self, fingerprint: str, now_ms: int, definition: str | None = None
              ) -> tuple["VersionedTable", TableVersion]:
        """A new version of another definition, building beside the served one; its number is never reused."""
        new = TableVersion(max(self.versions) + 1, VersionState.BUILDING, fingerprint, now_ms, definition=definition)
        return self._with({new.version: new}), new

    def switched(self, to: int, now_ms: int, retain_ms: int) -> "VersionedTable":
        """Serve version ``to`` (building or previous): the served one becomes previous, kept ``retain_ms``; a
        previous one already there goes to be retired at once."""
        target = self.readable(to)
        if target.state is VersionState.SERVING:
            return self
        changes = {to: replace(target, state=VersionState.SERVING, switched_ms=now_ms, retire_at_ms=None)}
        old = self.versions[self.serving]
        changes[old.version] = replace(old, state=VersionState.PREVIOUS, retire_at_ms=now_ms + retain_ms)
        prior = self.of_state(VersionState.PREVIOUS)
        if prior is not None and prior.version != to:
            changes[prior.version] = replace(prior, retire_at_ms=now_ms)
        return replace(self._with(changes), serving=to)

    def rolled_back(self, now_ms: int, retain_ms: int) -> "VersionedTable":
        """Serve the previous version again, at once; the one served until now becomes previous."""
        previous = self.of_state(VersionState.PREVIOUS)
        if previous is None:
            raise NoPreviousTableVersion(f"table {self.name!r} has no previous version to roll back to (it serves "
                                         f"version {self.serving})", table=self.name, serving=self.serving)
        return self.switched(previous.version, now_ms, retain_ms)

    def recomputed(self, fingerprint: str, definition: str | None = None) -> "VersionedTable":
        """The served version, computed again in place from the input under another definition (its query started
        without a checkpoint)."""
        return self._with({self.serving: replace(self.versions[self.serving], fingerprint=fingerprint,
                                                 definition=definition)})

    def failed(self, version: int, reason: str) -> "VersionedTable":
        """A version that could not be built, with why; the served one is untouched."""
        return self._with({version: replace(self.version(version), state=VersionState.FAILED, reason=reason)})

    def retired(self, version: int) -> "VersionedTable":
        """A previous (or failed) version whose query, changelog and replicas are gone."""
        return self._with({version: replace(self.version(version), state=VersionState.RETIRED, retire_at_ms=None)})

    def proposing(self, fingerprint: str) -> "VersionedTable":
        """The table as a tables file defines it now: what a later start compares its tables file with."""
        return replace(self, proposed=fingerprint)

    def _with(self, changes: Mapping[int, TableVersion]) -> "VersionedTable":
        return replace(self, versions=MappingProxyType({**self.versions, **changes}))

    # ---- JSON, as Redis keeps it ---------------------------------------------------------------

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {"name": self.name, "serving": self.serving,
                               "versions": [v.to_dict() for v in self.listed()]}
        if self.proposed is not None:
            doc["proposed"] = self.proposed
        return orjson.dumps(doc)

    @classmethod
    def from_json(cls, raw: bytes | str) -> "VersionedTable":
        doc = orjson.loads(raw)
        versions = {int(d["version"]): TableVersion(int(d["version"]), VersionState(d["state"]), d["fingerprint"],
                                                    int(d["created_ms"]), d.get("switched_ms"),
                                                    d.get("retire_at_ms"), d.get("reason"), d.get("definition"))
                    for d in doc["versions"]}
        return cls(doc["name"], int(doc["serving"]), MappingProxyType(versions), doc.get("proposed"))


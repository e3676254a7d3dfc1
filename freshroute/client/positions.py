"""Monotonic reads: the highest position a client (or a session) has read of each table-partition, sent as the
``min_position`` of every later read of the table, so that no answer is older than one already given."""

from __future__ import annotations

import threading
from operator import attrgetter
from typing import Any, Iterable, Protocol, TypeVar

from freshroute.bound import NO_BOUND, Bound, BoundArgs
from freshroute.errors import FreshrouteError
from freshroute.metadata.table_versions import logical_of
from freshroute.position import Position


class Positioned(Protocol):
    """An answer as a session notes it: where it was read (table, partition), and how far (the replica's applied
    offset)."""

    @property
    def table(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def applied_offset(self) -> int: ...


P = TypeVar("P", bound=Positioned)  # an answer with a position
_POSITION = attrgetter("table", "partition", "applied_offset")


class Positions:
    """The highest position seen per table-partition: what monotonic reads send as ``min_position`` (thread-safe).

    Kept as plain offsets, with each table's :class:`Position` — and the bound a read of no bound of its own sends —
    made again only after one moved: a read notes its position and the next read sends it, so both sit on every
    lookup's path.
    """

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep  # False: reads are not monotonic, and nothing is kept
        self._offsets: dict[str, dict[int, int]] = {}
        self._by_table: dict[str, Position] = {}
        self._unbounded: dict[str, Bound] = {}  # table → the bound of the position seen, for a read of no bound
        # table → the version's own name it was last answered by, where that is not its own (a version N ≥ 2): the
        # positions a read sends are of the version that answers it (another's are set aside by the router).
        self._answered_by: dict[str, str] = {}
        self._lock = threading.Lock()

    def bound(self, table: str, bound: Bound | None, limits: BoundArgs) -> Bound:
        """The bound a read of ``table`` sends: the caller's with its keyword shorthands over it, at least as fresh
        as what was seen of the table."""
        if self._answered_by:
            table = self._answered_by.get(table, table)
        if bound is None and not limits:
            raised = self._unbounded.get(table)
            return raised if raised is not None else self._raised(table)
        return self.at_least(table, Bound.of(bound, limits))

    def _raised(self, table: str) -> Bound:
        """The bound of the position seen of ``table``, kept until a read moves it (made under the lock, so a kept one
        is never older than what was seen when it was kept)."""
        if not self._offsets.get(table):
            return NO_BOUND
        with self._lock:
            offsets = self._offsets[table]
            seen = self._by_table.get(table)
            if seen is None:
                seen = self._by_table[table] = Position(table, dict(offsets))
            raised = self._unbounded[table] = Bound(min_position=seen)
        return raised

    def at_least(self, table: str, bound: Bound) -> Bound:
        """``bound`` raised to the position seen of ``table``, merged with the caller's own ``min_position``."""
        seen = self.of(table)
        mine = bound.min_position
        if seen is None or (mine is not None and mine.table != table):
            return bound
        return bound._replace(min_position=seen if mine is None else seen.merge(mine))

    def seen(self, result: P) -> P:
        """Note what a read answered (its position), so that no later read goes back; returns it."""
        self.saw((result,))
        return result

    def seen_all(self, results: list[Any]) -> list[Any]:
        """Note what a read of many answered (its errors aside); returns them."""
        if self.keep:
            try:
                # Each distinct position once, gathered at C speed: a batch's answers of one partition were read
                # from one replica and share theirs, so a Python step per answer would be mostly repeats.
                positions = set(map(_POSITION, results))
            except AttributeError:  # an error among them, which has no position
                positions = {_POSITION(r) for r in results if not isinstance(r, FreshrouteError)}
            self._note(positions)
        return results

    def saw(self, lookups: Iterable[Positioned]) -> None:
        if self.keep:
            self._note(map(_POSITION, lookups))

    def _note(self, positions: Iterable[tuple[str, int, int]]) -> None:
        """Each (table, partition, applied offset) answered."""
        for table, partition, applied in positions:
            if "-" in table:  # a version N ≥ 2 answered (no table name has a hyphen)
                self._answered_by[logical_of(table)[0]] = table
            elif self._answered_by:
                self._answered_by.pop(table, None)
            offsets = self._offsets.get(table)
            if offsets is not None and offsets.get(partition, 0) >= applied:
                continue  # nothing newer: the usual case between two applied batches
            with self._lock:
                offsets = self._offsets.setdefault(table, {})
                if applied > offsets.get(partition, 0):
                    offsets[partition] = applied
                    self._by_table.pop(table, None)
                    self._unbounded.pop(table, None)

    def of(self, table: str) -> Position | None:
        """The position seen of ``table``: per partition, the latest applied offset of any answer."""
        seen = self._by_table.get(table)  # never filled while nothing is kept
        if seen is None:
            with self._lock:
                offsets = self._offsets.get(table)
                if offsets:
                    seen = self._by_table[table] = Position(table, dict(offsets))
        return seen

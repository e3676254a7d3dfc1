"""A replica's answer made the caller's result, labelled with who gave it and how fresh it was: one key's, a batch
group's (a windows lookup's is :class:`freshroute.routing.core.WindowsRead`'s)."""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from freshroute.lag import known_staleness
from freshroute.routing.results import LookupResult
from freshroute.routing.selection import Candidate
from freshroute.wire import GroupResult, ReadResult, ReadStatus, ReplicaStatus


def served_by(cand: Candidate, rep: ReplicaStatus | None) -> tuple[str, str, int | None, int | None, int]:
    """(node, role, lag offsets, lag ms, applied) of the replica that answered: its own report if it sent one, else
    the view's (lag ms None: it has never been caught up)."""
    if rep is None:
        r = cand.replica
        return r.node, r.role.value, cand.lag_offsets, known_staleness(cand.staleness_ms), cand.applied
    return rep.node or cand.replica.node, rep.role.value, rep.lag_offsets, known_staleness(rep.staleness_ms), \
        rep.applied


T = TypeVar("T")
# One group's answer → its keys' results, in the group's order: (table, keys, partition, replica tried, answer).
GroupAnswers = Callable[[str, list[str], int, Candidate, GroupResult], Sequence[T]]


def lookup_result(table: str, key: str, partition: int, cand: Candidate, answer: ReadResult) -> LookupResult:
    """One key's answer, labelled with the replica that gave it."""
    return LookupResult(table, key, partition, answer.status is ReadStatus.OK, answer.value,
                        *served_by(cand, answer.replica))


def group_lookups(table: str, keys: list[str], partition: int, cand: Candidate,
                  answer: GroupResult) -> list[LookupResult]:
    """A group's answers, key by key in the group's order, each labelled with the replica that gave them."""
    who = served_by(cand, answer.replica)
    return [LookupResult(table, key, partition, bool(value), value, *who) for key, value in zip(keys, answer.values)]

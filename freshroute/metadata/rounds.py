"""A membership round, a node's one round trip to the metadata store: what it sends (its beat, and its report or
positions when they changed) and what it learns (whether Redis still holds its report, the assignor lease, and the
versions of the tables and the assignment to follow)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RoundRequest:
    """What one membership round sends: the beat (None: not this round), and the report when its
    shape changed or else the positions when they moved."""

    node_id: str
    beat_ms: int | None
    ttl_ms: int
    report: bytes | None
    positions: bytes | None = None


@dataclass(frozen=True)
class Round:
    """What one membership round learns in one round trip: the lease and the versions to follow."""

    report_held: bool  # False: Redis no longer holds this node's report (it lost its state); publish it again
    lease: str | None  # the assignor lease's value, "{node_id}:{generation}"
    tables_version: bytes | None
    assignment_version: bytes | None


UNREAD: Any = object()  # "not read yet", where None is a value read

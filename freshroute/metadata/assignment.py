"""The assignment: who hosts each table-partition, the active first, as the assignor lease holder writes it; and
one node's part of it (its placement), which is all a node reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Container

import orjson

from freshroute.metadata.roles import Role


@dataclass(frozen=True)
class Assignment:
    """Who hosts what: for each (table, partition), node ids with the active first."""

    generation: int
    replicas: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)

    def active(self, table: str, partition: int) -> str | None:
        nodes = self.replicas.get((table, partition), ())
        return nodes[0] if nodes else None

    def hosted_by(self, node_id: str) -> dict[tuple[str, int], Role]:
        return self.placements().get(node_id, {})

    def placements(self, only: Container[str] | None = None) -> dict[str, dict[tuple[str, int], Role]]:
        """Each node's part (or only these nodes' parts): its replicas and their roles."""
        out: dict[str, dict[tuple[str, int], Role]] = {}
        for tp, nodes in self.replicas.items():
            for i, node_id in enumerate(nodes):
                if only is None or node_id in only:
                    out.setdefault(node_id, {})[tp] = Role.ACTIVE if i == 0 else Role.STANDBY
        return out

    def differing(self, other: "Assignment | None") -> list[tuple[str, int]]:
        """The partitions whose replicas (or their order) differ from ``other``'s."""
        theirs = other.replicas if other is not None else {}
        return [k for k in self.replicas.keys() | theirs.keys() if self.replicas.get(k) != theirs.get(k)]

    def to_json(self) -> bytes:
        return orjson.dumps({"generation": self.generation,
                             "replicas": [[t, p, list(n)] for (t, p), n in sorted(self.replicas.items())]})

    @classmethod
    def from_json(cls, raw: bytes | str) -> "Assignment":
        d = orjson.loads(raw)
        return cls(int(d["generation"]), {(t, int(p)): tuple(n) for t, p, n in d["replicas"]})


def placement_json(hosted: dict[tuple[str, int], Role]) -> bytes:
    """One node's part of an assignment, as the node reads it."""
    return orjson.dumps(sorted([t, p, r.value] for (t, p), r in hosted.items()))


def placement_from_json(raw: bytes | str) -> dict[tuple[str, int], Role]:
    return {(t, int(p)): Role(r) for t, p, r in orjson.loads(raw)}


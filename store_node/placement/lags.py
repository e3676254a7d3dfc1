"""What the nodes report about each table-partition's replicas, judged as placing them needs: how caught up a
replica is (the rank that orders survivors and candidates) and whether it is warm enough to take over as active."""

from __future__ import annotations

from typing import Container, Iterable, Mapping

from freshroute.lag import rank_lag
from freshroute.metadata.reports import NodeReport, ReplicaReport
from freshroute.metadata.roles import ReplicaState

ReplicaKey = tuple[str, int]
COLD = (2, float("inf"), float("inf"))
_RESTORING = ReplicaState.RESTORING


class ReportedLags:
    """Per (table-partition, node): what that node reports about its replica."""

    __slots__ = ("by_key", "_warm")

    def __init__(self, by_key: Mapping[ReplicaKey, Mapping[str, ReplicaReport]], threshold: int) -> None:
        self.by_key = by_key
        # Judged once: every step of an assignment asks about warmth, tens of thousands of times.
        self._warm = {(key, node) for key, reports in by_key.items() for node, r in reports.items()
                      if r.state is not _RESTORING and r.within(threshold)}

    def freshness(self, key: ReplicaKey, node: str) -> tuple:
        """Sort key, most caught-up first: serving replicas, then restoring ones, then unknown."""
        reports = self.by_key.get(key)
        r = reports.get(node) if reports is not None else None
        if r is None:
            return COLD
        return (1 if r.state is _RESTORING else 0, rank_lag(r.lag.offsets), r.staleness_ms)

    def warm(self, key: ReplicaKey, node: str) -> bool:
        return (key, node) in self._warm


def lags_of(reports: Iterable[NodeReport], caught_up_threshold: int,
            only: Container[ReplicaKey] | None = None) -> ReportedLags:
    """What the nodes report about each partition's replicas (or only these partitions')."""
    by_key: dict[ReplicaKey, dict[str, ReplicaReport]] = {}
    for report in reports:
        for r in report.replicas:
            key = (r.table, r.partition)
            if only is None or key in only:
                by_key.setdefault(key, {})[report.node_id] = r
    return ReportedLags(by_key, caught_up_threshold)

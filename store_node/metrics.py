"""The store node's Prometheus metrics: every hosted replica's lag, progress and counters, read at scrape time.

Nothing is updated on the apply path: a scrape reads the replicas the tailer publishes (an
immutable mapping, swapped on every change) and their counters, so watching a node costs it
nothing between scrapes.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from store_node.replica import Replica

_LABELS = ["table", "partition", "role"]


class ReplicaCollector(Collector):
    """Per replica: lag in offsets and ms, applied and end offsets, restoring, records applied and skipped."""

    def __init__(self, node_id: str, replicas: Callable[[], Mapping[tuple[str, int], Replica]],
                 clock_ms: Callable[[], int]) -> None:
        self._node_id = node_id
        self._replicas = replicas
        self._clock_ms = clock_ms

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self._clock_ms()
        lag = GaugeMetricFamily("freshroute_replica_lag_offsets", "records the replica is behind its changelog's end",
                                labels=_LABELS)
        staleness = GaugeMetricFamily("freshroute_replica_lag_ms",
                                      "how long since the replica was last known caught up (ms)", labels=_LABELS)
        applied = GaugeMetricFamily("freshroute_replica_applied_offset", "next changelog offset to apply",
                                    labels=_LABELS)
        end = GaugeMetricFamily("freshroute_replica_end_offset", "the changelog partition's end offset, as last seen",
                                labels=_LABELS)
        restoring = GaugeMetricFamily("freshroute_replica_restoring",
                                      "1 while the replica restores (not yet caught up once)", labels=_LABELS)
        records = CounterMetricFamily("freshroute_replica_records_applied",
                                      "changelog records applied since this process opened the replica",
                                      labels=_LABELS)
        poison = CounterMetricFamily("freshroute_replica_records_skipped",
                                     "records skipped: a null key, or a key or value not of the table's formats",
                                     labels=_LABELS)
        superseded = CounterMetricFamily("freshroute_replica_records_superseded",
                                         "rows skipped as older than the row held for their key (by input position): "
                                         "a replayed Real-time pipeline wrote them again", labels=_LABELS)
        unpositioned = CounterMetricFamily("freshroute_replica_records_unpositioned",
                                           "records applied without an input position (a micro-batch pipeline's, "
                                           "a topic served as it is, or written by hand)", labels=_LABELS)
        expired = CounterMetricFamily("freshroute_replica_versions_expired",
                                      "a versioned table's versions deleted for having been replaced longer than its "
                                      "history retention", labels=_LABELS)
        undecodable = CounterMetricFamily("freshroute_store_undecodable_records",
                                          "records of a table this node skipped since its replicas opened: a null "
                                          "key, or a key or value that does not decode in the table's formats",
                                          labels=["table"])
        by_table: dict[str, int] = {}
        restores = CounterMetricFamily("freshroute_replica_restores",
                                       "wipes followed by a restore from the changelog's start", labels=_LABELS)
        hosted = GaugeMetricFamily("freshroute_node_replicas", "replicas this node hosts, by role",
                                   labels=["node", "role"])
        roles = {"active": 0, "standby": 0}
        for rep in list(self._replicas().values()):
            labels = [rep.table, str(rep.partition), rep.role.value]
            snap = rep.snapshot(now)
            roles[rep.role.value] = roles.get(rep.role.value, 0) + 1
            if snap.end is not None:  # an end not learnt yet is no sample, never a lag of 0
                lag.add_metric(labels, snap.lag_offsets)
                end.add_metric(labels, snap.end)
            staleness.add_metric(labels, snap.staleness_ms)
            applied.add_metric(labels, snap.applied)
            restoring.add_metric(labels, 1 if rep.restoring else 0)
            records.add_metric(labels, rep.counters.records_applied)
            poison.add_metric(labels, rep.counters.records_skipped)
            superseded.add_metric(labels, rep.counters.records_superseded)
            unpositioned.add_metric(labels, rep.counters.records_unpositioned)
            if rep.spec.versioned:
                expired.add_metric(labels, rep.counters.versions_expired)
            by_table[rep.table] = by_table.get(rep.table, 0) + rep.counters.records_skipped
            restores.add_metric(labels, rep.counters.restores)
        for role, n in roles.items():
            hosted.add_metric([self._node_id, role], n)
        for table, n in sorted(by_table.items()):
            undecodable.add_metric([table], n)
        yield from (lag, staleness, applied, end, restoring, records, poison, superseded, unpositioned, expired,
                    undecodable, restores, hosted)

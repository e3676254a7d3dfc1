"""From where each hosted replica's changelog is fetched: a bulk restore for an empty store, otherwise the consumer.

The consumer is given partitions with explicit offsets (``incremental_assign``): no consumer-group rebalancing, no
commits. A replica's changelog is fetched from the offset after what its store holds.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from store_node.bulk_restore import BulkRestores
from store_node.replica import Replica

log = logging.getLogger(__name__)


def _from_checkpoint(rep: Replica) -> TopicPartition:
    """Where ``rep``'s changelog is fetched from: the offset after what its store holds."""
    return TopicPartition(rep.topic, rep.partition, rep.lag.applied or OFFSET_BEGINNING)


class ChangelogFetch:
    """Starts, stops and restarts the fetching of replicas' changelogs, on the tailer's thread."""

    def __init__(self, bulk: BulkRestores | None = None) -> None:
        self._bulk = bulk
        self._consumer: Any = None
        # What the consumer fetches: librdkafka refuses to unassign a partition it was not given (_INVALID_ARG), as
        # a replica's is while it restores in bulk or once it failed.
        self._assigned: set[tuple[str, int]] = set()

    def open(self, consumer: Any) -> None:
        """Fetch with ``consumer`` from now on."""
        self._consumer = consumer
        self._assigned.clear()

    def start(self, reps: list[Replica]) -> None:
        """Fetch the changelogs of ``reps`` from their checkpoints: empty stores in bulk, the others by the consumer."""
        rest = self._bulk.start(reps) if self._bulk is not None else reps
        if rest:
            self._assign(rest)

    def resume(self, rep: Replica) -> None:
        """Fetch ``rep``'s changelog by the consumer, from its checkpoint."""
        self._assign([rep])

    def _assign(self, reps: list[Replica]) -> None:
        self._consumer.incremental_assign([_from_checkpoint(rep) for rep in reps])
        self._assigned.update((rep.topic, rep.partition) for rep in reps)

    def reread(self, rep: Replica) -> None:
        """Fetch again, from the checkpoint, the staged window ``rep`` dropped for holding poison."""
        log.debug("replica %s/%d: its staged changes up to offset %d hold poison; reading them again from %d",
                  rep.table, rep.partition, rep.check_until, rep.lag.applied)
        self.stop(rep)
        self.resume(rep)
        rep.reread = False  # only once assigned: a failed assignment is retried after the next poll

    def stop(self, rep: Replica) -> None:
        """Stop fetching ``rep``'s changelog, in bulk or by the consumer, whichever does; a failure is logged."""
        self.cancel_bulk(rep)
        if (rep.topic, rep.partition) not in self._assigned:
            return
        self._assigned.discard((rep.topic, rep.partition))
        try:
            self._consumer.incremental_unassign([TopicPartition(rep.topic, rep.partition)])
        except KafkaException as e:
            log.warning("unassigning %s/%d failed: %s", rep.topic, rep.partition, e)

    def cancel_bulk(self, rep: Replica) -> None:
        """Stop restoring ``rep`` in bulk, if it was."""
        if self._bulk is not None:
            self._bulk.cancel(rep)

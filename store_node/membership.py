"""A node's life in the cluster: heartbeats, the assignor lease, and following the assignment.

One thread, one loop against Redis. Redis holds only soft state, so an outage changes
nothing the node does: it keeps serving its replicas under the last assignment it read and
retries quietly — one log line when the outage starts and one when it ends.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from redis.exceptions import RedisError

from freshroute.metadata import Assignment, MetadataStore, NodeReport, ReplicaReport, Role, TableSpec, now_ms
from store_node.assignor import AssignorLoop
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)

ReplicaKey = tuple[str, int]


def desired_replicas(assignment: Assignment, tables: dict[str, TableSpec],
                     node_id: str) -> dict[ReplicaKey, tuple[TableSpec, Role]]:
    """This node's replicas in ``assignment``, for tables whose spec is known."""
    out = {}
    for key, role in assignment.hosted_by(node_id).items():
        spec = tables.get(key[0])
        if spec is not None and 0 <= key[1] < spec.partitions:
            out[key] = (spec, role)
    return out


class Membership:
    """Publishes this node's heartbeat, runs the assignor loop, and hands the assignment to the node."""

    def __init__(self, settings: StoreNodeSettings, metadata: MetadataStore, address: str,
                 replicas: Callable[[int], tuple[ReplicaReport, ...]],
                 follow: Callable[[dict[ReplicaKey, tuple[TableSpec, Role]]], None],
                 clock: Callable[[], int] = now_ms, read_address: str | None = None) -> None:
        self._settings = settings
        self._metadata = metadata
        self._address = address
        self._read_address = read_address
        self._replicas = replicas
        self._follow = follow
        self._clock = clock
        self.assignor = AssignorLoop(metadata, settings.node_id, settings.assignor_lease_ms,
                                     settings.node_expiry_ms, settings.caught_up_threshold)
        self._beat_at: int | None = None
        self.draining = False
        self.assignment: Assignment | None = None
        self._outage_since: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.tick()  # announce the node before serving starts to matter
        self._thread = threading.Thread(target=self._run, name="membership", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # The assignment is polled (and the assignor steps) more often than the node heartbeats:
        # a failover is decided and followed within a poll period of a heartbeat expiring.
        period = min(self._settings.heartbeat_ms, self._settings.assignment_poll_ms) / 1000
        while not self._stop.wait(period):
            self.tick()

    def report(self) -> NodeReport:
        now = self._clock()
        return NodeReport(self._settings.node_id, self._address, now, self._replicas(now),
                          self._settings.rack, self.draining, self._read_address)

    def tick(self) -> None:
        """One round: heartbeat, assignor, read the assignment. Never raises for a Redis outage."""
        try:
            now = self._clock()
            # Half a poll period early rather than a whole one late: the loop wakes once per poll.
            due = self._settings.heartbeat_ms - self._settings.assignment_poll_ms // 2
            if self._beat_at is None or now - self._beat_at >= due or self.draining:
                self._metadata.publish_node(self.report(), self._settings.node_report_ttl_ms)
                self._beat_at = now
            if not self.draining:
                self.assignor.step(self._clock())
            tables = self._metadata.tables()
            assignment = self._metadata.assignment()
        except RedisError as e:
            self.assignor.forget()
            self._beat_at = None  # publish again as soon as Redis answers
            if self._outage_since is None:
                self._outage_since = self._clock()
                log.warning("metadata store (Redis) unreachable: %s; serving under the last assignment "
                            "(generation %s) and retrying quietly",
                            e, self.assignment.generation if self.assignment else "none")
            return
        except Exception:
            log.exception("membership round failed")
            return
        if self._outage_since is not None:
            log.info("metadata store (Redis) reachable again after %.1fs", (self._clock() - self._outage_since) / 1000)
            self._outage_since = None
        if assignment is not None and tables:
            # No tables at all means the registry was lost with Redis (the pipeline re-registers
            # them): keep the replicas rather than drop every one.
            self.assignment = assignment
            self._follow(desired_replicas(assignment, tables, self._settings.node_id))

    def drain(self) -> None:
        """Announce draining: the assignor moves this node's replicas away, routers stop sending reads."""
        self.draining = True
        try:
            self.assignor.release()
        except RedisError:
            pass
        self.tick()

    def stop(self) -> None:
        """Stop the loop and leave the cluster so that the assignor reacts at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self.assignor.release()
            self._metadata.remove_node(self._settings.node_id)
        except RedisError as e:
            log.warning("could not deregister from the metadata store: %s", e)

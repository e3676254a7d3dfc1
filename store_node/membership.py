"""A node's life in the cluster: heartbeats, the assignor lease, and following the assignment.

One thread, one loop against Redis. Redis holds only soft state, so an outage changes
nothing the node does: it keeps serving its replicas under the last assignment it read and
retries quietly — one log line when the outage starts and one when it ends.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from enum import Enum
from typing import Callable, Mapping, Sequence

from redis.exceptions import RedisError

from freshroute.lag import now_ms
from freshroute.metadata.reports import NodePositions, NodeReport, ReplicaReport
from freshroute.metadata.roles import Role
from freshroute.metadata.rounds import Round, RoundRequest
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.tables import TableSpec
from store_node.assignor import AssignorLoop
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)

ReplicaKey = tuple[str, int]
Desired = dict[ReplicaKey, tuple[TableSpec, Role]]


def desired_replicas(hosted: Mapping[ReplicaKey, Role], tables: dict[str, TableSpec]) -> Desired:
    """This node's replicas in its placement, for tables whose spec is known."""
    out = {}
    for key, role in hosted.items():
        spec = tables.get(key[0])
        if spec is not None and 0 <= key[1] < spec.partitions:
            out[key] = (spec, role)
    return out


class News(Enum):
    """What a node's latest report tells readers that the one they know does not."""

    NONE = "none"
    POSITIONS = "positions"  # only replicas' positions moved: they go out alone (NodePositions)
    REPORT = "report"  # the report's shape changed: it goes out whole


def news(before: NodeReport | None, now: NodeReport, slack_ms: int, caught_up: int) -> News:
    """Whether ``now`` tells readers something ``before`` (the report as they know it) does not,
    and how much.

    The shape is everything but positions — addresses, the replicas, their roles and states —
    and each replica's warmth (within ``caught_up`` offsets of its end), which the assignor
    decides on and reads only from reports. Positions that moved are news: routers judge
    read-your-writes bounds on them. Readers extrapolate a lagging replica's staleness by the
    report's age, so staleness that grew as time passed is no news; ``slack_ms`` is how far off
    that extrapolation may be.
    """
    if before is None or (before.address, before.read_address, before.rack, before.draining) != \
            (now.address, now.read_address, now.rack, now.draining) or len(before.replicas) != len(now.replicas):
        return News.REPORT
    elapsed = now.heartbeat_ms - before.heartbeat_ms
    moved = False
    for a, b in zip(before.replicas, now.replicas):
        if (a.table, a.partition, a.role, a.state) != (b.table, b.partition, b.role, b.state) or \
                a.within(caught_up) != b.within(caught_up):
            return News.REPORT
        moved = moved or (a.applied, a.end) != (b.applied, b.end) or (a.staleness_ms == 0) != (b.staleness_ms == 0) \
            or bool(b.staleness_ms and abs(b.staleness_ms - a.staleness_ms - elapsed) > slack_ms)
    return News.POSITIONS if moved else News.NONE


class Membership:
    """Publishes this node's heartbeat, runs the assignor loop, and hands the assignment to the node.

    One round trip per round: the beat (with the report only when it changed), the lease,
    and the versions of the tables and the assignment. The node reads its own placement
    only when the assignment's version changed.
    """

    def __init__(self, settings: StoreNodeSettings, metadata: MetadataStore, address: str,
                 replicas: Callable[[int], tuple[ReplicaReport, ...]],
                 follow: Callable[[Desired], None],
                 clock: Callable[[], int] = now_ms, read_address: str | None = None) -> None:
        self._settings = settings
        self._metadata = metadata
        self._address = address
        self._read_address = read_address
        self._replicas = replicas
        self._follow = follow
        self._clock = clock
        self.assignor = AssignorLoop(metadata, settings.node_id, settings.assignor_lease_ms,
                                     settings.node_expiry_ms, settings.caught_up_threshold,
                                     forget_after_ms=settings.node_report_ttl_ms)
        self._beat_at: int | None = None
        self._published: NodeReport | None = None  # the report as readers know it
        self._report_ms = 0  # the last whole report's time: positions published since belong to it
        self.draining = False
        self._tables: tuple[bytes | None, dict[str, TableSpec]] | None = None
        self._placement: tuple[bytes | None, dict[ReplicaKey, Role] | None] | None = None
        self.desired: Desired | None = None  # what the last assignment read asks of this node
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

    @property
    def tables(self) -> Mapping[str, TableSpec]:
        """The table specs as this node last read them."""
        return self._tables[1] if self._tables is not None else {}

    @property
    def holds_lease(self) -> bool:
        """Whether this node is the assignor lease holder."""
        return self.assignor.generation is not None

    def report(self, now: int | None = None) -> NodeReport:
        now = self._clock() if now is None else now
        return NodeReport(self._settings.node_id, self._address, now, self._replicas(now),
                          self._settings.rack, self.draining, self._read_address)

    def tick(self) -> None:
        """One round: heartbeat, assignor, follow the assignment. Never raises for a Redis outage."""
        Membership.tick_together([self])

    @staticmethod
    def tick_together(members: Sequence["Membership"]) -> None:
        """The rounds of nodes sharing one metadata store, in one round trip to Redis; each node
        then follows its own assignment. A node is a group of one; the scale simulator runs
        hundreds of nodes per process."""
        if not members:
            return
        try:
            begun = [m._begin_round() for m in members]
            found = members[0]._metadata.rounds([request for request, _ in begun])
        except RedisError as e:
            for m in members:
                m._unreachable(e)
            return
        except Exception:
            log.exception("membership round failed")
            return
        for m, (request, report), f in zip(members, begun, found):
            m._finish_round(request, report, f)

    def _begin_round(self) -> tuple[RoundRequest, NodeReport | None]:
        """This round's beat (with the report when it tells readers something new), and the report built."""
        settings = self._settings
        now = self._clock()
        # Half a poll period early rather than a whole one late: the loop wakes once per poll.
        due = settings.heartbeat_ms - settings.assignment_poll_ms // 2
        beat = self._beat_at is None or now - self._beat_at >= due or self.draining
        report = self.report(now) if beat else None
        told = news(self._published, report, settings.heartbeat_ms, settings.caught_up_threshold) \
            if report is not None else News.NONE
        request = RoundRequest(settings.node_id, now if beat else None, settings.node_report_ttl_ms,
                               report.to_json() if report is not None and told is News.REPORT else None,
                               NodePositions.of(report, self._report_ms).to_bytes()
                               if report is not None and told is News.POSITIONS else None)
        return request, report

    def _finish_round(self, request: RoundRequest, report: NodeReport | None, found: Round) -> None:
        try:
            if request.beat_ms is not None:
                self._beat_at = request.beat_ms
                if request.report is not None and report is not None:
                    self._published = report
                    self._report_ms = report.heartbeat_ms
                elif not found.report_held:
                    self._published = None  # Redis lost it: the next round publishes it whole
                    self._beat_at = None
                elif request.positions is not None:
                    self._published = report
            if not self.draining and self.assignor.step(self._clock(), found.lease) is not None:
                # Written just now: this node follows it at once, not a round later.
                found = replace(found, assignment_version=self.assignor.assignment_version)
            desired = self._read_assignment(found)
        except RedisError as e:
            self._unreachable(e)
            return
        except Exception:
            log.exception("membership round failed")
            return
        if self._outage_since is not None:
            log.info("metadata store (Redis) reachable again after %.1fs", (self._clock() - self._outage_since) / 1000)
            self._outage_since = None
        if desired is not None:
            self.desired = desired
            self._follow(desired)

    def _unreachable(self, e: RedisError) -> None:
        self.assignor.forget()
        self._beat_at = None  # publish again as soon as Redis answers
        self._published = None
        if self._outage_since is None:
            self._outage_since = self._clock()
            log.warning("metadata store (Redis) unreachable: %s; serving under the last assignment read "
                        "and retrying quietly", e)

    def _read_assignment(self, found: Round) -> Desired | None:
        """This node's replicas, re-read when the tables or the assignment changed; None: keep the current ones."""
        changed = False
        if self._tables is None or self._tables[0] != found.tables_version:
            self._tables = (found.tables_version, self._metadata.tables())
            changed = True
        if self._placement is None or self._placement[0] != found.assignment_version:
            self._placement = (found.assignment_version, self._metadata.placement(self._settings.node_id))
            changed = True
        tables, placement = self._tables[1], self._placement[1]
        if placement is None or not tables:
            # No assignment, or no tables at all: the registry was lost with Redis (the pipeline
            # and the assignor write them again). Keep the replicas rather than drop every one.
            return None
        if changed or self.desired is None:
            return desired_replicas(placement, tables)
        return self.desired

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

"""The assignor: the loop every store node runs, in which only the holder of the assignor lease (a Redis key with a
fencing generation) computes who hosts what (store_node/placement) and writes it, through a write that fails once the
lease is lost.
"""

from __future__ import annotations

import gc
import logging
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping, Protocol

from freshroute.heartbeats import Liveness, NodeFeed, Rejections
from freshroute.metadata.assignment import Assignment
from freshroute.metadata.reports import NodeReport
from freshroute.metadata.rounds import UNREAD
from freshroute.metadata.tables import TableSpec
from store_node.placement.assign import assign, repair

log = logging.getLogger(__name__)


class AssignorStore(Protocol):
    """The slice of :class:`freshroute.metadata.store.MetadataStore` the assignor loop needs."""

    def try_acquire_assignor(self, node_id: str, lease_ms: int, current: Any = UNREAD) -> int | None: ...
    def versions(self) -> tuple[bytes | None, bytes | None]: ...
    def tables(self) -> dict[str, TableSpec]: ...
    def poll(self, feed: NodeFeed) -> set[str]: ...
    def assignment(self) -> Assignment | None: ...
    def write_assignment(self, assignment: Assignment, node_id: str, generation: int,
                         previous: Assignment | None = None) -> bytes | None: ...
    def forget_nodes(self, node_ids: Iterable[str]) -> None: ...
    def release_assignor(self, node_id: str, generation: int) -> None: ...


class AssignorLoop:
    """Run by every node: takes the lease when it is free; the holder keeps the assignment current.

    A node is dead when it has not been heard from for ``node_expiry_ms``. The holder never
    judges itself (it is running), and never judges others right after it was itself
    stalled (a loaded machine, a paused process): heartbeats it could not read meanwhile
    are not evidence, so after a gap of more than ``stall_ms`` between two steps every node
    gets a full expiry period, counted from the resumption, to be heard from again.

    The holder reads only the reports that changed, and recomputes only when something the
    assignment depends on did: who is live, draining or where, which replicas each node
    hosts in which role and state and whether they are warm, the tables, or the assignment
    itself. A quiet cluster of a thousand nodes costs it a poll, not an assignment.
    """

    def __init__(self, store: AssignorStore, node_id: str, lease_ms: int, node_expiry_ms: int,
                 caught_up_threshold: int, settle_ms: int | None = None, stall_ms: int | None = None,
                 forget_after_ms: int | None = None) -> None:
        self._store = store
        self._node_id = node_id
        self._lease_ms = lease_ms
        self._expiry_ms = node_expiry_ms
        self._threshold = caught_up_threshold
        # With no assignment to start from (a new cluster, or Redis lost it) wait this long after
        # taking the lease, so that every live node has heartbeated: placing everything on the
        # first node seen would move it all again a moment later.
        self._settle_ms = node_expiry_ms if settle_ms is None else settle_ms
        self._stall_ms = max(1, node_expiry_ms // 2) if stall_ms is None else stall_ms
        # Nodes silent this long are removed from the cluster's membership altogether.
        self._forget_after_ms = 4 * node_expiry_ms if forget_after_ms is None else forget_after_ms
        self._acquired_at = 0
        self._last_step_ms: int | None = None
        self._resumed_at = 0
        self.generation: int | None = None
        self.computations = 0  # assignments computed: a quiet cluster adds none
        self.repairs = 0  # repairs published (see repair)
        self.feed = NodeFeed(Rejections(f"assignor on {node_id}"))
        self.liveness = Liveness()
        self._forget()

    def _forget(self) -> None:
        self._tables: tuple[bytes | None, dict[str, TableSpec]] | None = None
        self._previous: tuple[bytes | None, Assignment | None] | None = None
        self._judged: dict[str, tuple] = {}  # node → what the assignment depends on, as last computed
        self._computed_for: tuple | None = None

    def step(self, now_ms: int, lease: Any = UNREAD) -> Assignment | None:
        """Hold or take the lease; if held, recompute and write when the inputs changed. Returns what it wrote.

        ``lease`` is the lease's value if the caller has just read it."""
        last, self._last_step_ms = self._last_step_ms, now_ms
        if last is not None and now_ms - last > self._stall_ms:
            self._resumed_at = now_ms
            log.warning("node %s: membership stalled for %.1fs; no node is declared dead until it has had %.1fs "
                        "to heartbeat", self._node_id, (now_ms - last) / 1000, self._expiry_ms / 1000)
        try:
            return self._step(now_ms, lease)
        except BaseException:
            self.forget()
            raise

    @property
    def assignment_version(self) -> bytes | None:
        """The version of the assignment this loop last read or wrote."""
        return self._previous[0] if self._previous is not None else None

    def live(self, now_ms: int) -> list[NodeReport]:
        """Nodes heard from recently enough (measured from this loop's resumption), and this node."""
        since, heard = self._resumed_at, self.liveness.heard
        return [r for n, r in sorted(self.feed.reports.items())
                if n == self._node_id or (n in heard and now_ms - max(heard[n], since) <= self._expiry_ms)]

    def forget(self) -> None:
        """Redis failed: whatever lease comes back afterwards is a new one (a restarted, empty Redis
        hands out generation numbers from 1 again, and lost the assignment this one was based on)."""
        self.generation = None
        self._forget()

    def _step(self, now_ms: int, lease: Any) -> Assignment | None:
        generation = self._store.try_acquire_assignor(self._node_id, self._lease_ms, lease)
        if generation != self.generation:
            if generation is not None:
                self._acquired_at = now_ms
                log.info("node %s holds the assignor lease (generation %d)", self._node_id, generation)
            elif self.generation is not None:
                log.info("node %s lost the assignor lease (generation %d)", self._node_id, self.generation)
            self.generation = generation
            self._forget()
        if generation is None:
            return None
        tables_version, assignment_version = self._store.versions()
        if self._tables is None or self._tables[0] != tables_version:
            self._tables = (tables_version, self._store.tables())
        tables = self._tables[1]
        if not tables:
            # Nothing registered (yet, or Redis lost it until the pipeline re-registers): an empty
            # assignment would only tell every node to drop its replicas.
            return None
        if self._previous is None or self._previous[0] != assignment_version:
            self._previous = (assignment_version, self._store.assignment())
        previous = self._previous[1]
        if previous is None and now_ms - self._acquired_at < self._settle_ms:
            return None
        self._store.poll(self.feed)
        self.liveness.observe(self.feed.beats, now_ms)
        self._tidy(now_ms)
        live = self.live(now_ms)
        inputs = (tables_version, assignment_version, tuple((r.node_id, self._depends_on(r)) for r in live))
        if inputs == self._computed_for:
            return None
        self._computed_for = inputs
        self.computations += 1
        with _cycle_collection_paused():
            # Nodes died: publish their partitions' promotions and new replicas first, balance next step.
            proposed = repair(tables, live, previous, generation, self._threshold) if previous is not None else None
            repaired = proposed is not None
            if proposed is None:
                proposed = assign(tables, live, previous, generation, self._threshold)
            if previous is not None and previous.replicas == proposed.replicas:
                return None
            version = self._store.write_assignment(proposed, self._node_id, generation, previous)
        if version is None:
            log.info("node %s: assignment write fenced off (generation %d is no longer the lease)",
                     self._node_id, generation)
            self.generation = None
            return None
        self._previous = (version, proposed)
        self._computed_for = None if repaired else (tables_version, version, inputs[2])
        nodes = len({r.node_id for r in live if not r.draining})
        if repaired:
            self.repairs += 1
            log.info("assignment generation %d: dead nodes' partitions repaired, %d replica placements changed%s",
                     generation, _moves(previous, proposed),
                     _membership_change(previous, live, self.feed.reports, self.liveness, now_ms))
        elif previous is None:
            log.info("assignment generation %d: %d table-partitions on %d live nodes (no previous assignment: "
                     "built from what the nodes report hosting)", generation, len(proposed.replicas), nodes)
        else:
            log.info("assignment generation %d: %d table-partitions on %d live nodes; %d replica placements changed%s",
                     generation, len(proposed.replicas), nodes, _moves(previous, proposed),
                     _membership_change(previous, live, self.feed.reports, self.liveness, now_ms))
        return proposed

    def _depends_on(self, report: NodeReport) -> tuple:
        """What the assignment reads from a node's report: not its positions, only roles, states and warmth."""
        judged = self._judged.get(report.node_id)
        if judged is not None and judged[0] is report:
            return judged[1]
        threshold = self._threshold
        key = (report.draining, report.rack,
               tuple((r.table, r.partition, r.role, r.state, r.within(threshold)) for r in report.replicas))
        self._judged[report.node_id] = (report, key)
        return key

    def _tidy(self, now_ms: int) -> None:
        """Remove nodes silent for longer than any heartbeat lives: they are gone, not just dead."""
        since = max(self._resumed_at, self._acquired_at)
        gone = [n for n, heard in self.liveness.heard.items()
                if n != self._node_id and now_ms - max(heard, since) > self._forget_after_ms]
        if gone:
            self._store.forget_nodes(gone)
            for n in gone:
                self._judged.pop(n, None)

    def release(self) -> None:
        if self.generation is not None:
            self._store.release_assignor(self._node_id, self.generation)
            self.generation = None


@contextmanager
def _cycle_collection_paused() -> Iterator[None]:
    """No cycle collection while an assignment is computed: it allocates hundreds of thousands of
    objects that reference counting frees, and at a thousand nodes each full collection it would
    trigger walks the node's whole heap (tens of ms) while dead nodes' actives wait."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _membership_change(previous: Assignment, live: list[NodeReport], reports: Mapping[str, NodeReport],
                       liveness: Liveness, now_ms: int) -> str:
    """Why placements changed, for the operator: nodes that joined, and nodes that left and why."""
    serving = {r.node_id for r in live if not r.draining}
    before = {n for ns in previous.replicas.values() for n in ns}
    parts = []
    joined = sorted(serving - before)
    if joined:
        parts.append("joined: " + ", ".join(joined))
    left = []
    for n in sorted(before - serving):
        r = reports.get(n)
        if r is None:
            left.append(f"{n} (left the cluster)")
        elif r.draining:
            left.append(f"{n} (draining)")
        else:
            left.append(f"{n} (dead: last heartbeat {(liveness.age(n, now_ms) or 0) / 1000:.1f}s ago)")
    if left:
        parts.append("left: " + ", ".join(left))
    return "; " + "; ".join(parts) if parts else ""


def _moves(before: Assignment | None, after: Assignment) -> int:
    """Replica placements (partition, node, role) that differ between two assignments."""
    b = before.replicas if before is not None else {}
    moves = 0
    for k in after.differing(before):
        x, y = b.get(k, ()), after.replicas.get(k, ())
        moves += len({(n, i == 0) for i, n in enumerate(x)} ^ {(n, i == 0) for i, n in enumerate(y)})
    return moves

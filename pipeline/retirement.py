"""A table version retired: once a previous version's time for a rollback is over, its query stops, its table spec
goes (store nodes let its replicas go, and delete their files after their grace), its checkpoint is deleted, and so is
its changelog — a little later, once store nodes have stopped reading it.

A version whose query computes other tables as well (a Real-time query a source's tables share, ``pipeline.fusion``,
or ``query=`` in the tables file) cannot stop alone: that query's checkpoint holds its state with theirs. It is
retired all the same — its spec goes, and its changelog — and the pipeline starts its queries again, in-process, so
that the shared query computes it as a *ghost* (:mod:`pipeline.versions`): by the definition it was built with, its
state kept, its rows written nowhere, until that query starts afresh. A changelog whose deletion a pipeline stopped
before is deleted by the next start.
A version held as it stands (``pipeline.versions``) has no query running: its query's checkpoint goes with the last
version that query computed.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from typing import Any, Callable

from freshroute.metadata.table_versions import physical_name
from pipeline.logs import first_line

log = logging.getLogger("pipeline")

TOPIC_DELETE_AFTER_S = 30.0  # store nodes stop reading a table's changelog within an assignment round of its removal


class Retirement:
    """Retires the versions a pipeline runs (called from the registrar's thread)."""

    def __init__(self, queries: dict[str, Any], runs: dict[str, Any], checkpoint: Callable[[str], Any],
                 changelog_topic: Callable[[str], str], admin: Callable[[], Any],
                 held: dict[str, str] | None = None, restart: threading.Event | None = None) -> None:
        """``queries``/``runs``: the pipeline's, by name; ``checkpoint``: a query's checkpoint directory;
        ``changelog_topic``: a table's changelog; ``admin``: a Kafka admin client; ``held``: the versions held as
        they stand, each with the query that computed it; ``restart``: set to have the pipeline start its queries
        again, once a version that shares its query is retired."""
        self.queries = queries
        self.held = dict(held or {})
        self.runs = runs
        self.checkpoint = checkpoint
        self.changelog_topic = changelog_topic
        self.admin = admin
        self._lock = threading.Lock()
        self._topics: list[tuple[float, str]] = []  # (when, topic) of changelogs to delete
        self.restart = restart
        self._restart_due = False  # a version left in its shared query: the queries start again after this round

    def stop(self, table: str, version: int) -> bool:
        """Stop the query of version ``version`` of ``table`` and let go of what it wrote; whether it is retired
        (always, now: one that shares its query goes on there as a ghost once the queries start again)."""
        physical = physical_name(table, version)
        with self._lock:
            q = next((q for q in self.queries.values() if any(t.name == physical for t in q.tables)), None)
            shared = q is not None and [t.name for t in q.tables] != [physical]
            if q is not None and not shared:
                q.finished = True  # the supervising loop restarts it no more
                if q.query is not None and q.query.isActive:
                    q.query.stop()
                self.queries.pop(q.name, None)
            run = self.runs.pop(physical, None)
            if run is not None and run.writer.expiry is not None:
                run.writer.expiry.close()
            if shared:
                self._restart_due = True  # its query keeps its state, and is started again computing it as a ghost
            else:
                query = q.name if q is not None else self.held.pop(physical, physical)
                if query not in self.held.values():  # else another version held still has its state there
                    shutil.rmtree(self.checkpoint(query), ignore_errors=True)
            self._delete_later(self.changelog_topic(physical))
        if q is not None and shared:
            log.info("table %s: version %d retired: query %s computes it with %s, and goes on computing it for its "
                     "state only, written nowhere, once the queries start again; its changelog %s goes in %.0f s",
                     table, version, q.name, ", ".join(t.name for t in q.tables if t.name != physical),
                     self.changelog_topic(physical), TOPIC_DELETE_AFTER_S)
        else:
            log.info("table %s: version %d retired: its query stopped, its checkpoint deleted; its changelog %s goes "
                     "in %.0f s", table, version, self.changelog_topic(physical), TOPIC_DELETE_AFTER_S)
        return True

    def delete_later(self, topic: str) -> None:
        """Delete ``topic``, the changelog of a retired version, in :data:`TOPIC_DELETE_AFTER_S`."""
        with self._lock:
            self._delete_later(topic)

    def _delete_later(self, topic: str) -> None:
        if all(t != topic for _, t in self._topics):
            self._topics.append((time.monotonic() + TOPIC_DELETE_AFTER_S, topic))

    def restart_if_due(self) -> None:
        """Have the pipeline start its queries again if a version retired this round shares its query: called once
        its retirement is recorded, so that the next start plans it as a ghost."""
        with self._lock:
            due, self._restart_due = self._restart_due, False
        if due and self.restart is not None:
            self.restart.set()

    def delete_due(self) -> None:
        """Delete the changelogs of retired versions whose time has come."""
        now = time.monotonic()
        with self._lock:
            due = [topic for at, topic in self._topics if at <= now]
            self._topics = [(at, topic) for at, topic in self._topics if at > now]
        if not due:
            return
        admin = self.admin()  # held until its futures are done: a client let go ends its requests
        for topic, future in admin.delete_topics(due, operation_timeout=30).items():
            try:
                future.result(30)
                log.info("changelog %s of a retired table version deleted", topic)
            except Exception as e:  # the broker away: tried again at the next round
                if "UNKNOWN_TOPIC" in str(e):
                    continue  # gone already
                log.warning("deleting the changelog %s of a retired table version failed (%s): trying again",
                            topic, first_line(str(e)))
                with self._lock:
                    self._topics.append((time.monotonic() + TOPIC_DELETE_AFTER_S, topic))

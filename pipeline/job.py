"""The pipeline process: one Spark session, a streaming query per table or group of tables, supervised.

A table runs in Spark's Real-time Mode (:mod:`pipeline.realtime_query`: long-running tasks, each change written by
Spark's Kafka sink within milliseconds) or in micro-batches (:mod:`pipeline.microbatch_query`, for shapes Real-time
Mode refuses), as the pipeline's ``pipeline_mode`` or the table says. The Real-time tables of a source share one
query, which parses each record once and computes them in one aggregation (:mod:`pipeline.fusion`); a micro-batch
table runs in its own query, or in one it shares with other tables of its source (``query=`` in the tables file):
one read of the input, one plan and one checkpoint per trigger for all of them. A query's
checkpoint (``checkpoint_dir/<query>``) holds its offsets, commits and RocksDB state. A query that fails
is restarted from its checkpoint (which replays the failed batch) a bounded number of times; lost input
data is not retried, it stops the pipeline with a message saying what happened (:mod:`pipeline.failures`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from freshroute.errors import FreshrouteError
from freshroute.lag import now_ms
from freshroute.metadata.deploys import Deploys
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.table_versions import VersionState, logical_of
from freshroute.metadata.tables import TableSpec
from freshroute.metadata.version_store import TableVersionStore
from pipeline import definitions, version_mirror
from pipeline.checkpoints import (check_changelog_kept, check_query_tables, recorded_tables, resumable,
                                  retire_superseded)
from pipeline.failures import restart_delay
from pipeline.follower import follow
from pipeline.deploys import DeployWatcher, Taken
from pipeline.input_held import held_input
from pipeline.input_lag import InputLagPublisher
from pipeline.logs import WARM_LOG, configure_logging, first_line, log_progress
from pipeline.microbatch_query import MicrobatchQuery, rejects_query
from pipeline.outputs import TableRun, reject_writer, windows_progress
from pipeline.query import Query, QueryContext
from pipeline.realtime_query import RealtimeQuery, RealtimeRejectsQuery
from pipeline.reflected import ReflectionPublisher
from pipeline.registrar import TableRegistrar
from pipeline.retirement import Retirement
from pipeline.session import build_session, check_spark_master
from pipeline.settings import PipelineSettings
from pipeline.sink import ChangelogProducer
from pipeline.sources import check_inputs
from pipeline.tables import MICROBATCH, REALTIME, Table, TablesDefinition
from pipeline.tables_file import check_modes, load_tables, queries
from pipeline.versions import Planner, VersionPlan, record_failure

log = logging.getLogger("pipeline")

MAX_STARTS = 100_000  # starts of one process: one, and one more after each deploy

# One kind of query per mode.
QUERY_KINDS = {REALTIME: RealtimeQuery, MICROBATCH: MicrobatchQuery}


class Pipeline:
    """Wires tables → queries → changelog writers; :func:`run` drives it."""

    def __init__(self, settings: PipelineSettings, definition: TablesDefinition | None = None) -> None:
        self.settings = settings
        self.definition = definition or load_tables(settings.tables_file)
        self.producer = ChangelogProducer(settings.kafka())
        self.context = QueryContext(settings, self.definition, self.producer)
        self.runs: dict[str, TableRun] = {}
        self.queries: dict[str, Query] = {}
        self._stop = threading.Event()
        self._registrar: TableRegistrar | None = None
        self._versions: TableVersionStore | None = None
        self.plan = VersionPlan(self.definition)  # the versions of its tables it runs, once started
        self._recomputed: set[str] = set()  # tables whose queries start without a checkpoint
        self._failed: dict[str, str] = {}  # table → why the version of it begun or kept beside failed
        self._deploys = Taken(None)  # the deploys taken at the start
        self._watcher: DeployWatcher | None = None
        self._warm = False
        # Set by a retirement that leaves a version in its shared query, to run it there as a ghost.
        self.restart = threading.Event()

    # start
    def start(self) -> None:
        from freshroute.topics import describe_topic
        from pipeline.topics import admin_client, check_replication

        s, c = self.settings, self.context
        admin = admin_client(s.kafka())
        check_replication(admin, s.changelog_replication_factor, s.bootstrap_servers)
        store = MetadataStore.at(s.redis(), s.namespace)
        self._versions = TableVersionStore(store.redis, s.namespace)
        digest = definitions.keep(s.checkpoint_dir, self.definition.path)
        deploys = self._deploys.deploys = Deploys(store.redis, s.namespace)
        self._deploys.take(self.definition, s.checkpoint_dir)
        self.plan = self._plan(self._versions, digest)
        self.definition = c.definition = self.plan.definition
        c.beside, c.ghosts = self.plan.beside, self.plan.ghosts
        # Before Spark starts: a lost changelog or a changed query is known in milliseconds, not after the JVM's
        # warm-up.
        grouped = queries(self.definition, s.mode_of)
        check_modes(self.definition, s.mode_of)
        modes = {name: s.mode_of(tables[0]) for name, tables in grouped.items()}
        ghost_topics: list[str] = []  # the changelogs of retired versions a shared query still computes
        for name, tables in grouped.items():
            checkpoint, names = s.query_checkpoint(name), [t.name for t in tables]
            retired = retire_superseded(checkpoint, names, set(grouped))
            if retired:
                log.warning("query %s: computes %s, which earlier queries computed (their checkpoints, moved to %s, "
                            "hold state this query cannot resume): recomputing them from the input the broker still "
                            "holds; a store node skips each row older than the one it serves", name,
                            ", ".join(names), ", ".join(map(str, retired)))
            # First: a table new to the query has no changelog yet, which is not the broker's doing.
            check_query_tables(checkpoint, name, names)
            if not resumable(checkpoint):
                self._recomputed.update(names)
            for t in tables:
                topic = s.changelog_topic(t.name)
                exists = describe_topic(admin, topic) is not None
                if t.name in c.ghosts:
                    # Its retirement asked for it to go, in a pipeline since stopped: this one deletes it.
                    if exists:
                        ghost_topics.append(topic)
                    continue
                check_changelog_kept(topic, exists, checkpoint)
        check_inputs(s, self.definition, admin)
        self.queries = {name: QUERY_KINDS[modes[name]](c, name, tables) for name, tables in grouped.items()}
        for q in list(self.queries.values()):
            self._beside_or_fail(q, lambda: q.prepare(admin))
        used = {t.source for t in self.definition.tables.values()}
        c.input_partitions = {name: len(describe_topic(admin, s.input_topic(src.topic)).partitions)
                              for name, src in self.definition.sources.items() if name in used}
        # A source whose tables all run in Real-time Mode has a query of its own for its rejected records.
        for src in sorted(used):
            source = self.definition.sources[src]
            if rejects_query(s, self.definition, source, c.beside) is None and source.on_invalid != "skip":
                self.queries[f"{src}.rejected"] = RealtimeRejectsQuery(c, src)
        check_spark_master(s.spark_master)
        started = time.monotonic()
        c.microbatches = MICROBATCH in modes.values()
        c.spark = build_session(s, sum(q.most_slots() for q in self.queries.values()), microbatches=c.microbatches)
        log.info("spark session ready in %.1fs (master %s, %d shuffle partitions)",
                 time.monotonic() - started, c.spark.sparkContext.master, s.shuffle_partitions)
        rejects = {name: reject_writer(s, admin, self.definition.sources[name], self.producer) for name in sorted(used)}
        c.reflected = ReflectionPublisher(MetadataStore.at(s.redis(), s.namespace), lambda: admin_client(s.kafka()),
                                          self._stop, rejects.values())
        c.reflected.start()
        for q in list(self.queries.values()):
            if self._beside_or_fail(q, lambda: q.build(admin, rejects[q.source])):
                self.runs.update((r.table.name, r) for r in q.runs if not r.ghost)
        c.windowed_changelogs = [r.spec.topic for r in self.runs.values() if r.table.window]
        c.slots = sum(q.task_slots for q in self.queries.values())
        c.input_lag = InputLagPublisher(MetadataStore.at(s.redis(), s.namespace), self._stop, str(s.redis()),
                                        s.switch_lag)
        c.input_lag.start()
        # From where the topics of the queries it reads back end before they start: it misses none of their records.
        c.follower = follow(s, [(r, s.query_checkpoint(q.name)) for q in self.queries.values()
                                for r in q.runs_read_back()], list(rejects.values()), c.input_lag, self._stop)
        for q in list(self.queries.values()):
            self._beside_or_fail(q, q.start)
        admin.poll(0)  # the admin client's librdkafka log lines, queued while it worked, to the pipeline's log
        held = self._held_specs(store)
        retirement = Retirement(self.queries, self.runs, s.query_checkpoint, s.changelog_topic,
                                lambda: admin_client(s.kafka()), {h.name: h.query or h.name for h in held},
                                self.restart)
        for topic in ghost_topics:
            retirement.delete_later(topic)
        self._registrar = TableRegistrar(store, [r.spec for r in self.runs.values()] + held, self._stop, str(s.redis()),
                                         s.namespace, versions=self._versions, fingerprints=self.plan.fingerprints,
                                         recomputed=self._recomputed, definition=digest, mirror=s.checkpoint_dir,
                                         switch_lag=s.switch_lag if s.auto_switch else None,
                                         retain_ms=s.retain_previous_ms, proposed=self.plan.proposed,
                                         retirement=retirement, serving=self._serving())
        self._registrar.start()
        self._deploys.answer(self.plan, self._failed)
        self._watcher = DeployWatcher(deploys, self._stop, frozenset(self._deploys.seen))
        self._watcher.start()

    def _serving(self) -> dict[str, int]:
        """The version of each table the plan serves, computed or held."""
        return {v.table: v.version for v in [*self.plan.versions.values(), *self.plan.held.values()]
                if v.state is VersionState.SERVING}

    def _held_specs(self, store: MetadataStore) -> list[TableSpec]:
        """The specs of the served versions held as they stand (:mod:`pipeline.versions`), as an earlier run
        registered them: kept registered, so that store nodes go on serving their replicas."""
        if not self.plan.held:
            return []
        try:
            known = store.tables()
        except Exception as e:  # Redis away: it serves them by the specs it still has
            log.warning("Redis at %s is unavailable (%s): the specs of the versions held (%s) are not registered "
                        "again", self.settings.redis(), first_line(str(e)), ", ".join(self.plan.held))
            return []
        if lost := [p for p in self.plan.held if p not in known]:
            log.error("tables %s: held as they stand, but Redis has lost their specs: not served until the versions "
                      "built beside them are switched to", ", ".join(lost))
        return [known[p] for p in self.plan.held if p in known]

    def _plan(self, versions: TableVersionStore, digest: str) -> VersionPlan:
        """The versions of its tables to run: by their records in Redis, or as the pipeline kept them on disk when
        Redis cannot be read (a version then begins at a later start)."""
        s = self.settings
        records = version_mirror.saved(s.checkpoint_dir)
        try:
            records.update(versions.records())
        except Exception as e:  # Redis away: the stream does not depend on it
            log.warning("Redis at %s is unavailable (%s): the tables' versions are those the pipeline kept in %s",
                        s.redis(), first_line(str(e)), s.checkpoint_dir / version_mirror.MIRROR)
        query_of = {t.name: name for name, tables in queries(self.definition, s.mode_of).items() for t in tables}

        def resumes(physical: str) -> bool:
            table, version = logical_of(physical)
            return resumable(s.query_checkpoint(physical if version > 1 else query_of[table]))

        def shared(physical: str) -> Path | None:
            # A retired version's state stays in the checkpoint of a query it shared until that query starts afresh.
            table, version = logical_of(physical)
            query = physical if version > 1 else query_of.get(table)
            checkpoint = s.query_checkpoint(query) if query is not None else None
            tables = recorded_tables(checkpoint) if checkpoint is not None else None
            return checkpoint if tables and physical in tables and len(tables) > 1 and resumable(checkpoint) else None

        def mode(t: Table) -> str:
            # A run to the input's end in micro-batches computes the same table as the mode it asks for.
            return t.pipeline_mode or s.pipeline_mode

        planner = Planner(mode, resumes, lambda d: definitions.load(s.checkpoint_dir, d),
                          lambda table, fp, defined_in: versions.begin(table, fp, now_ms(), defined_in or digest),
                          versions.fail, self._expired, shared)
        return planner.plan(self.definition, records, self._deploys.definitions)

    def _expired(self, t: Table) -> str | None:
        """Why table ``t``'s input no longer goes back to its beginning on the broker (None: it does, or the broker
        cannot say now, and the version is built: the pipeline's own checks of its inputs come next)."""
        from confluent_kafka import Consumer

        s = self.settings
        topic = s.input_topic(self.definition.sources[t.source].topic)
        consumer = Consumer({**s.kafka(), "group.id": f"freshroute-pipeline-{s.namespace}-versions",
                             "enable.auto.commit": False})
        try:
            held = held_input(consumer, topic)
        except Exception as e:  # the broker away or the topic missing: said by check_inputs, which stops the start
            log.warning("table %s: how far back its input %s goes is not known (%s)", t.name, topic,
                        first_line(str(e)))
            return None
        finally:
            consumer.close()
        return held.refusal() if held.expired else None

    def _beside_or_fail(self, q: Query, step: Callable[[], Any]) -> bool:
        """Take a step of query ``q``; when it is a query of versions beside the served ones, a failure of the step
        fails those versions and drops the query, and the pipeline goes on. Whether the query is still there."""
        if not q.tables or not all(t.name in self.context.beside for t in q.tables):
            step()
            return True
        try:
            step()
            return True
        except FreshrouteError as e:  # the pipeline's own errors name the tables file and the table
            self._versions_failed(q, first_line(e.message))
        except Exception as e:
            self._versions_failed(q, f"tables file {self.settings.tables_file}, {q.label}: {first_line(str(e))}")
        return False

    def _versions_failed(self, q: Query, reason: str) -> None:
        """The versions query ``q`` builds or keeps failed: their records say why, and the query is dropped."""
        self.queries.pop(q.name, None)
        if q.query is not None and q.query.isActive:
            try:
                q.query.stop()
            except Exception as e:  # what stopped it is said below
                log.debug("%s: stopping it failed: %s", q.label, first_line(str(e)))
        for t in q.tables:
            v = self.plan.versions[t.name]
            if t.name in self.plan.ghosts:
                continue  # retired already: no failure to record
            self._failed[v.table] = reason
            if self._versions is not None:
                record_failure(self._versions.fail, v.table, v.version, reason)

    # run
    def wait(self, stop: threading.Event) -> bool:
        """Supervise the queries until ``stop`` is set, (available-now) every query is done, a deploy asks for a
        start with its new definition, or a retirement for one that computes the version it retired as a ghost: whether
        one does."""
        while not stop.is_set():
            if self._watcher is not None and self._watcher.due.is_set():
                return True
            if self.restart.is_set():
                log.info("a retired version shares its query with other tables: the queries start again, computing "
                         "it there for the query's state only")
                return True
            for q in list(self.queries.values()):
                if q.query is not None and not q.finished:
                    progress = q.query.lastProgress
                    seen = q.logged_batch
                    if log_progress(q, progress):
                        q.batch_ended(progress)
                        if q.windowed is not None:
                            windows_progress(q.windowed, progress, seen, q.query)
                if q.finished or q.query is None or q.query.isActive:
                    continue
                error = q.query.exception()
                if error is None:
                    q.finished = True
                    log.info("%s: caught up with its input, query finished", q.label)
                    continue
                self._beside_or_fail(q, lambda: self._restart_or_fail(q, str(error), stop))
            self._note_warmth()
            if self.queries and all(q.finished for q in self.queries.values()):
                return False
            if self.context.input_lag is not None:
                self.context.input_lag.running(r.table.name for q in self.queries.values()
                                               if q.query is not None and q.query.isActive for r in q.runs
                                               if not r.ghost)
            stop.wait(0.5)
        return False

    def _note_warmth(self) -> None:
        """Log :data:`WARM_LOG` once every query runs at its steady pace (:meth:`Query.warm`)."""
        if self._warm or not self.queries or not all(q.warm() for q in self.queries.values()):
            return
        self._warm = True
        # A pipeline that runs micro-batches is warm when they are (RealtimeQuery.warm).
        kind = MicrobatchQuery if self.context.microbatches else RealtimeQuery
        log.info("%s: %s", WARM_LOG, kind.WARM_REASON)

    def _restart_or_fail(self, q: Query, error: str, stop: threading.Event) -> None:
        """Start the failed query ``q`` again after a wait, unless the pipeline stops meanwhile or its failure says it
        must (:func:`pipeline.failures.restart_delay`)."""
        if not stop.wait(restart_delay(q, error, self.settings)):
            q.start()

    # stop
    def stop(self) -> None:
        """Stop every query (an interrupted batch is replayed on the next start), then the producer and Spark."""
        if self._stop.is_set():
            return  # stopped already
        self._stop.set()
        for q in self.queries.values():
            if q.query is not None:
                try:
                    q.query.stop()
                except Exception as e:  # stopping must go on for the other queries
                    log.warning("%s: stopping the query failed: %s", q.label, first_line(str(e)))
        self.producer.close()
        for run in self.runs.values():
            if run.writer.expiry is not None:
                run.writer.expiry.close()
        c = self.context
        if c.spark is not None:
            c.spark.stop()
            c.spark = None
        for thread in (self._registrar, c.input_lag, c.follower, c.reflected, self._watcher):
            if thread is not None:
                thread.join(timeout=5)


def run(settings: PipelineSettings) -> None:
    """Run the pipeline until SIGTERM/SIGINT (with ``available_now``: until the input present at start is done)."""
    configure_logging()
    stop = threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum: int, _frame: Any) -> None:
            if stop.is_set():
                # A second signal while stopping: the operator wants out now.
                os._exit(128 + signum)
            log.info("received %s: stopping the queries", signal.Signals(signum).name)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    current: list[Pipeline] = []  # the pipeline running: another after each deploy
    metrics: Any = None
    try:
        for _ in range(MAX_STARTS):
            pipeline = Pipeline(settings)
            current[:] = [pipeline]
            log.info("pipeline: %d table(s) from %s: %s", len(pipeline.definition.tables), pipeline.definition.path,
                     ", ".join(pipeline.definition.tables))
            pipeline.start()
            if settings.metrics_port is not None and metrics is None:
                from freshroute.prometheus import serve_metrics
                from pipeline.metrics import PipelineCollector

                metrics = serve_metrics(PipelineCollector(lambda: current[0].runs.values(),
                                                          lambda: [q.rejects for q in current[0].queries.values()
                                                                   if q.rejects is not None]),
                                        settings.metrics_host, settings.metrics_port)
                log.info("pipeline metrics on http://%s:%d/metrics", settings.metrics_host,
                         metrics.server_address[1])
            if not pipeline.wait(stop):
                break
            # A deploy or a retirement: the queries stop (a batch cut short is replayed) and start again with the
            # versions as they are now.
            pipeline.stop()
    except FreshrouteError as e:
        # The one line an operator needs, whatever the caller does with the exception.
        log.error("pipeline stopped: %s: %s", e.code, e.message)
        raise
    finally:
        if metrics is not None:
            metrics.shutdown()
        if current:
            current[0].stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("pipeline stopped")

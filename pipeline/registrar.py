"""The table specs kept in Redis, for store nodes and routers to find: registered at start, and again while Redis is
down or after it lost them; with each, its version record (freshroute.metadata.table_versions)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from freshroute.errors import TableVersionNotReady
from freshroute.lag import now_ms
from freshroute.metadata.table_versions import VersionState
from freshroute.metadata.tables import TableSpec
from freshroute.metadata.version_store import TableVersionStore
from freshroute.metadata.version_switch import switch
from pipeline import version_mirror
from pipeline.logs import first_line
from pipeline.retirement import Retirement

log = logging.getLogger("pipeline")

_REGISTER_EVERY_S = 10.0


class TableRegistrar(threading.Thread):
    """Keeps the table specs in Redis: retried while Redis is down, rewritten after it loses them.

    Redis holds soft state only, and the stream does not depend on it: a Redis outage
    costs store nodes and routers the news of a new table, never a micro-batch.
    """

    def __init__(self, store: Any, specs: list[TableSpec], stop: threading.Event, where: str, namespace: str,
                 every_s: float = _REGISTER_EVERY_S, versions: TableVersionStore | None = None,
                 fingerprints: dict[str, str] | None = None, recomputed: set[str] | None = None,
                 definition: str | None = None, mirror: Path | None = None, switch_lag: int | None = None,
                 retain_ms: int = 3_600_000, retirement: Retirement | None = None,
                 proposed: dict[str, str] | None = None, serving: dict[str, int] | None = None) -> None:
        """``fingerprints``: what each table's served version computes (pipeline.fingerprint), for its record in
        ``versions``; ``recomputed``: the tables whose queries started without a checkpoint, computed afresh from
        the input (by the names they run under); ``definition``: the digest of the tables file they are defined in, as pipeline.definitions keeps
        it; ``mirror``: the directory where their records are kept on disk as well (pipeline.version_mirror);
        ``switch_lag``: serve each version it builds once it is that close to its input (None: never by itself),
        keeping the one served until then ``retain_ms`` for a rollback; ``retirement``: stops a version whose time
        for a rollback is over (pipeline.retirement); ``proposed``: each table's fingerprint as the tables file
        defines it, which its record keeps for the next start (pipeline.versions); ``serving``: the version of each
        table served when the pipeline started, the one ``fingerprints`` speak of (None: whichever is served)."""
        super().__init__(name="table-registrar", daemon=True)
        self.store = store
        self.specs = specs
        self.versions = versions
        self.fingerprints = fingerprints or {}
        self.recomputed = recomputed or set()
        self.definition = definition
        self.mirror = mirror
        self.switch_lag = switch_lag
        self.retain_ms = retain_ms
        self.retirement = retirement
        self.proposed = proposed or {}
        self.serving = serving
        self._changed: set[str] = set()  # tables whose definition differs from their served version's: said once
        self.stop_event = stop
        self.where = where
        self.namespace = namespace
        self.every_s = every_s

    def run(self) -> None:
        healthy: bool | None = None
        backoff = min(1.0, self.every_s)
        while not self.stop_event.is_set():
            try:
                self.store.register_tables(self.specs)
                self._adopt()
            except Exception as e:  # any Redis trouble: logged once per outage, retried with backoff
                if healthy is not False:
                    log.warning("Redis at %s is unavailable (%s): table specs not registered; retrying, the "
                                "stream keeps running", self.where, first_line(str(e)))
                healthy = False
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, self.every_s)
                continue
            if healthy is not True:
                log.info("registered tables %s in Redis at %s (namespace %s)",
                         ", ".join(s.name for s in self.specs), self.where, self.namespace)
            healthy, backoff = True, min(1.0, self.every_s)
            self.stop_event.wait(self.every_s)

    def _adopt(self) -> None:
        """Give each table a version record, made from this definition where it has none. A table whose served
        version another definition computed is this one's if its query starts afresh; otherwise its rows now mix the
        two, which is said once."""
        if self.versions is None:
            return
        if self.mirror is not None:
            self._restore(self.versions, self.mirror)
        for name, fingerprint in self.fingerprints.items():
            record = self.versions.adopt(name, fingerprint, now_ms(), self.definition)
            if name in self.proposed and record.proposed != self.proposed[name]:
                record = self.versions.propose(name, self.proposed[name])
            served = record.versions[record.serving]
            if served.fingerprint == fingerprint:
                continue
            if self.serving is not None and self.serving.get(name) != record.serving:
                continue  # switched to since the start: it computes the definition it was begun with
            if record.physical() in self.recomputed:
                self.versions.recompute(name, fingerprint, self.definition)
                log.info("table %s: version %d is computed afresh from the input by its new definition (fingerprint "
                         "%s, was %s)", name, record.serving, fingerprint, served.fingerprint)
            elif name not in self._changed:
                self._changed.add(name)
                log.warning("table %s: its definition changed since version %d was built (fingerprint %s, now %s): "
                            "its query goes on from the state of the old one, so its rows mix both definitions "
                            "until it is recomputed (delete its checkpoint)", name, record.serving,
                            served.fingerprint, fingerprint)
        if self.switch_lag is not None:
            self._switch_caught_up(self.versions, self.switch_lag)
        if self.retirement is not None:
            self._retire_due(self.versions, self.retirement)
        if self.mirror is not None:
            records = self.versions.records()
            version_mirror.save(self.mirror, {name: records[name] for name in self.fingerprints if name in records})

    def _restore(self, versions: TableVersionStore, mirror: Path) -> None:
        """Give back to Redis the records it lost (a restart without its data): otherwise a table that serves its
        second version would be taken for a new one, served by its first."""
        known = versions.records()
        for name, record in version_mirror.saved(mirror).items():
            if name in self.fingerprints and name not in known:
                versions.restore(record)
                log.warning("table %s: Redis had lost its version record; restored as the pipeline kept it in %s "
                            "(version %d served)", name, mirror / version_mirror.MIRROR, record.serving)

    def _switch_caught_up(self, versions: TableVersionStore, switch_lag: int) -> None:
        """Serve each version this pipeline builds once it has caught up with its input (auto_switch)."""
        built = {spec.name for spec in self.specs}
        for name in self.fingerprints:
            record = versions.record(name)
            building = record.of_state(VersionState.BUILDING) if record is not None else None
            if record is None or building is None or record.physical(building.version) not in built:
                continue
            try:
                switch(self.store, versions, name, building.version, now_ms(), switch_lag, self.retain_ms)
            except TableVersionNotReady as e:
                log.debug("table %s: version %d not switched to yet: %s", name, building.version, e.message)
                continue
            log.info("table %s: version %d has caught up with its input: it is served now; version %d is kept for a "
                     "rollback for %d s (`freshroute table rollback %s`)", name, building.version, record.serving,
                     self.retain_ms // 1000, name)

    def _retire_due(self, versions: TableVersionStore, retirement: Retirement) -> None:
        """Retire each previous version whose time for a rollback is over: its query, spec, checkpoint and changelog."""
        now = now_ms()
        for name in self.fingerprints:
            record = versions.record(name)
            for v in record.listed() if record is not None else ():
                if v.state is not VersionState.PREVIOUS or v.retire_at_ms is None or v.retire_at_ms > now:
                    continue
                if not retirement.stop(name, v.version):
                    continue
                physical = record.physical(v.version)
                self.specs = [spec for spec in self.specs if spec.name != physical]
                self.store.remove_table(physical)
                versions.retire(name, v.version)
        retirement.restart_if_due()
        retirement.delete_due()

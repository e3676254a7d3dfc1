"""The pipeline's side of ``freshroute table deploy`` (:mod:`freshroute.metadata.deploys`): a watcher that notes a
deploy asked for while the pipeline runs — its queries then stop and start again, as at a start with a changed
tables file, and the served versions resume from their checkpoints — and, at the start, the deployed definitions
taken in the place of the tables file's, each request answered with the version begun or why none was.

A deployed tables file is kept by its content beside the checkpoints, as the pipeline's own are
(:mod:`pipeline.definitions`); it is loaded from that copy, so it cannot import modules beside the file it was
deployed from.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from freshroute.errors import FreshrouteError
from freshroute.lag import now_ms
from freshroute.metadata.deploys import DeployAnswer, DeployRequest, Deploys
from pipeline import definitions
from pipeline.logs import first_line
from pipeline.tables import Table, TablesDefinition
from pipeline.versions import VersionPlan

log = logging.getLogger("pipeline")

WATCH_EVERY_S = 1.0


class DeployWatcher(threading.Thread):
    """Sets ``due`` once a deploy is asked for (checked every :data:`WATCH_EVERY_S`; a Redis away is asked again)."""

    def __init__(self, deploys: Deploys, stop: threading.Event, seen: frozenset[tuple[str, int]] = frozenset()
                 ) -> None:
        """``seen``: the requests (table, when asked) this start took or answered already: not asked for again."""
        super().__init__(name="deploy-watcher", daemon=True)
        self.deploys = deploys
        self.stop_event = stop
        self.seen = seen
        self.due = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(WATCH_EVERY_S):
            try:
                pending = self.deploys.pending()
            except Exception as e:  # Redis away: the registrar says so; a deploy waits for it anyway
                log.debug("deploys not read: %s", first_line(str(e)))
                continue
            new = [r for r in pending.values() if (r.table, r.requested_ms) not in self.seen]
            if new:
                log.info("%s asks for a new version: the queries stop and start again with it",
                         "; ".join(r.describe() for r in new))
                self.due.set()
                return


class Taken:
    """The deploys a start takes: their definitions, for the planner, and their requests, to answer."""

    def __init__(self, deploys: Deploys | None) -> None:
        self.deploys = deploys
        self.definitions: dict[str, tuple[Table, str]] = {}  # table → its deployed definition and file's digest
        self.requests: dict[str, DeployRequest] = {}
        self.seen: set[tuple[str, int]] = set()  # (table, when asked) of every request read

    def take(self, definition: TablesDefinition, checkpoint_dir: Any) -> None:
        """Take each deploy asked for of a table of ``definition`` whose file holds it with the same source; answer
        the others at once, saying why."""
        if self.deploys is None:
            return
        try:
            pending = self.deploys.pending()
        except Exception as e:  # Redis away: a deploy is taken at a later start
            log.warning("deploys not read (%s): any asked for is taken at a later start", first_line(str(e)))
            return
        for name, request in pending.items():
            self.seen.add((name, request.requested_ms))
            try:
                self.definitions[name] = self._definition(request, definition, checkpoint_dir)
                self.requests[name] = request
            except FreshrouteError as e:
                self._answer(request, None, f"refused: {e.message}")

    @staticmethod
    def _definition(request: DeployRequest, definition: TablesDefinition, checkpoint_dir: Any) -> tuple[Table, str]:
        name = request.table
        if name not in definition.tables:
            raise FreshrouteError(f"the pipeline's tables file {definition.path} does not declare table {name}: a "
                                  f"deploy gives a table it computes a new definition (add a new table there)")
        digest = definitions.keep_text(checkpoint_dir, request.tables_file.encode())
        deployed = definitions.load(checkpoint_dir, digest)
        t = deployed.tables.get(name)
        if t is None:
            raise FreshrouteError(f"{request.path} does not declare table {name} (it declares "
                                  f"{', '.join(deployed.tables) or 'none'})")
        if deployed.sources.get(t.source) != definition.sources.get(t.source):
            raise FreshrouteError(f"{request.path} declares source {t.source!r} otherwise than the pipeline's tables "
                                  f"file {definition.path}, whose other tables read it: change it there")
        return t, digest

    def answer(self, plan: VersionPlan, failed: dict[str, str]) -> None:
        """Answer each request taken, as the plan made from it says (``failed``: table → why the version of it
        begun failed as its query was made)."""
        for name, request in self.requests.items():
            if name in plan.begun and name in failed:
                self._answer(request, None, f"refused: version {plan.begun[name]} failed: {failed[name]}")
            elif name in plan.begun:
                self._answer(request, plan.begun[name], f"version {plan.begun[name]} is building beside the one "
                                                        f"served, from the input's beginning")
            elif name in plan.refused:
                self._answer(request, None, f"refused: {plan.refused[name]}")
            else:
                self._answer(request, None, "refused: a version of the table computes this definition already "
                                            "(`freshroute table list` shows which)")

    def _answer(self, request: DeployRequest, version: int | None, message: str) -> None:
        log.info("%s: %s", request.describe(), message)
        assert self.deploys is not None
        try:
            self.deploys.answer(DeployAnswer(request.table, request.requested_ms, now_ms(), version, message))
        except Exception as e:  # Redis away: the request stays, and is taken again at the next start
            log.warning("%s: not answered (%s)", request.describe(), first_line(str(e)))

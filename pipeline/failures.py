"""A failed query: the error it stands for when a restart would meet it again, else a restart from its checkpoint
(which replays the failed batch) after a wait, a bounded number of times."""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

from freshroute.errors import FatalError, FreshrouteError
from pipeline.checkpoints import QueryChanged
from pipeline.logs import first_line
from pipeline.realtime import RealtimeRefused
from pipeline.validation import InvalidInput

if TYPE_CHECKING:
    from pipeline.query import Query
    from pipeline.settings import PipelineSettings

log = logging.getLogger("pipeline")

# Restarts of one query tolerated within the window before the pipeline gives up. Generous:
# on a loaded machine Spark's Python source worker may miss its fixed 10 s start-up deadline.
MAX_RESTARTS = 8
RESTART_WINDOW_S = 600.0


class PipelineFailed(FatalError):
    """A query kept failing; the last error says why."""

    code = "PIPELINE_FAILED"


class InputDataLost(FatalError):
    """The input topic no longer holds offsets the checkpoint says were there (or are still to be read)."""

    code = "INPUT_DATA_LOST"


def lasting_failure(q: Query, error: str, settings: PipelineSettings) -> FreshrouteError | None:
    """The error a query's failure stands for when a restart would meet it again (lost input, a changed definition,
    an invalid record), or None when a restart may help."""
    # Spark's Kafka source fails a query whose checkpointed offsets the topic no longer holds (failOnDataLoss):
    # a restart would fail the same way, and going on would silently skip input.
    lost = re.search(r"\[KAFKA_DATA_LOSS[^\]]*\]\s*([^\n]+)", error)
    if lost:
        checkpoint = settings.query_checkpoint(q.name)
        return InputDataLost(f"{q.label}: {lost.group(1).strip()} To reprocess the input the broker still holds, "
                             f"delete {checkpoint}.", query=q.name, checkpoint=str(checkpoint))
    # A table whose aggregation changed finds state of another shape in its checkpoint: every restart would fail
    # alike, so the pipeline stops at once and says what to do.
    changed = re.search(r"\[(STATE_STORE_(?:KEY|VALUE)_SCHEMA_NOT_COMPATIBLE|"
                        r"STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA)[^\]]*\]", error)
    if changed:
        checkpoint = settings.query_checkpoint(q.name)
        return QueryChanged(f"{q.label}: its checkpoint {checkpoint} holds the state of an earlier definition of "
                            f"its tables (Spark: {changed.group(1)}). Delete {checkpoint} to recompute them from "
                            f"the input, or give the changed table a query of its own (query=...).",
                            query=q.name, checkpoint=str(checkpoint))
    # A shape Real-time Mode cannot run: so it stays.
    refused = re.search(r"\[(STREAMING_REAL_TIME_MODE[^\]]*)\]\s*([^\n]*)", error)
    if refused:
        name = q.tables[0].name if q.tables else q.name
        if "CHECKPOINT_FORMAT_V1" in refused.group(1):
            checkpoint = settings.query_checkpoint(q.name)
            return QueryChanged(f"{q.label}: its checkpoint {checkpoint} was written by micro-batches, and Real-time "
                                f"Mode cannot resume from it (Spark: {refused.group(1)}). Delete {checkpoint} to "
                                f"recompute the table from its input, or give it pipeline_mode='microbatch'.",
                                query=q.name, checkpoint=str(checkpoint))
        spark = f"(Spark: {refused.group(1)}: {refused.group(2).strip()})"
        if len(q.tables) > 1:
            # One aggregation computes them all (pipeline.fusion): Spark names the operator, not the table.
            return RealtimeRefused(f"{q.label} cannot run in Real-time Mode {spark}. Give the table whose shape Spark "
                                   f"refuses pipeline_mode='microbatch' in the tables file to run it in micro-batches "
                                   f"(or query='<its name>' to run it alone and find which)", query=q.name,
                                   tables=[t.name for t in q.tables])
        return RealtimeRefused(f"table {name!r} cannot run in Real-time Mode {spark}. Give the table "
                               f"pipeline_mode='microbatch' in the tables file to run it in micro-batches", table=name)
    # A source that fails on invalid input: a restart would meet the same record.
    invalid = re.search(r"INVALID_INPUT: ([^\n]+)", error)
    if invalid:
        return InvalidInput(f"{q.label}: {invalid.group(1).strip()}. Fix or remove the record (or let the source "
                            f"dead-letter it: on_invalid='dead_letter'), then start the pipeline again.",
                            query=q.name)
    return None



def restart_delay(q: Query, error: str, settings: PipelineSettings) -> float:
    """How long to wait before restarting the failed query ``q`` from its checkpoint; raises the error its failure
    stands for when a restart would not help (:func:`lasting_failure`), or when it failed too often of late."""
    lasting = lasting_failure(q, error, settings)
    if lasting is not None:
        raise lasting
    now = time.monotonic()
    q.failures = [t for t in q.failures if now - t < RESTART_WINDOW_S] + [now]
    summary = first_line(error)
    if len(q.failures) > MAX_RESTARTS:
        raise PipelineFailed(f"{q.label}: query failed {len(q.failures)} times within {RESTART_WINDOW_S:.0f}s; "
                             f"last error: {summary}", query=q.name)
    delay = min(30.0, 2.0 ** len(q.failures))
    log.error("%s: query failed (%s); restarting from its checkpoint in %.0fs (attempt %d of %d)",
              q.label, summary, delay, len(q.failures), MAX_RESTARTS)
    log.debug("%s: full error:\n%s", q.label, error)
    return delay

"""The pipeline's log: INFO lines on stderr, one line per batch of each query, and the line that says it is warm."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.query import Query

log = logging.getLogger("pipeline")

# Said once every query runs at its steady pace (pipeline.query.Query.warm): what `local up` waits for.
WARM_LOG = "pipeline warm"


def configure_logging() -> None:
    """INFO lines on stderr, unless the embedding program configured logging already."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "py4j.clientserver", "py4j.java_gateway"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def log_progress(q: Query, p: Any) -> bool:
    """One INFO line per micro-batch, so that an operator sees the pipeline is alive and how fast it goes.

    Read from the query's last progress by the supervising loop rather than pushed to a Python
    StreamingQueryListener: the listener turns every report into dozens of Py4J round trips,
    which cost the JVM about a seventh of a core at two batches a second. A batch that ends
    between two reads of the loop goes unlogged; the next line's batch id shows the gap.
    """
    if p is None or p.batchId <= q.logged_batch:
        return False
    q.logged_batch = p.batchId
    written = [(r.table.name, r.writer.written.get(p.batchId)) for r in q.runs]
    seen = [w for _, w in written if w]

    def records(w: Any) -> str:
        return f"{w.records}" + (f" ({w.deletes} deletes)" if w.deletes else "")

    changed = sink = ""
    if seen:
        changed = (f", {records(seen[0])} changelog records" if len(q.runs) == 1 else
                   ", changelog records " + ", ".join(f"{name} {records(w)}" for name, w in written if w))
        sink = f"collect {seen[0].collect_ms:.0f} ms, produce {seen[0].produce_ms:.0f} ms"
    pause = q.pause_ms(p)
    log.info("%s batch %d: %d input rows%s in %d ms (%s; input %.0f rows/s, processed %.0f rows/s)%s",
             q.label, p.batchId, p.numInputRows, changed, p.batchDuration, batch_phases(p.durationMs, sink),
             p.inputRowsPerSecond or 0.0, p.processedRowsPerSecond or 0.0,
             "" if pause is None else f"; processing stopped {pause} ms")
    return True


# Where a micro-batch's time goes, in the order Spark spends it: offsets from the source and
# the offset log, planning, running the batch (read, state, foreachBatch), the commit log.
BATCH_PHASES = (("latestOffset", "offsets"), ("walCommit", "offset log"), ("queryPlanning", "planning"),
                ("addBatch", "run"), ("commitOffsets", "commit log"))


def batch_phases(duration_ms: Any, run_detail: str = "") -> str:
    """``offsets 12 ms, offset log 30 ms, …`` from a progress report's ``durationMs``."""
    phases = dict(duration_ms or {})
    return ", ".join(f"{label} {phases[name]} ms" + (f" ({run_detail})" if name == "addBatch" and run_detail else "")
                     for name, label in BATCH_PHASES if name in phases)


def first_line(text: str) -> str:
    """The first line of ``text`` that says something, at most 500 characters: an error in a log line."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return text[:500]


"""A query's checkpoint as the pipeline guards it: which tables it holds, whether it has batches, and whether the
changelogs it wrote to are still there.

Spark's own files (offsets, commits, state) are its business; beside them the pipeline records the tables whose
state the query holds (:data:`QUERY_TABLES_FILE`), so that a query resumed with other tables is refused rather than
started on another table's state, and a changelog lost under a checkpoint is refused rather than silently left
with only the keys that change from now on.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import orjson

from freshroute.errors import ConfigError, FatalError

log = logging.getLogger("pipeline")

# Beside Spark's own files in a query's checkpoint: the tables whose state it holds.
QUERY_TABLES_FILE = "freshroute-tables.json"
# A file of a checkpoint's log as Spark writes it, under a name of its own until it is renamed whole, with the local
# file system's checksum of it.
_UNFINISHED = re.compile(r"\.\.?\d+\.[0-9a-f-]{36}\.tmp(\.crc)?")


def committed_batches(checkpoint: Path) -> int:
    """Micro-batches a query's checkpoint records as done (Spark's ``commits`` log)."""
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0


def drop_unfinished_writes(checkpoint: Path, query: str) -> None:
    """Remove from the offsets and commits logs of ``checkpoint`` (query ``query``'s) the files a process killed
    while writing them left half-written.

    Spark reads none of them, but starts a query whose logs hold no batch only if they hold no file at all
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY): a pipeline killed as a Real-time query wrote its first checkpoint
    could otherwise never start that query again. Called before the query starts, when nothing writes them."""
    left = [p for name in ("offsets", "commits") if (checkpoint / name).is_dir()
            for p in (checkpoint / name).iterdir() if _UNFINISHED.fullmatch(p.name)]
    for p in left:
        p.unlink(missing_ok=True)
    if left:
        log.warning("query %s: removed %d half-written file(s) of its checkpoint's logs, left by a pipeline killed "
                    "while it wrote them: %s", query, len(left), ", ".join(str(p) for p in sorted(left)))


def resumable(checkpoint: Path) -> bool:
    """Whether a query started on ``checkpoint`` goes on from what it holds: a batch's offsets, or its operators'
    state — a Real-time query logs its first batch's offsets only when that batch ends, and one stopped before
    leaves the state's schema behind, which a changed definition cannot resume."""
    if committed_batches(checkpoint):
        return True
    offsets, state = checkpoint / "offsets", checkpoint / "state"
    return (offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir())) or \
        (state.is_dir() and any(state.iterdir()))


class QueryChanged(ConfigError):
    """A query's checkpoint holds the state of other tables, or of another definition of its tables, than the tables
    file now gives it."""

    code = "QUERY_CHANGED"


def check_query_tables(checkpoint: Path, query: str, tables: list[str]) -> None:
    """Refuse to resume a query whose tables changed, then record its tables in its checkpoint.

    A query's state is per operator, in plan order: resumed with a table added or removed, its
    tables would start without their history or read another table's. A checkpoint without the
    record predates shared queries: it is its one table's own.
    """
    if committed_batches(checkpoint):
        had = held_tables(checkpoint)
        if had != tables:
            was = f"for tables {had}" if had is not None else f"with an unreadable {QUERY_TABLES_FILE}"
            raise QueryChanged(f"query {query!r}: its checkpoint {checkpoint} was written {was}, and the tables file "
                               f"now puts {tables} in it. Delete {checkpoint} to recompute them all from the input, "
                               f"or give a new table a query of its own.", query=query, checkpoint=str(checkpoint))
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / QUERY_TABLES_FILE).write_bytes(orjson.dumps({"tables": tables}))


def held_tables(checkpoint: Path) -> list[str] | None:
    """The tables whose state a query's checkpoint holds: those it records, or, without a record (from before shared
    queries), its one table's, named as the checkpoint is; None when its record cannot be read."""
    return recorded_tables(checkpoint) if (checkpoint / QUERY_TABLES_FILE).is_file() else [checkpoint.name]


def recorded_tables(checkpoint: Path) -> list[str] | None:
    """The tables a query's checkpoint records; None when it records none that can be read."""
    try:
        return orjson.loads((checkpoint / QUERY_TABLES_FILE).read_bytes())["tables"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None


def query_checkpoint_of(checkpoint_dir: Path, table: str) -> Path:
    """The checkpoint of the query a table runs in: the one whose record names it, else the table's own."""
    for record in sorted(checkpoint_dir.glob(f"*/{QUERY_TABLES_FILE}")):
        if table in (recorded_tables(record.parent) or ()):
            return record.parent
    return checkpoint_dir / table


def retire_superseded(checkpoint: Path, tables: list[str], current: set[str]) -> list[Path]:
    """Move aside the checkpoints of earlier queries that computed some of ``tables``, when the query of
    ``checkpoint`` now computes them and has no batch of its own yet (``current``: every query's name this run,
    whose checkpoints stay). Spark cannot carry their state into another query's: the query recomputes its tables
    from the input. Returns where they went: ``.superseded/<query>`` beside them, which no query reads."""
    if committed_batches(checkpoint):
        return []
    root = checkpoint.parent
    moved = []
    for other in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if other.name in current or other.name.startswith(".") or not committed_batches(other):
            continue
        if not set(held_tables(other) or ()) & set(tables):
            continue
        target = root / ".superseded" / other.name
        n = 1
        while target.exists():
            n += 1
            target = root / ".superseded" / f"{other.name}.{n}"
        target.parent.mkdir(parents=True, exist_ok=True)
        other.rename(target)
        moved.append(target)
    return moved


class ChangelogLost(FatalError):
    """A table's changelog topic is gone while its checkpoint says batches were written to it."""

    code = "CHANGELOG_LOST"


def check_changelog_kept(topic: str, existed: bool, checkpoint: Path) -> None:
    """Refuse to resume a table whose changelog vanished (deleted, or a broker that lost its storage).

    The query would carry on from its checkpoint and write only the keys that change from
    now on, so a restored replica would silently miss every other key.
    """
    done = committed_batches(checkpoint)
    if not existed and done:
        raise ChangelogLost(f"changelog topic {topic} does not exist, but the checkpoint {checkpoint} records {done} "
                            f"batch(es) written to it: the broker lost it (deleted, or a broker restarted without its storage?). Delete "
                            f"{checkpoint} to recompute the table from its input.", topic=topic,
                            checkpoint=str(checkpoint))



def frozen_shuffle_partitions(checkpoint: Path) -> int | None:
    """The shuffle partitions a query's checkpoint froze (Spark's offset log keeps the setting its first batch ran
    with, and every restart runs with it), or None before its first batch."""
    offsets = checkpoint / "offsets"
    batches = sorted((int(p.name) for p in offsets.iterdir() if p.name.isdigit()), reverse=True) \
        if offsets.is_dir() else []
    for batch in batches:
        try:
            lines = (offsets / str(batch)).read_bytes().splitlines()
            return int(orjson.loads(lines[1])["conf"]["spark.sql.shuffle.partitions"])
        except (OSError, IndexError, KeyError, TypeError, ValueError):
            continue  # a log being written, or of another form: an earlier one says the same
    return None

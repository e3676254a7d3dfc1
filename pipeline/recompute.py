"""Keys a recomputed table no longer produces: found once the recomputation has caught up, then reported or
tombstoned.

A query that starts without a checkpoint recomputes its tables from the input the broker still holds,
into changelogs that may already hold keys. A key the recomputation never writes again — the new
definition filters it out or no longer groups by it, or its input has expired — would go on being
served as it was. So at such a start the pipeline notes where each of the query's changelogs and its
input end (:data:`MARK_FILE` in the checkpoint). Once a batch has read the input to that end, every key
the new definition produces has been written again, and a key whose last changelog record is from
before the mark is stale. The sink finds them in that batch — while it writes, so that no write of the
pipeline can come between — and, by each table's ``stale_keys``, reports them (a log line and the
``freshroute_pipeline_stale_keys`` gauge) or tombstones them. A windowed table's windows need neither:
they leave with their retention.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import orjson

log = logging.getLogger("pipeline")

MARK_FILE = "recomputation.json"
DONE_FILE = "recomputation.done.json"
STALE_KEYS = ("report", "tombstone")
_SHOWN = 20  # stale keys named in the log line


@dataclass(frozen=True)
class Recomputation:
    """Where a freshly started query's input and changelogs ended when it started."""

    checkpoint: Path
    input_ends: dict[str, dict[int, int]]  # topic → partition → end offset
    changelog_ends: dict[str, dict[int, int]]  # table → partition → end offset

    @staticmethod
    def load(checkpoint: Path) -> "Recomputation | None":
        """The checkpoint's mark, if a recomputation has not caught up yet."""
        try:
            doc = orjson.loads((checkpoint / MARK_FILE).read_bytes())
        except FileNotFoundError:
            return None
        return Recomputation(checkpoint, _int_keys(doc["input_ends"]), _int_keys(doc["changelog_ends"]))

    def save(self) -> None:
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        (self.checkpoint / MARK_FILE).write_bytes(orjson.dumps(
            {"input_ends": self.input_ends, "changelog_ends": self.changelog_ends}, option=orjson.OPT_NON_STR_KEYS))

    def caught_up(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` reads the input to where it ended at the start (Spark's offset log says
        where each batch ends before it runs)."""
        ends = batch_end_offsets(self.checkpoint / "offsets" / str(batch_id))
        return all(ends.get(topic, {}).get(p, 0) >= end for topic, partitions in self.input_ends.items()
                   for p, end in partitions.items())

    def done(self, found: Mapping[str, int]) -> None:
        """The stale keys are dealt with: a later batch or restart of the query does not look again."""
        (self.checkpoint / DONE_FILE).write_bytes(orjson.dumps({"stale_keys": found}))
        (self.checkpoint / MARK_FILE).unlink(missing_ok=True)


def _int_keys(doc: Mapping[str, Mapping[str, int]]) -> dict[str, dict[int, int]]:
    return {name: {int(p): int(o) for p, o in parts.items()} for name, parts in doc.items()}


def batch_end_offsets(path: Path) -> dict[str, dict[int, int]]:
    """A batch's end offsets from its entry in Spark's offset log: a version line, the batch's metadata, then one
    line per source, ``{"topic": {"0": offset, …}}`` for the Kafka source. Empty when there is no entry."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    out: dict[str, dict[int, int]] = {}
    for line in lines[2:]:
        if line.strip().startswith("{"):
            for topic, parts in orjson.loads(line).items():
                out.setdefault(topic, {}).update({int(p): int(o) for p, o in parts.items()})
    return out


def stale_keys(kafka: Mapping[str, Any], topic: str, mark: Mapping[int, int], written: Iterable[bytes]) -> list[tuple[bytes, int]]:
    """(key, partition) of every live key of changelog ``topic`` whose last record is before ``mark`` in its
    partition and that is not among ``written`` (the keys the batch at hand writes)."""
    from freshroute.changelog_reader import consume_to_end

    last: dict[tuple[bytes, int], tuple[int, bool]] = {}

    def note(m: Any) -> None:
        last[(m.key(), m.partition())] = (m.offset(), m.value() is not None)

    consume_to_end(str(kafka.get("bootstrap.servers", "")), topic, note, kafka_config=dict(kafka))
    skip = set(written)
    return sorted((key, p) for (key, p), (offset, live) in last.items()
                  if live and offset < mark.get(p, 0) and key not in skip)


def describe(table: str, action: str, stale: list[tuple[bytes, int]]) -> str:
    shown = ", ".join(k.decode("utf-8", "replace") for k, _ in stale[:_SHOWN])
    more = f" and {len(stale) - _SHOWN} more" if len(stale) > _SHOWN else ""
    verb = "tombstoned" if action == "tombstone" else "still served as they were (stale_keys='tombstone' deletes them)"
    return (f"table {table}: the recomputation caught up with its input, and {len(stale)} key(s) it no longer "
            f"produces are {verb}: {shown}{more}")

"""When a versioned table's changelog record became true: the time of the version it writes.

A record's version time is its Kafka timestamp, unless it carries the header :data:`HEADER` (decimal milliseconds
since the epoch). The pipeline writes the header on a versioned table's rows — the largest Kafka timestamp of the
input records the row reflects (:mod:`pipeline.lineage`) — since Spark's Kafka sink cannot set a record's timestamp;
a record's own timestamp is then when the broker appended it (the changelogs the pipeline creates keep
``LogAppendTime``).
"""

from __future__ import annotations

import re

HEADER = "freshroute.version_time"

_MS = re.compile(rb"^-?[0-9]{1,18}$")


def encode(ms: int) -> bytes:
    """The header's bytes, as Spark's ``cast(string)`` of a long writes them."""
    return b"%d" % ms


def of_record(headers: list[tuple[str, bytes]] | None, timestamp_ms: int) -> int | None:
    """The version time of a record with ``headers`` and Kafka timestamp ``timestamp_ms``; None when its header is
    there but not a time (the record is poison: its version has no time to stand at)."""
    if headers:
        for name, value in headers:
            if name == HEADER:
                return int(value) if value is not None and _MS.match(value) and int(value) >= 0 else None
    return timestamp_ms

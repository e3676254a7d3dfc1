"""Which input records a changelog record reflects: the header the Real-time pipeline writes on every table row.

The header :data:`HEADER` holds, for each partition of the table's input topic, the offset of the latest input
record folded into the row (a JSON array indexed by input partition; null where none of the row's records came
from that partition). A query in Spark's Real-time Mode replays up to one checkpoint interval of input after a
crash, and its Kafka sink writes again rows that older states of their keys produced: such a row reflects less of
some partition than the row a replica already holds. A replica applies a row only if it :func:`covers` the one it
holds, so that no lookup ever sees a key go back in time; the replay's last row of each key covers the one held
before the crash, so the table ends as a recomputation of its input would.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import orjson

HEADER = "freshroute.position"

InputPosition = Sequence[int | None]


def encode(position: InputPosition) -> bytes:
    """The header's bytes, as Spark's ``to_json`` writes them (for tests and hand-written records)."""
    return orjson.dumps(list(position))


def decode(raw: bytes | None) -> InputPosition | None:
    """The offsets of a header's bytes; None for a missing or unreadable header (the record is applied as written
    by a pipeline without positions)."""
    if not raw:
        return None
    try:
        position = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(position, list) or not all(o is None or type(o) is int for o in position):
        return None
    return position


def covers(new: InputPosition, held: InputPosition) -> bool:
    """Whether a row at ``new`` reflects every input record the row at ``held`` does: partition by partition, at least
    as far."""
    for partition, offset in enumerate(held):
        if offset is None:
            continue
        if partition >= len(new):
            return False
        at = new[partition]
        if at is None or at < offset:
            return False
    return True


def applies(held: bytes | None, raw: bytes | None, delete: bool) -> tuple[bool, bytes | None]:
    """Whether a replica holding a key's row at position ``held`` (header bytes; None: none) applies the key's next
    row, at ``raw`` (``delete``: a tombstone), and the position the key then holds. The row is applied unless both
    are readable positions and the new one does not cover the held one; an applied row's key holds the row's own
    position — for a row without one, the held position stays, and a delete forgets it (windows expire so).

    The one rule of every path that applies a changelog row: the live tail, a record-by-record restore and the bulk
    restore reader (``native/bulkload/records``, held to it by ``tests/data/position_corpus.json``)."""
    new = decode(raw)
    if new is not None and held is not None and raw != held:
        before = decode(held)
        if before is not None and not covers(new, before):
            return False, held
    return True, raw if new is not None else None if delete else held


def reflects(raw: bytes | None, after: Mapping[int, int]) -> bool:
    """Whether a row whose position header is ``raw`` reflects every input record of its key up to ``after`` (input
    partition → offset, inclusive): the query folds a key's records of a partition in offset order, so a row at
    or past an offset has every earlier one of its key."""
    position = decode(raw)
    if position is None:
        return False
    for partition, offset in after.items():
        if partition >= len(position):
            return False
        held = position[partition]
        if held is None or held < offset:
            return False
    return True


def of_record(headers: list[tuple[str, bytes]] | None) -> bytes | None:
    """The position header's bytes among a Kafka record's headers (None: it has none)."""
    if headers:
        for name, value in headers:
            if name == HEADER:
                return value
    return None

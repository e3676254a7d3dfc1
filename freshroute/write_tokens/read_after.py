"""A write token narrowed to the table a lookup reads (read your writes; docs/architecture.md says what it guarantees).

The token names input events (and what a session read); a table reads one input topic. Narrowed, it is the events
of that topic (:class:`freshroute.write_tokens.token.ReadAfter`, with the changelog offsets from which every row reflects
them once a mark says so) and a ``min_position`` of the table's changelog for what was read of it — or, for a table
added from a topic, whose input is its changelog, for what was written to it. A token naming nothing the table
reads, a partition its input does not have, or an offset past where the input ends is a caller's mistake.
"""

from __future__ import annotations

from functools import partial
from typing import Mapping

from typing import TYPE_CHECKING

from freshroute.errors import InvalidArgument
from freshroute.position import Position
from freshroute.metadata.progress import reflected_at
from freshroute.write_tokens.token import ReadAfter

if TYPE_CHECKING:
    from freshroute.bound import Bound
    from freshroute.metadata.tables import TableSpec
    from freshroute.routing.snapshot import SnapshotSource


ENDS_SETTLE_MS = 1000  # input ends read this long after a write must include it


def narrowed(spec: TableSpec, bound: Bound, metadata: SnapshotSource) -> Bound:
    """``bound`` with its write token narrowed to ``spec``'s table, as the current metadata knows it."""
    token = bound.after
    assert token is not None
    snap = metadata.current
    topic = spec.input_topic
    written = token.inputs.get(topic) if topic else None
    direct = token.inputs.get(spec.topic)
    read = token.read_position(spec.name)
    if direct:
        direct_read = Position(spec.name, {p: o + 1 for p, o in direct.items()})
        read = direct_read if read is None else read.merge(direct_read)
    if not written and read is None:
        reads = [t for t in (topic, spec.topic) if t]
        named = sorted({*token.inputs, *(f"table {t}" for t in token.reads)})
        raise InvalidArgument(f"after names writes to or reads of {', '.join(named)}; table {spec.name!r} reads "
                              f"{', '.join(repr(t) for t in reads)}", field="after", reads=reads)
    if read is not None:
        _check_partitions(spec.partitions, read.offsets, f"table {spec.name!r}'s changelog")
        bound = bound._replace(min_position=read if bound.min_position is None else bound.min_position.merge(read))
    if not written:
        return bound._replace(after=None)
    assert topic is not None  # writes are only found under the table's input topic
    ends = snap.input_ends.get(topic)
    if ends is not None:
        _check_partitions(len(ends.ends), written, f"input topic {topic!r}")
        # Only ends read well after the write can say an offset is past them: a write is in Kafka before its
        # delivery report, but these ends were read by a store node up to a refresh ago.
        if ends.at_ms >= token.written_ms + ENDS_SETTLE_MS:
            past = {p: o for p, o in written.items() if o >= ends.ends.get(p, 0)}
            if past:
                p, o = min(past.items())
                raise InvalidArgument(f"after names offset {o} of {topic}/{p}, past where that partition ends "
                                      f"({ends.ends.get(p, 0)}): no such write", field="after")
    return bound._replace(read_after=ReadAfter(topic, dict(written),
                                               partial(reflected, metadata, spec.name, dict(written)),
                                               partial(rejection, metadata, topic, dict(written))))


def reflected(metadata: SnapshotSource, table: str, written: dict[int, int]) -> Mapping[int, int]:
    """The changelog offsets from which every row of ``table`` reflects the events ``written``, as the latest
    metadata's marks say; empty while none does."""
    return reflected_at(metadata.current.input_marks.get(table, ()), written) or {}


def rejection(metadata: SnapshotSource, topic: str, written: dict[int, int]) -> str | None:
    """Why the pipeline rejected one of the events ``written`` names, as the latest metadata says; None if it has
    not (or it is not known yet)."""
    rejected = metadata.current.rejected.get(topic)
    if not rejected:
        return None
    for p, o in written.items():
        why = rejected.get(p, {}).get(o)
        if why is not None:
            return f"input record {topic}/{p} offset {o} was rejected by the pipeline: {why}"
    return None


def _check_partitions(count: int, offsets: Mapping[int, int], what: str) -> None:
    wrong = sorted(p for p in offsets if p >= count)
    if wrong:
        raise InvalidArgument(f"after names partition {wrong[0]} of {what}, which has {count} partitions",
                              field="after")

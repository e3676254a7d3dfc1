"""The pipeline's progress as it publishes it to the metadata store: how far each table's changelog is behind its
input (:class:`InputLag`, with the input's ends a store node reads: :class:`InputEnds`), where the changelog
ended once the input was processed to a point (:class:`InputMark`), and the records it rejected."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import orjson


@dataclass(frozen=True)
class InputLag:
    """Where the pipeline is in a table's input, as the pipeline publishes it after each micro-batch and once a
    second besides: the input offsets its last batch read to, and when a batch last had read everything there
    was. With where the input ends (:class:`InputEnds`, read from the broker by a store node) it gives how far the
    table's changelog is behind its input at any moment — also when the pipeline has stopped: see :func:`input_lag_at`.
    """

    records: int  # input records beyond the last micro-batch's end, as that batch saw it
    caught_up_ms: int  # the start of the last micro-batch that read everything there was to read
    at_ms: int  # when the last micro-batch was seen
    offsets: dict[int, int] = field(default_factory=dict)  # input partition → the offset the last batch read to
    alive_ms: int = 0  # when the pipeline last said it is running the table's query (once a second)
    # Input records a second by which ``records`` has been falling over the pipeline's recent samples of it
    # (freshroute.metadata.catch_up.LagTrend); None: unknown (too few samples, or not falling).
    falling_per_s: float | None = None
    # The records behind its input at which the pipeline counts a version of the table caught up (its switch_lag);
    # None: not said (readers take the default).
    switch_lag: int | None = None

    def ms(self, now: int) -> int:
        """Milliseconds the table's changelog is behind its input at ``now`` by the pipeline's own account."""
        return max(0, now - self.caught_up_ms) if self.records else 0

    def alive(self, now: int) -> bool:
        """Whether the pipeline is running the table's query: it has spoken within :data:`PIPELINE_EXPIRY_MS`."""
        return now - self.alive_ms <= PIPELINE_EXPIRY_MS

    def to_json(self) -> bytes:
        doc = asdict(self)
        for name in ("falling_per_s", "switch_lag"):  # unknown: left out, as older pipelines wrote it
            if doc[name] is None:
                del doc[name]
        return orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)

    @classmethod
    def from_json(cls, raw: bytes | str) -> "InputLag":
        d = orjson.loads(raw)
        falling, switch_lag = d.get("falling_per_s"), d.get("switch_lag")
        return cls(int(d["records"]), int(d["caught_up_ms"]), int(d["at_ms"]),
                   {int(p): int(o) for p, o in (d.get("offsets") or {}).items()}, int(d.get("alive_ms", d["at_ms"])),
                   None if falling is None else float(falling), None if switch_lag is None else int(switch_lag))


@dataclass(frozen=True)
class InputEnds:
    """Where an input topic ends (partition → the offset its next record will get), read from the broker, and where
    it starts (partition → its log start offset: the oldest record the broker still holds), read less often."""

    ends: dict[int, int]
    at_ms: int
    starts: dict[int, int] = field(default_factory=dict)  # empty: not known

    def to_json(self) -> bytes:
        doc = asdict(self)
        if not doc["starts"]:
            del doc["starts"]
        return orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)

    @classmethod
    def from_json(cls, raw: bytes | str) -> "InputEnds":
        d = orjson.loads(raw)
        return cls({int(p): int(o) for p, o in d["ends"].items()}, int(d["at_ms"]),
                   {int(p): int(o) for p, o in (d.get("starts") or {}).items()})


# A pipeline silent this long (it speaks once a second) is not running; input ends older than this are not trusted.
PIPELINE_EXPIRY_MS = 3000
INPUT_ENDS_TRUST_MS = 3000


def input_lag_at(lag: "InputLag | None", ends: "InputEnds | None", now: int) -> tuple[int, int]:
    """(records, ms) a table's changelog is behind its input at ``now``.

    Records: the input's ends (fresh) beyond the offsets the pipeline's last batch read to; without them, what the
    pipeline said. Milliseconds: 0 when no record is behind, else since the last batch that had read everything.
    So when the pipeline stops or dies while its input grows, both grow: nothing waits for the pipeline to say so.
    A silent pipeline whose input's ends are not known is counted as behind since its last catch-up, never fresh.
    """
    if lag is None:
        return (0, 0)
    if ends is not None and lag.offsets and now - ends.at_ms <= INPUT_ENDS_TRUST_MS:
        records = sum(max(0, end - lag.offsets.get(p, 0)) for p, end in ends.ends.items())
    elif lag.alive(now):
        return (lag.records, lag.ms(now))
    else:
        return (lag.records, max(0, now - lag.caught_up_ms))
    return (records, max(0, now - lag.caught_up_ms)) if records else (0, 0)


NO_INPUT_LAG = InputLag(0, 0, 0)


@dataclass(frozen=True)
class InputMark:
    """Where a table's changelog ended once its query had processed its input up to ``input`` (partition → next
    offset): published by the pipeline after each micro-batch, and after each checkpoint of a Real-time query, once
    the batch's rows are in Kafka. A replica of changelog partition ``c`` that has applied ``changelog[c]`` reflects
    every input record before ``input``, whichever keys they touched."""

    input: dict[int, int]
    changelog: dict[int, int]
    at_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {"i": self.input, "c": self.changelog, "t": self.at_ms}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "InputMark":
        return cls({int(p): int(o) for p, o in d["i"].items()}, {int(p): int(o) for p, o in d["c"].items()},
                   int(d["t"]))


MARKS_KEPT = 64  # a table's latest marks kept in the metadata store: a token older than all of them is long in


def marks_to_json(marks: Sequence[InputMark]) -> bytes:
    return orjson.dumps([m.to_dict() for m in marks], option=orjson.OPT_NON_STR_KEYS)


def marks_from_json(raw: bytes | str) -> tuple[InputMark, ...]:
    return tuple(InputMark.from_dict(d) for d in orjson.loads(raw))


def reflected_at(marks: Sequence[InputMark], offsets: Mapping[int, int]) -> dict[int, int] | None:
    """The changelog offsets from which every input record up to ``offsets`` (partition → offset, inclusive) is
    reflected: the first mark past all of them; None while no mark is."""
    for mark in marks:  # oldest first
        if all(mark.input.get(p, 0) > o for p, o in offsets.items()):
            return mark.changelog
    return None


REJECTIONS_KEPT = 256  # per input partition: the latest records the pipeline rejected, with their reason


def rejections_to_json(rejected: Mapping[int, Sequence[tuple[int, str]]]) -> bytes:
    return orjson.dumps({str(p): [list(r) for r in rs] for p, rs in rejected.items()})


def rejections_from_json(raw: bytes | str) -> dict[int, dict[int, str]]:
    """Input partition → offset → why the pipeline rejected that record."""
    return {int(p): {int(o): str(why) for o, why in rs} for p, rs in orjson.loads(raw).items()}

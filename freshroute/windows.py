"""Windowed tables: the window definition, how a window is keyed in the changelog, and when it is final.

A window's changelog key is the table key's bytes, a NUL, and the window start as 16 hex digits
(milliseconds since the epoch), so a key's windows sort together by start and stay valid UTF-8
(like Kafka Streams' window key schema, readable in the topic); the partition is the table key's
alone (:func:`freshroute.keys.partition_for`), so one replica answers all windows of a key.

The watermark is Spark's: the greatest event time seen minus ``grace``. It travels in the changelog
itself, as the record :data:`WATERMARK_KEY` written to every partition after the windows it covers,
so a replica knows it exactly as of its position, and a restore brings it back. A window is
**final** once the watermark has reached its end (event time passed end + grace: no late record can
revise it any more), and **expired** once the watermark has passed its end by ``retention``.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import orjson

# The row of a windowed changelog partition that holds its watermark: never a window key (those end in 16 hex digits).
WATERMARK_KEY = b"\x00watermark"
_SEP = 0  # NUL: below every other byte, so a key's windows sort before any longer key's
_START_DIGITS = 16
_SUFFIX = 1 + _START_DIGITS
MAX_START_MS = (1 << 63) - 1
_UNITS_MS = {"ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "sec": 1000, "second": 1000,
             "seconds": 1000, "m": 60_000, "min": 60_000, "minute": 60_000, "minutes": 60_000, "h": 3_600_000,
             "hour": 3_600_000, "hours": 3_600_000, "d": 86_400_000, "day": 86_400_000, "days": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]+)\s*$")


def duration_ms(value: Any, what: str) -> int:
    """Milliseconds of ``value``: an int (ms), a :class:`datetime.timedelta`, or text like ``"10s"``, ``"5 minutes"``."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, dt.timedelta):
        return value // dt.timedelta(milliseconds=1)
    if isinstance(value, str):
        m = _DURATION.match(value.lower())
        if m and m.group(2) in _UNITS_MS:
            return int(m.group(1)) * _UNITS_MS[m.group(2)]
    raise ValueError(f"{what} must be a duration (milliseconds, a timedelta, or text like \"10s\", \"5 minutes\"), "
                     f"not {value!r}")


@dataclass(frozen=True)
class WindowSpec:
    """Tumbling (``slide == size``) or hopping windows over event time, with grace and retention, in milliseconds."""

    size_ms: int
    slide_ms: int
    grace_ms: int = 0
    retention_ms: int = 86_400_000
    time_column: str = "timestamp"  # event time: a TIMESTAMP column, by default the Kafka record's timestamp

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ValueError(f"window size must be positive, not {self.size_ms} ms")
        if self.slide_ms <= 0:
            raise ValueError(f"window slide must be positive, not {self.slide_ms} ms")
        if self.slide_ms > self.size_ms:
            raise ValueError(f"window slide ({self.slide_ms} ms) must not exceed its size ({self.size_ms} ms): "
                             f"events between windows would belong to none")
        if self.grace_ms < 0 or self.retention_ms < 0:
            raise ValueError("window grace and retention must not be negative")

    @property
    def tumbling(self) -> bool:
        return self.slide_ms == self.size_ms

    def end(self, start_ms: int) -> int:
        return start_ms + self.size_ms

    def final(self, start_ms: int, watermark_ms: int) -> bool:
        """No record can revise the window any more: the watermark (event time − grace) has reached its end."""
        return start_ms + self.size_ms <= watermark_ms

    def expired(self, start_ms: int, watermark_ms: int) -> bool:
        """The window closed more than ``retention`` ago: it is no longer served, and its record is deleted."""
        return start_ms + self.size_ms + self.retention_ms <= watermark_ms

    def windows_in(self, from_ms: int, to_ms: int) -> int:
        """How many window starts fall in ``[from_ms, to_ms)`` at most."""
        return max(0, -(-(to_ms - from_ms) // self.slide_ms))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "WindowSpec":
        return cls(int(d["size_ms"]), int(d["slide_ms"]), int(d.get("grace_ms", 0)),
                   int(d.get("retention_ms", 86_400_000)), str(d.get("time_column", "timestamp")))


def tumbling(size: Any, *, grace: Any = 0, retention: Any = "1 day", time: str = "timestamp") -> WindowSpec:
    """Back-to-back windows of ``size``; each event belongs to exactly one."""
    size_ms = duration_ms(size, "window size")
    return WindowSpec(size_ms, size_ms, duration_ms(grace, "grace"), duration_ms(retention, "retention"), time)


def hopping(size: Any, slide: Any, *, grace: Any = 0, retention: Any = "1 day", time: str = "timestamp") -> WindowSpec:
    """Windows of ``size`` starting every ``slide``; each event belongs to ``size / slide`` of them."""
    return WindowSpec(duration_ms(size, "window size"), duration_ms(slide, "window slide"), duration_ms(grace, "grace"),
                      duration_ms(retention, "retention"), time)


def window_key(key: bytes, start_ms: int) -> bytes:
    """The changelog key of ``key``'s window starting at ``start_ms``."""
    return b"%s\x00%016x" % (key, start_ms)


def split_window_key(raw: bytes) -> tuple[bytes, int] | None:
    """(table key bytes, window start) of a window's changelog key; None for any other row (the watermark)."""
    if len(raw) < _SUFFIX or raw[-_SUFFIX] != _SEP:
        return None
    digits = raw[-_START_DIGITS:]
    try:
        return raw[:-_SUFFIX], int(digits, 16)
    except ValueError:
        return None


def key_range(key: bytes, from_ms: int, to_ms: int) -> tuple[bytes, bytes]:
    """The changelog key range ``[lo, hi)`` holding ``key``'s windows that start in ``[from_ms, to_ms)``."""
    return window_key(key, from_ms), window_key(key, to_ms)


def watermark_value(watermark_ms: int) -> bytes:
    return orjson.dumps({"watermark_ms": watermark_ms})


def parse_watermark(value: bytes | None) -> int | None:
    """The watermark a :data:`WATERMARK_KEY` row holds (None: none yet, or unreadable)."""
    if not value:
        return None
    try:
        w = orjson.loads(value).get("watermark_ms")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return w if isinstance(w, int) else None


def live_starts(from_ms: int, to_ms: int, life_ms: int, watermark_ms: int | None) -> Callable[[bytes], bool]:
    """A test of changelog keys: a window starting in ``[from_ms, to_ms)`` that has not expired at the watermark
    (``life_ms``: size + retention). The watermark row and any other row fail it."""
    lo = from_ms if watermark_ms is None else max(from_ms, watermark_ms - life_ms + 1)

    def keep(raw: bytes) -> bool:
        split = split_window_key(raw)
        return split is not None and lo <= split[1] < to_ms

    return keep


class Window(NamedTuple):
    """One window of one key as a lookup returns it."""

    start: int
    end: int
    value: bytes  # the changelog value, JSON
    final: bool

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "value": orjson.loads(self.value), "final": self.final}


def windows_of(spec: WindowSpec, key: bytes, rows: Iterable[tuple[bytes, bytes]],
               watermark_ms: int | None) -> Iterator[Window]:
    """``key``'s windows among the rows a range read kept (the node chose them by start and expiry), in start order."""
    w = -1 if watermark_ms is None else watermark_ms
    for raw, value in rows:
        split = split_window_key(raw)
        if split is None or split[0] != key:
            continue  # another key that happens to share the range's bytes
        start = split[1]
        yield Window(start, start + spec.size_ms, value, spec.final(start, w))

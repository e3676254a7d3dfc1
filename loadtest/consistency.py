"""Consistency checker: proves a recording of lookups against the table's changelog read back from Kafka.

For every answered lookup of the recording it checks that

(a) the value equals the table's state at the position the response reported: the latest
    changelog record for the key with offset < the position's offset in the key's partition
    (a ``not_found`` answer ⇒ no live value there; a null value is a tombstone);
(b) the answer met the bound it asked for: ``lag.offsets <= max_lag``,
    ``lag.ms <= max_staleness_ms``, ``input_lag.ms <= max_input_lag_ms``, position >= ``min_position`` in the
    key's partition;
(c) a session never read backwards: an answer that asked for ``min_position`` is at least as
    fresh, partition by partition, as every answer the same session saw before it;
(d) an answer after a write token includes the write: its position is past the key's first changelog record
    whose input position (the header a Real-time query writes) reflects the token's offsets. A key the write did
    not touch has no such record: that answer is counted as unverifiable, not checked;
(e) the answer's lag labels are true: by the changelog records' timestamps, no more records lay past its position
    than its ``lag.offsets`` says, and none that was there ``lag.ms`` before the request, give or take a slack for a
    label to trail the truth (``loadtest.label_truth``);
(f) with the input topic read back too, the answer's input-lag label is true: every input record (that produced a row)
    in the input ``input_lag.ms`` before the request, give or take the same slack, was reflected by the changelog by
    the time the answer came back (``loadtest.input_truth``).

A window lookup's answer (a record with ``windows``) is checked as (a) for each window: at the
reported position, exactly the key's windows starting in ``[from_ms, to_ms)`` that the changelog
holds and that the partition's watermark there has not expired, each with its value, and
``final`` exactly when the watermark there has reached the window's end.

Failed lookups (503, timeouts …) assert nothing and are only counted. Any violation makes
the CLI exit non-zero and lists the offending requests.

    python -m loadtest.consistency --recording report/requests.jsonl --home .freshroute/local
"""

from __future__ import annotations

import argparse
import bisect
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import orjson

from freshroute import input_position
from freshroute.errors import InvalidArgument
from freshroute.position import Position
from freshroute.keys import partition_for, serialize_key
from freshroute.windows import WATERMARK_KEY, WindowSpec, split_window_key
from loadtest.input_truth import InputLog, InputTruth, check_input_label
from loadtest.label_truth import LABEL_SLACK_MS, Timeline, check_labels

_WATERMARK = WATERMARK_KEY.decode()

ANSWERED = ("ok", "not_found")


@dataclass
class Changelog:
    """A table's changelog as read back: per partition, per key, the records in offset order."""

    topic: str
    partitions: int
    end_offsets: dict[int, int] = field(default_factory=dict)
    _history: dict[tuple[int, str], tuple[list[int], list[Any]]] = field(default_factory=dict)
    # Every offset read, per partition: where compaction removed records, these have gaps.
    _present: dict[int, list[int]] = field(default_factory=dict)
    _windows: dict[tuple[int, str], list[tuple[int, str]]] | None = None  # (partition, key) → (start, window key)
    # (partition, key) → (offset, input position header) of its records that carry one, in offset order
    _positions: dict[tuple[int, str], list[tuple[int, bytes]]] = field(default_factory=dict)
    # partition → its records (of any key) that carry a timestamp, with when each was in the changelog, for (e)
    _timelines: dict[int, Timeline] = field(default_factory=dict)

    @classmethod
    def from_records(cls, topic: str, partitions: int,
                     records: Iterable[tuple[Any, ...]],
                     end_offsets: dict[int, int] | None = None) -> "Changelog":
        """Build from ``(partition, offset, key, value[, input position header[, timestamp ms]])``; value is JSON
        bytes/str, a parsed value, or None; a None header or timestamp is absent."""
        log = cls(topic, partitions)
        ends: dict[int, int] = defaultdict(int)
        for p, offset, key, value, *extra in sorted(records, key=lambda r: (r[0], r[1])):
            if extra and extra[0]:
                log._positions.setdefault((p, key), []).append((offset, extra[0]))
            if len(extra) > 1 and extra[1] is not None:
                log._timelines.setdefault(p, Timeline()).append(offset, extra[1])
            if isinstance(value, (bytes, str)):
                value = orjson.loads(value)
            offsets, values = log._history.setdefault((p, key), ([], []))
            offsets.append(offset)
            values.append(value)
            log._present.setdefault(p, []).append(offset)
            ends[p] = max(ends[p], offset + 1)
        # Records read after a partition's EOF (the topic kept growing) only move its end forward.
        log.end_offsets = {p: max((end_offsets or {}).get(p, 0), ends.get(p, 0)) for p in range(partitions)}
        return log

    def reflected_at(self, key: str, partition: int, after: dict[int, int]) -> int | None:
        """The offset of ``key``'s first record whose input position reflects ``after`` (input partition →
        offset); None when none does (the writes did not touch the key, or their rows are not read back)."""
        for offset, header in self._positions.get((partition, key), ()):
            if input_position.reflects(header, after):
                return offset
        return None

    def timeline(self, partition: int) -> Timeline | None:
        """The partition's records with their times; None when none was read with a timestamp."""
        return self._timelines.get(partition)

    def positions(self) -> Iterator[tuple[int, int, bytes]]:
        """(partition, offset, input position header) of every record read with one, for (f)."""
        for (p, _key), records in self._positions.items():
            for offset, header in records:
                yield p, offset, header

    def present(self, partition: int) -> Sequence[int]:
        """Every offset of the partition read, in order: gaps are records compaction removed."""
        return self._present.get(partition, ())

    def partition_of(self, key: str) -> int:
        return partition_for(serialize_key(key), self.partitions)

    def windows_at(self, key: str, partition: int, position: int, from_ms: int, to_ms: int,
                   window: WindowSpec) -> tuple[list[tuple[int, Any, bool]], int | None]:
        """``key``'s live, unexpired windows starting in ``[from_ms, to_ms)`` after offsets [0, position): (start,
        value, final) in start order, and the watermark there."""
        live, mark, _ = self.state_at(_WATERMARK, partition, position)
        watermark = mark.get("watermark_ms") if live and isinstance(mark, dict) else None
        w = -1 if watermark is None else watermark
        out = []
        for start, raw in sorted(self._window_keys(partition, key)):
            if from_ms <= start < to_ms and not window.expired(start, w):
                alive, value, _ = self.state_at(raw, partition, position)
                if alive:
                    out.append((start, value, window.final(start, w)))
        return out, watermark

    def windows_settled_at(self, key: str, partition: int, position: int) -> bool:
        """Whether compaction left the watermark and every window of ``key`` decided before ``position``."""
        return self.settled_at(_WATERMARK, partition, position) and all(
            self.settled_at(raw, partition, position) for _, raw in self._window_keys(partition, key))

    def _window_keys(self, partition: int, key: str) -> list[tuple[int, str]]:
        """(start, changelog key) of every window of ``key`` the changelog holds."""
        if self._windows is None:
            self._windows = defaultdict(list)
            for p, raw in self._history:
                split = split_window_key(raw.encode())
                if split is not None:
                    self._windows[(p, split[0].decode())].append((split[1], raw))
        return self._windows.get((partition, key), [])

    def settled_at(self, key: str, partition: int, position: int) -> bool:
        """Whether what compaction left decides ``key``'s state before ``position``.

        The cleaner removes a record only when a later record of its key exists. So the state is
        undecided only when the key has a record at or past ``position`` and offsets are missing
        between its last record before ``position`` and ``position``: one of them may have been it.
        """
        offsets, _ = self._history.get((partition, key), ((), ()))
        i = bisect.bisect_left(offsets, position)
        if i == len(offsets):
            return True
        lo = offsets[i - 1] if i else -1
        present = self._present.get(partition, ())
        return bisect.bisect_left(present, position) - bisect.bisect_right(present, lo) == position - 1 - lo

    def state_at(self, key: str, partition: int, position: int) -> tuple[bool, Any, int | None]:
        """(live?, value, offset of the deciding record) of ``key`` after applying offsets [0, position)."""
        offsets, values = self._history.get((partition, key), ((), ()))
        i = bisect.bisect_left(offsets, position)
        if i == 0:
            return False, None, None
        value = values[i - 1]
        return value is not None, value, offsets[i - 1]


@dataclass(frozen=True)
class Violation:
    """One request that broke a guarantee."""

    index: int
    kind: str
    message: str
    record: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {"index": self.index, "kind": self.kind, "message": self.message,
                **{k: r.get(k) for k in ("t", "proto", "session", "seq", "key", "bound", "outcome", "status",
                                         "served_by", "lag", "position")}}


@dataclass
class CheckReport:
    """What was checked, and every violation found."""

    table: str
    requests: int = 0
    answered: int = 0
    failed: int = 0
    values_checked: int = 0
    absences_checked: int = 0
    bounds_checked: int = 0
    session_reads_checked: int = 0
    writes_checked: int = 0  # (d): answers after a write token
    labels_checked: int = 0  # (e): lag labels (offsets and staleness count one each) held against the changelog
    input_labels_checked: int = 0  # (f): input-lag labels held against the input and the changelog
    unverifiable: int = 0
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations and (self.values_checked + self.absences_checked) > 0

    def to_dict(self, max_listed: int = 50) -> dict[str, Any]:
        kinds: dict[str, int] = defaultdict(int)
        for v in self.violations:
            kinds[v.kind] += 1
        return {"ok": self.ok, "table": self.table, "requests": self.requests, "answered": self.answered,
                "failed": self.failed, "values_checked": self.values_checked,
                "absences_checked": self.absences_checked, "bounds_checked": self.bounds_checked,
                "session_reads_checked": self.session_reads_checked, "writes_checked": self.writes_checked,
                "labels_checked": self.labels_checked, "input_labels_checked": self.input_labels_checked,
                "unverifiable": self.unverifiable,
                "violations": len(self.violations), "violations_by_kind": dict(kinds),
                "offending": [v.to_dict() for v in self.violations[:max_listed]]}


def same_value(a: Any, b: Any, rel_tol: float = 1e-9) -> bool:
    """JSON equality that tolerates float re-encoding (``41`` == ``41.0``, last-digit rounding)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k], rel_tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y, rel_tol) for x, y in zip(a, b))
    return a == b


def same_fields(got: Any, want: dict[str, float], rel_tol: float = 1e-6) -> bool:
    """Whether ``got`` holds each of ``want``'s numbers, as equal as sums taken in another order can be."""
    return isinstance(got, dict) and all(
        k in got and abs(float(got[k]) - float(v)) <= rel_tol * max(1.0, abs(float(v))) for k, v in want.items())


def _position_offset(rec: dict[str, Any], table: str, partition: int) -> tuple[int | None, str | None]:
    """The response's position in the key's partition, or why it has none."""
    token = rec.get("position")
    if not token:
        return None, "the answer carries no position"
    try:
        pos = Position.decode(token)
    except InvalidArgument:
        return None, f"the answer's position {token!r} does not parse"
    if pos.table != table:
        return None, f"the answer's position is for table {pos.table!r}"
    if partition not in pos.offsets:
        return None, f"the answer's position does not cover partition {partition}"
    return pos.offsets[partition], None


def check(records: list[dict[str, Any]], changelog: Changelog, table: str, window: WindowSpec | None = None,
          label_slack_ms: int = LABEL_SLACK_MS, inputs: InputLog | None = None,
          held: Sequence[tuple[int, int]] = ()) -> CheckReport:
    """Check (a) values, (b) bounds, (c) monotonic sessions, (d) reads after writes, (e) lag labels and, given the
    table's input read back (``inputs``), (f) input-lag labels of ``records`` against ``changelog`` (a windowed table's
    window answers against its ``window``; a label may trail the truth by ``label_slack_ms``; records appended within
    a ``held`` window (from_ms, until_ms) were readable only from its end, or from the first answer past them,
    :meth:`Timeline.held`)."""
    report = CheckReport(table)
    timelines: dict[int, Timeline | None] = {}
    shown: dict[int, list[tuple[int, int]]] = defaultdict(list)  # partition → (position, by when an answer was there)
    for rec in records if held else ():
        if rec.get("table") == table and rec.get("outcome") in ANSWERED and rec.get("ts_ms") is not None:
            partition = changelog.partition_of(rec["key"])
            offset, _ = _position_offset(rec, table, partition)
            if offset is not None:
                shown[partition].append((offset, rec["ts_ms"] + math.ceil(rec.get("latency_ms") or 0)))

    def timeline(partition: int) -> Timeline | None:
        if partition not in timelines:
            t = changelog.timeline(partition)
            timelines[partition] = t.held(held, shown[partition]) if t is not None and held else t
        return timelines[partition]

    truth = InputTruth.of(changelog, inputs) if inputs is not None else None
    sessions: dict[str, list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)

    def bad(i: int, kind: str, message: str) -> None:
        report.violations.append(Violation(i, kind, message, records[i]))

    for i, rec in enumerate(records):
        if rec.get("table") != table:
            continue
        report.requests += 1
        if rec.get("outcome") not in ANSWERED:
            report.failed += 1
            continue
        report.answered += 1
        key = rec["key"]
        partition = changelog.partition_of(key)
        if rec.get("partition") is not None and rec["partition"] != partition:
            bad(i, "partition", f"answered from partition {rec['partition']}, but {key!r} lives in {partition}")
        offset, why = _position_offset(rec, table, partition)

        # (a) the value is the table's state at the reported position
        if offset is None:
            if rec["outcome"] == "ok":
                bad(i, "position", why or "no position")
            else:
                report.unverifiable += 1  # a 404 without a position cannot be placed in the changelog
        elif offset > changelog.end_offsets.get(partition, 0):
            bad(i, "position", f"position {offset} is beyond the changelog end {changelog.end_offsets.get(partition, 0)}"
                               f" of partition {partition}")
        elif rec.get("windows") is not None and not changelog.windows_settled_at(key, partition, offset):
            report.unverifiable += 1  # compaction removed what decided the answer
        elif rec.get("windows") is None and not changelog.settled_at(key, partition, offset):
            report.unverifiable += 1
        elif rec.get("windows") is not None:
            report.values_checked += 1
            if window is None:
                bad(i, "value", "a window answer of a table checked without its window definition")
            else:
                want_windows, watermark = changelog.windows_at(key, partition, offset, int(rec["from_ms"]),
                                                               int(rec["to_ms"]), window)
                got = [(w["start"], w["value"], w["final"]) for w in rec["windows"]]
                if len(got) != len(want_windows) or not all(
                        g[0] == e[0] and g[2] == e[2] and same_value(g[1], e[1]) for g, e in zip(got, want_windows)):
                    bad(i, "value", f"returned windows {got!r}, but before offset {offset} of partition {partition} "
                                    f"(watermark {watermark}) they are {want_windows!r}")
        else:
            live, want, at = changelog.state_at(key, partition, offset)
            if rec["outcome"] == "ok":
                report.values_checked += 1
                if not live:
                    bad(i, "value", f"returned a value, but {key!r} had no live value before offset {offset}"
                                    f" of partition {partition}")
                elif not same_value(rec.get("value"), want):
                    bad(i, "value", f"returned {rec.get('value')!r}, but the state before offset {offset} of "
                                    f"partition {partition} is {want!r} (changelog offset {at})")
            else:
                report.absences_checked += 1
                if live:
                    bad(i, "value", f"answered not found, but {key!r} was {want!r} before offset {offset} of "
                                    f"partition {partition} (changelog offset {at})")

        # (b) the answer met the bound it asked for
        bound = rec.get("bound") or {}
        lag = rec.get("lag")
        if bound:
            report.bounds_checked += 1
        if "max_lag" in bound or "max_staleness_ms" in bound:
            if not lag:
                bad(i, "bound", "asked for a bound, but the answer carries no lag")
            else:
                if "max_lag" in bound and lag["offsets"] is None:
                    bad(i, "bound", f"asked for max_lag {bound['max_lag']}, but the answer's offset lag is unknown")
                elif "max_lag" in bound and lag["offsets"] > bound["max_lag"]:
                    bad(i, "bound", f"lag {lag['offsets']} offsets exceeds max_lag {bound['max_lag']}")
                if "max_staleness_ms" in bound and lag["ms"] is None:
                    bad(i, "bound", f"asked for max_staleness_ms {bound['max_staleness_ms']}, but the answer's "
                                    f"staleness is unknown")
                elif "max_staleness_ms" in bound and lag["ms"] > bound["max_staleness_ms"]:
                    bad(i, "bound", f"staleness {lag['ms']} ms exceeds max_staleness_ms {bound['max_staleness_ms']}")
        if "max_input_lag_ms" in bound and rec.get("outcome") in ("ok", "not_found"):
            behind = rec.get("input_lag")
            if not behind:
                bad(i, "bound", "asked for max_input_lag_ms, but the answer carries no input lag")
            elif behind["ms"] > bound["max_input_lag_ms"]:
                bad(i, "bound", f"input lag {behind['ms']} ms exceeds max_input_lag_ms {bound['max_input_lag_ms']}")
        if bound.get("min_position"):
            try:
                wanted = Position.decode(bound["min_position"]).offset_for(partition)
            except InvalidArgument:
                wanted = None
                bad(i, "bound", "the request's min_position does not parse")
            if wanted is not None:
                if offset is None:
                    if wanted > 0:
                        report.unverifiable += 1
                elif offset < wanted:
                    bad(i, "bound", f"position {offset} is below min_position {wanted} in partition {partition}")

        # (d) an answer after a write token includes the write
        after = rec.get("after_offsets")
        if after and rec.get("outcome") == "ok" and offset is not None:
            first = changelog.reflected_at(key, partition, {int(p): int(o) for p, o in after.items()})
            if first is None:
                report.unverifiable += 1
            else:
                report.writes_checked += 1
                if offset <= first:
                    bad(i, "read_your_writes", f"answered at position {offset} of partition {partition}, but the "
                                               f"write is in {key!r}'s row only from changelog offset {first}")

        # (e) the answer's lag labels are true
        if offset is not None:
            checked, refuted = check_labels(rec, offset, timeline(partition), label_slack_ms)
            report.labels_checked += checked
            for kind, message in refuted:
                bad(i, kind, message)

        # (f) the answer's input-lag label is true
        checked, undecided, refuted = check_input_label(rec, truth, label_slack_ms)
        report.input_labels_checked += checked
        report.unverifiable += undecided
        for kind, message in refuted:
            bad(i, kind, message)

        if rec.get("session") is not None and rec.get("seq") is not None:
            sessions[str(rec["session"])].append((int(rec["seq"]), i, rec))

    # (c) sessions: an answer that asked for min_position never goes back behind what the session saw
    for name, seen in sessions.items():
        high: dict[int, tuple[int, int]] = {}  # partition → (highest offset seen, its request index)
        for _seq, i, rec in sorted(seen, key=lambda x: x[0]):
            token = rec.get("position")
            try:
                pos = Position.decode(token) if token else None
            except InvalidArgument:
                pos = None
            if pos is None or pos.table != table:
                continue
            if (rec.get("bound") or {}).get("min_position"):
                report.session_reads_checked += 1
                for p, o in pos.offsets.items():
                    if p in high and o < high[p][0]:
                        bad(i, "session", f"session {name} read partition {p} at {o} after having seen "
                                          f"{high[p][0]} (request #{high[p][1]})")
            for p, o in pos.offsets.items():
                if p not in high or o > high[p][0]:
                    high[p] = (o, i)

    report.violations.sort(key=lambda v: v.index)
    return report


# --- reading the changelog back ------------------------------------------------------------
def changelog_topic(table: str, redis_url: str | None = None, namespace: str = "freshroute",
                    topic_prefix: str = "") -> str:
    """The table's changelog topic from its spec in Redis, else ``{prefix}{table}-changelog``."""
    if redis_url:
        try:
            from freshroute.metadata.store import MetadataStore

            spec = MetadataStore.from_url(redis_url, namespace).tables().get(table)
            if spec is not None:
                return spec.topic
        except Exception:  # noqa: BLE001 - Redis holds soft state only; the naming convention still works
            pass
    return f"{topic_prefix}{table}-changelog"


def table_window(table: str, redis_url: str | None, namespace: str = "freshroute") -> WindowSpec | None:
    """The table's window definition from its spec in Redis (None: not windowed, or not known)."""
    if not redis_url:
        return None
    try:
        from freshroute.metadata.store import MetadataStore

        spec = MetadataStore.from_url(redis_url, namespace).tables().get(table)
    except Exception:  # noqa: BLE001 - without it a window answer is reported as unverifiable by definition
        return None
    return spec.window if spec is not None else None


def read_changelog(bootstrap: str, topic: str, timeout_s: float = 120.0,
                   kafka_config: dict[str, Any] | None = None, progress=None) -> Changelog:
    """Read every partition of ``topic`` from offset 0 to its true end (see ``freshroute.changelog_reader``)."""
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

    from freshroute.changelog_reader import consume_to_end

    rows: list[tuple[int, int, str, Any, bytes | None, int | None]] = []

    def keep(m: Any) -> None:
        key = m.key().decode("utf-8") if m.key() is not None else ""
        kind, ms = m.timestamp()
        rows.append((m.partition(), m.offset(), key, m.value(), input_position.of_record(m.headers()),
                     None if kind == TIMESTAMP_NOT_AVAILABLE else ms))

    _count, _secs, ends = consume_to_end(bootstrap, topic, keep, timeout_s, kafka_config, progress)
    return Changelog.from_records(topic, len(ends), rows, ends)


def load_recording(path: Path) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        return [orjson.loads(line) for line in f if line.strip()]


def check_recording(recording: Path | list[dict[str, Any]], bootstrap: str, table: str = "sensor_stats",
                    topic: str | None = None, redis_url: str | None = None, namespace: str = "freshroute",
                    topic_prefix: str = "", label_slack_ms: int = LABEL_SLACK_MS) -> CheckReport:
    """Read the changelog back and check a recording (a JSONL path or loaded records) against it."""
    records = load_recording(recording) if isinstance(recording, Path) else recording
    topic = topic or changelog_topic(table, redis_url, namespace, topic_prefix)
    return check(records, read_changelog(bootstrap, topic), table, table_window(table, redis_url, namespace),
                 label_slack_ms)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.consistency", description=__doc__.splitlines()[0])
    p.add_argument("--recording", required=True, type=Path, help="JSONL recording written by loadtest.scenario")
    p.add_argument("--home", default=".freshroute/local", help="local stack whose state file gives broker and Redis")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: from the state file)")
    p.add_argument("--redis-url", help="Redis holding the table specs (default: from the state file)")
    p.add_argument("--namespace", help="metadata namespace in Redis (default: from the state file)")
    p.add_argument("--table", default="sensor_stats")
    p.add_argument("--topic", help="changelog topic (default: the table spec's, else {prefix}{table}-changelog)")
    p.add_argument("--label-slack-ms", type=int, default=LABEL_SLACK_MS,
                   help="how long a lag label may trail the truth before the changelog refutes it")
    p.add_argument("--max-listed", type=int, default=50, help="how many offending requests to print")
    p.add_argument("--json-out", type=Path, help="also write the report as JSON here")
    a = p.parse_args(argv)
    bootstrap, redis_url, namespace, prefix = a.bootstrap, a.redis_url, a.namespace, ""
    state = Path(a.home) / "state.json"
    if state.exists():
        from tools.local.stack import Stack

        cfg = Stack.load(Path(a.home)).config
        bootstrap = bootstrap or cfg.bootstrap
        redis_url = redis_url or cfg.redis_url
        namespace = namespace or cfg.namespace
        prefix = cfg.topic_prefix
    if not bootstrap:
        print("no --bootstrap and no local stack state file under --home", file=sys.stderr)
        return 2
    records = load_recording(a.recording)
    topic = a.topic or changelog_topic(a.table, redis_url, namespace or "freshroute", prefix)
    print(f"reading changelog {topic} from {bootstrap} …", file=sys.stderr)
    changelog = read_changelog(bootstrap, topic, progress=lambda n, done, total: print(
        f"\r  {n} records, {done}/{total} partitions at end", end="", file=sys.stderr))
    print(file=sys.stderr)
    report = check(records, changelog, a.table, table_window(a.table, redis_url, namespace or "freshroute"),
                   a.label_slack_ms)
    doc = report.to_dict(a.max_listed)
    if a.json_out:
        a.json_out.write_bytes(orjson.dumps(report.to_dict(len(report.violations)), option=orjson.OPT_INDENT_2))
    for v in doc["offending"]:
        print(f"VIOLATION #{v['index']} [{v['kind']}] {v['message']}  "
              f"(t={v['t']}, {v['proto']}, key={v['key']}, bound={v['bound']}, served_by={v['served_by']})")
    if len(report.violations) > a.max_listed:
        print(f"… and {len(report.violations) - a.max_listed} more", file=sys.stderr)
    print(orjson.dumps({k: v for k, v in doc.items() if k != "offending"}).decode())
    if not report.ok:
        why = "violations found" if report.violations else "no answered lookup to check"
        print(f"CONSISTENCY CHECK FAILED: {why}", file=sys.stderr)
        return 1
    print(f"consistency check passed: {report.values_checked} values, {report.absences_checked} absences, "
          f"{report.bounds_checked} bounds, {report.session_reads_checked} session reads, "
          f"{report.labels_checked} lag labels", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How far a table's version building beside the served one has got, on the command line: the lines ``freshroute
table list`` shows under a table with versions (each version's state and input lag; a building one's progress as a
bar, and when it will have caught up), and ``freshroute table progress NAME``, which follows a building version until
it has caught up, is served, fails, or its time is up.

Plain text: a bar is ``[#########-----------] 45%``, no terminal control but a carriage return, so that it reads the
same in a pipe or a log (one line per look there; redrawn in place on a terminal). The figures are the listings'
(:mod:`freshroute.metadata.catch_up`): unknown is said so, never shown as 0.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, Mapping

from freshroute.errors import TableVersionNotFound
from freshroute.lag import now_ms
from freshroute.metadata.catch_up import DEFAULT_SWITCH_LAG, version_figures
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.table_versions import VersionedTable, VersionState, listing
from freshroute.metadata.version_store import TableVersionStore
from freshroute.metadata.version_switch import readiness
from tools.durations import duration_arg

BAR_WIDTH = 20

# Exit statuses of `freshroute table progress` (a named error — no such table or version, Redis away — is 2).
CAUGHT_UP = 0  # caught up with its input (within switch_lag, its replicas too), or served
FAILED = 1  # failed (the reason said), or not building any more without having been served
TIMED_OUT = 3  # still building when --timeout was up


# ---- rendering ----------------------------------------------------------------------------------------------------

def bar(progress: float | None, width: int = BAR_WIDTH) -> str:
    """``[#########-----------] 45%``: the share done, rounded down (100% only once all is); ``?%`` unknown."""
    if progress is None:
        return f"[{'-' * width}] ?%"
    share = min(1.0, max(0.0, progress))
    filled = math.floor(share * width)
    return f"[{'#' * filled}{'-' * (width - filled)}] {math.floor(share * 100)}%"


def duration_text(ms: int) -> str:
    """A duration as a person reads an estimate: ``45 s``, ``3 min``, ``2 h 5 min``, ``3 d``."""
    seconds = ms / 1000
    if seconds < 60:
        return f"{max(1, math.ceil(seconds)) if ms > 0 else 0} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    return f"{round(hours / 24)} d"


def estimate_text(caught_up_in_ms: int | None) -> str:
    """``caught up in ~3 min``; ``caught up`` (within switch_lag of its input); unknown said so."""
    if caught_up_in_ms is None:
        return "catch-up time unknown"
    if caught_up_in_ms == 0:
        return "caught up"
    return f"caught up in ~{duration_text(caught_up_in_ms)}"


def lag_text(input_lag: Mapping[str, int] | None) -> str:
    if input_lag is None:
        return "input lag unknown"
    records, ms = int(input_lag["records"]), int(input_lag["ms"])
    return f"input lag {records} records" + (f" ({duration_text(ms)})" if records else "")


def version_line(v: Mapping[str, Any]) -> str:
    """One version of a listing (``/v1/tables``' ``versions``, ``table list --json``'s) as a line of text."""
    head = f"v{v['version']} {v['state']:<8}"
    if v["state"] == VersionState.FAILED.value:
        return f"{head}  {v.get('reason') or 'no reason recorded'}"
    if v["state"] == VersionState.RETIRED.value:
        return head
    parts = [head, lag_text(v.get("input_lag"))]
    if v["state"] == VersionState.BUILDING.value:
        parts += [bar(v.get("progress")), estimate_text(v.get("caught_up_in_ms"))]
    return "  ".join(parts)


def version_lines(table: Mapping[str, Any]) -> list[str]:
    """The lines ``table list`` shows under a table with more than one version: each one not retired."""
    versions = table.get("versions") or []
    if len(versions) < 2:
        return []
    return [version_line(v) for v in versions if v["state"] != VersionState.RETIRED.value]


# ---- freshroute table progress ------------------------------------------------------------------------------------

def add_parser(table_sub: Any, metadata_flags: argparse.ArgumentParser) -> None:
    p = table_sub.add_parser("progress", parents=[metadata_flags],
                             help="Follow a table's version building until it has caught up, is served, fails or "
                                  "--timeout is up: its progress as a bar, and when it will have caught up.")
    p.add_argument("name")
    p.add_argument("--version", type=int, help="the version to follow (default: the one building)")
    p.add_argument("--every", type=duration_arg("--every", positive=True),
                   default=duration_arg("--every")("1s"),
                   metavar="DURATION", help="how often to look (default 1s)")
    p.add_argument("--timeout", type=duration_arg("--timeout"), default=duration_arg("--timeout")("1h"),
                   metavar="DURATION", help="give up after this long, exit status 3 (default 1h)")
    p.add_argument("--switch-lag", type=int, default=None, metavar="RECORDS",
                   help="how far behind its input (records) and its changelog (offsets) counts as caught up "
                        f"(default: the pipeline's switch_lag, as it publishes it; else {DEFAULT_SWITCH_LAG})")


def run(args: argparse.Namespace, metadata: MetadataStore) -> int:
    versions = TableVersionStore(metadata.redis, args.namespace)
    return follow(metadata, versions, args.name, args.version, args.every, args.timeout, args.switch_lag,
                  sys.stdout, sys.stderr, sys.stdout.isatty())


@dataclass(frozen=True)
class Look:
    """One look at a version building: its listing (state, input lag, progress, estimate) and, if it may not be
    switched to yet, why (None: it has caught up)."""

    doc: Mapping[str, Any]
    refusal: str | None


def look(metadata: MetadataStore, record: VersionedTable, version: int, now: int, switch_lag: int | None) -> Look:
    """Version ``version`` of ``record`` as the metadata store has it at ``now``."""
    physical = record.physical(version)
    tables, lags, ends = metadata.tables(), metadata.input_lags(), metadata.input_ends()
    published = lags.get(physical)
    target = switch_lag if switch_lag is not None else \
        published.switch_lag if published is not None and published.switch_lag is not None else DEFAULT_SWITCH_LAG
    input_lags, ways = version_figures(record, tables, lags, ends, now, target)
    listed = listing(record, {n: {"records": r, "ms": ms} for n, (r, ms) in input_lags.items()},
                     {n: way.to_dict() for n, way in ways.items()})
    doc = next(v for v in listed["versions"] if v["version"] == version)
    spec = tables.get(physical)
    if spec is None:
        return Look(doc, f"{physical} is not placed on the store nodes yet (no table spec registered)")
    return Look(doc, readiness(metadata, spec, now, target).refusal(target))


class _Line:
    """Where the looks go: redrawn in place on a terminal (a carriage return, the line padded over the last), one line
    each otherwise."""

    def __init__(self, out: IO[str], tty: bool) -> None:
        self.out, self.tty, self.width = out, tty, 0

    def show(self, text: str) -> None:
        if self.tty:
            self.out.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def done(self) -> None:
        """The last look kept on its line, before what is said next."""
        if self.tty and self.width:
            self.out.write("\n")
            self.out.flush()
            self.width = 0


def follow(metadata: MetadataStore, versions: TableVersionStore, table: str, version: int | None, every_ms: int,
           timeout_ms: int, switch_lag: int | None, out: IO[str], err: IO[str], tty: bool,
           clock_ms: Callable[[], int] = now_ms, sleep: Callable[[float], None] = time.sleep) -> int:
    """Follow version ``version`` of ``table`` (default: the one building), a look every ``every_ms``, until it has
    caught up or is served (:data:`CAUGHT_UP`), fails or stops building otherwise (:data:`FAILED`, the reason on
    ``err``), or ``timeout_ms`` is up (:data:`TIMED_OUT`)."""
    record = versions.record(table)
    if record is None:
        raise TableVersionNotFound(f"table {table!r} has no version record: it has one version, served",
                                   table=table)
    if version is None:
        building = record.of_state(VersionState.BUILDING)
        if building is None:
            raise TableVersionNotFound(f"table {table!r} has no version building (it serves version "
                                       f"{record.serving}); name one with --version", table=table)
        version = building.version
    record.version(version)  # a named error if the table never had it
    line = _Line(out, tty)
    started = clock_ms()
    for _ in range(timeout_ms // max(1, every_ms) + 2):  # bounded, whatever the clock does
        now = clock_ms()
        record = versions.record(table) or record
        v = record.version(version)
        if v.state is VersionState.SERVING:
            line.done()
            print(f"table {table}: version {version} is served", file=out)
            return CAUGHT_UP
        if v.state is not VersionState.BUILDING:
            line.done()
            why = f": {v.reason}" if v.reason else ""
            print(f"table {table}: version {version} is {v.state.value}{why}", file=err)
            return FAILED
        seen = look(metadata, record, version, now, switch_lag)
        # Why not yet, where the bar does not say it: within switch_lag of its input, or nothing known of it.
        why = seen.refusal is not None and (seen.doc.get("caught_up_in_ms") == 0 or "input_lag" not in seen.doc)
        line.show(f"{table} {version_line(seen.doc)}" + (f"  ({seen.refusal})" if why else ""))
        if seen.refusal is None:
            line.done()
            print(f"table {table}: version {version} has caught up with its input and its replicas with its "
                  f"changelog: the pipeline serves it (auto_switch), or `freshroute table switch {table}` does",
                  file=out)
            return CAUGHT_UP
        if now - started >= timeout_ms:
            break
        sleep(min(every_ms, max(0, timeout_ms - (now - started))) / 1000)
    line.done()
    print(f"table {table}: version {version} is still building after {duration_text(timeout_ms)} (--timeout)",
          file=err)
    return TIMED_OUT

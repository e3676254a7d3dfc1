"""``freshroute table switch|rollback``: which version of a table reads are served from
(freshroute.metadata.table_versions), changed by hand; ``freshroute table progress``: a version building followed
(tools/progress_cli.py)."""

from __future__ import annotations

import argparse
from typing import Any

from freshroute.lag import now_ms
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.table_versions import VersionedTable, VersionState
from freshroute.metadata.version_store import TableVersionStore
from freshroute.metadata.version_switch import DEFAULT_SWITCH_LAG, switch
from tools.durations import duration_arg
from tools import progress_cli

DEFAULT_RETAIN_PREVIOUS = "1h"


def add_parsers(table_sub: Any, metadata_flags: argparse.ArgumentParser) -> None:
    to = table_sub.add_parser("switch", parents=[metadata_flags],
                              help="Serve another version of a table (default: the one building) once it has caught up.")
    to.add_argument("name")
    to.add_argument("--version", type=int, help="the version to serve (default: the one building)")
    to.add_argument("--force", action="store_true", help="switch even if it has not caught up with its input")
    to.add_argument("--switch-lag", type=int, default=DEFAULT_SWITCH_LAG, metavar="RECORDS",
                    help="how far behind its input (records) and its changelog (offsets) it may be")
    to.add_argument("--retain-previous", type=duration_arg("--retain-previous"),
                    default=duration_arg("--retain-previous")(DEFAULT_RETAIN_PREVIOUS),
                    metavar="DURATION", help="how long the version served until now is kept for a rollback")
    back = table_sub.add_parser("rollback", parents=[metadata_flags],
                                help="Serve the previous version of a table again, at once.")
    back.add_argument("name")
    back.add_argument("--retain-previous", type=duration_arg("--retain-previous"),
                    default=duration_arg("--retain-previous")(DEFAULT_RETAIN_PREVIOUS),
                      metavar="DURATION", help="how long the version served until now is kept")
    progress_cli.add_parser(table_sub, metadata_flags)


def run(args: argparse.Namespace, metadata: MetadataStore) -> int:
    if args.table_command == "progress":
        return progress_cli.run(args, metadata)
    versions = TableVersionStore(metadata.redis, args.namespace)
    if args.table_command == "switch":
        record = switch(metadata, versions, args.name, args.version, now_ms(), args.switch_lag, args.retain_previous,
                        args.force)
    else:
        record = versions.rollback(args.name, now_ms(), args.retain_previous)
    print(served(record))
    return 0


def served(record: VersionedTable) -> str:
    """What a switch or a rollback did, in a line."""
    previous = record.of_state(VersionState.PREVIOUS)
    kept = "" if previous is None or previous.retire_at_ms is None else \
        f"; version {previous.version} is kept for a rollback for {(previous.retire_at_ms - now_ms()) // 1000} s"
    return f"table {record.name}: version {record.serving} is served{kept}"

"""``freshroute table deploy NAME --tables FILE``: a table given a new definition while the pipeline runs
(freshroute.metadata.deploys). The file is checked here — it loads, and declares the table — then asked for; the
pipeline takes it, begins the new version beside the served one, and answers, which this waits for."""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
import time
from pathlib import Path
from typing import Any

from freshroute.errors import ConfigError
from freshroute.lag import now_ms
from freshroute.metadata.deploys import DeployRequest, Deploys
from freshroute.metadata.store import MetadataStore
from tools.durations import duration_arg

NOT_TAKEN = 3  # the exit status of a deploy the pipeline has not answered in time (it stays asked for)


def add_parser(table_sub: Any, metadata_flags: argparse.ArgumentParser) -> None:
    deploy = table_sub.add_parser("deploy", parents=[metadata_flags],
                                  help="Build a new version of a table from a tables file, beside the one served, "
                                       "while the pipeline runs.")
    deploy.add_argument("name")
    deploy.add_argument("--tables", required=True, type=Path, metavar="FILE",
                        help="a tables file declaring the table (and its source, as the pipeline's declares it)")
    deploy.add_argument("--timeout", type=duration_arg("--timeout", positive=True),
                        default=duration_arg("--timeout", positive=True)("2m"), metavar="DURATION",
                        help="how long to wait for the pipeline to take it")
    deploy.add_argument("--no-wait", action="store_true", help="ask for it, and return at once")


def run(args: argparse.Namespace, metadata: MetadataStore) -> int:
    from pipeline.tables_file import load_tables

    definition = load_tables(args.tables)  # a file that does not load is refused here, saying why
    if args.name not in definition.tables:
        raise ConfigError(f"{args.tables} does not declare table {args.name} (it declares "
                          f"{', '.join(definition.tables) or 'none'})", setting="tables")
    request = DeployRequest(args.name, args.tables.read_text(), str(args.tables),
                            f"{getpass.getuser()}@{socket.gethostname()}", now_ms())
    deploys = Deploys(metadata.redis, args.namespace)
    deploys.request(request)
    if args.no_wait:
        print(f"table {args.name}: deploy of {args.tables} asked for; the pipeline takes it within a second, or at "
              f"its next start")
        return 0
    tty = sys.stderr.isatty()
    started = time.monotonic()
    deadline = started + args.timeout / 1000
    while time.monotonic() < deadline:
        answer = deploys.answered(args.name, request.requested_ms)
        if answer is not None:
            if tty:
                print(file=sys.stderr)
            if answer.version is None:
                print(f"freshroute: table {args.name}: deploy of {args.tables} {answer.message}", file=sys.stderr)
                return 1
            print(f"table {args.name}: {answer.message} (`freshroute table progress {args.name}` follows it)")
            return 0
        if tty:
            print(f"\rwaiting for the pipeline to take the deploy … {time.monotonic() - started:.0f} s", end="",
                  file=sys.stderr, flush=True)
        time.sleep(0.25)
    if tty:
        print(file=sys.stderr)
    print(f"freshroute: table {args.name}: no pipeline has taken the deploy of {args.tables} within "
          f"{args.timeout // 1000} s: it stays asked for, and a pipeline takes it when it runs", file=sys.stderr)
    return NOT_TAKEN

"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable

import pytest


_MODULE_SECONDS: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _MODULE_SECONDS[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    """Beside the slowest tests, the slowest modules: a module's fixtures (its stack) count in its time."""
    if not _MODULE_SECONDS:
        return
    terminalreporter.write_sep("=", "slowest 15 modules (setup, tests and teardown)")
    for path, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.2f}s {path}")


def _live_children() -> set[int]:
    """Pids of this process's children that are still running (not zombies)."""
    me = os.getpid()
    out: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


def outlive_modules(config: pytest.Config, pids: Callable[[], Iterable[int]]) -> None:
    """Let the processes of a session- or package-scoped fixture (``pids()``, asked at each module's end: a
    restarted component has a new pid) outlive the module that started them."""
    if not hasattr(config, "_freshroute_outliving"):
        config._freshroute_outliving = []
    config._freshroute_outliving.append(pids)


@pytest.fixture(scope="module", autouse=True)
def no_leftover_processes(request):
    """Fail a test module that leaves processes of its own behind (and end them)."""
    before = _live_children()
    yield
    leftover = _live_children() - before
    for pids in getattr(request.config, "_freshroute_outliving", ()):
        leftover -= set(pids())
    if leftover:
        for pid in leftover:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"{request.module.__name__} left processes behind: {sorted(leftover)}")


@pytest.fixture(scope="module")
async def one_event_loop():
    """Every async test of a module on one event loop, as in a router or a store node.

    grpc.aio's poller thread hands an operation's late event to the loop the operation began on;
    with a loop per test, one closed already fails whichever test is running then. A module
    that serves or calls gRPC asks for this with a module-scoped ``anyio_backend``."""
    yield

"""What Linux's ``/proc`` says about a process: its state, parent and CPU time (for the benchmarks)."""

from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state, ppid, …); None once it exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or parentheses itself.
    return text[text.rindex(")") + 2:].split()


def cpu_seconds(fields: list[str]) -> float:
    """User + system CPU seconds (every thread) of a process, from its :func:`stat_fields`."""
    # utime and stime: fields 14 and 15 of /proc/<pid>/stat, 11 and 12 after the command name.
    return (int(fields[11]) + int(fields[12])) / _TICK

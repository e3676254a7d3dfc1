"""What Linux's ``/proc`` says about a process (state, parent, CPU time, memory), and its CPU priority."""

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


def rss_kib(pid: int) -> int | None:
    """Resident memory of a process in KiB (``VmRSS``); None once it exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def lower_priority(pid: int, nice: int) -> str | None:
    """Run a process, and every process it starts later, at CPU priority ``nice``; None, or why not.

    With autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) the scheduler
    shares CPU time between sessions first, and a process's own nice value only ranks it
    within its session; a process that leads a session of its own is lowered through its
    session's nice. Both are set, so it works either way.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError as e:
        return f"setpriority: {e.strerror}"
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except FileNotFoundError:
        pass  # a kernel without autogroup: the process's own nice is what counts
    except OSError as e:
        return f"/proc/{pid}/autogroup: {e.strerror}"
    return None

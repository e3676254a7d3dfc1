"""What Linux's ``/proc`` says about a process (state, parent, CPU time, memory), and its CPU priority."""

from __future__ import annotations

import os
from typing import Container, Mapping

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


def cpu_seconds(fields: list[str], reaped: bool = False) -> float:
    """User + system CPU seconds (every thread) of a process, from its :func:`stat_fields`; with
    ``reaped``, also those of the exited children it waited for."""
    # utime, stime, cutime, cstime: fields 14-17 of /proc/<pid>/stat, 11-14 after the command name.
    return sum(int(x) for x in fields[11:15 if reaped else 13]) / _TICK


def age_s(fields: list[str]) -> float:
    """Seconds since the process started, from its :func:`stat_fields`."""
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    # starttime: field 22 of /proc/<pid>/stat, 19 after the command name, in ticks since boot.
    return max(0.0, uptime - int(fields[19]) / _TICK)


def process_age_s(pid: int) -> float | None:
    """Seconds since process ``pid`` started; None once it exited."""
    fields = stat_fields(pid)
    return age_s(fields) if fields else None


def children_by_parent() -> dict[int, list[int]]:
    """Every live process's children, from one pass over ``/proc``."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            if fields is not None:
                out.setdefault(int(fields[1]), []).append(int(name))
    return out


def process_tree(root: int, children: Mapping[int, list[int]], exclude: Container[int] = ()) -> list[int]:
    """``root`` and every process below it in ``children`` (:func:`children_by_parent`), leaving
    out the excluded ones and what is below them."""
    pids, todo, seen = [], [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid in exclude:  # ``seen``: a pid reused during the pass cannot loop
            continue
        seen.add(pid)
        pids.append(pid)
        todo.extend(children.get(pid, ()))
    return pids


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

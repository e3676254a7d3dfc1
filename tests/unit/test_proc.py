"""/proc readings of a process: state, parent, CPU time."""

import os
import subprocess
import sys

from freshroute.proc import cpu_seconds, stat_fields


def test_fields_of_a_live_process_and_none_once_it_exited():
    child = subprocess.Popen([sys.executable, "-c", "sum(range(3_000_000))"])
    child.wait()
    fields = stat_fields(os.getpid())
    assert fields is not None and fields[1] == str(os.getppid()) and fields[0] in "RS"
    assert stat_fields(child.pid) is None  # reaped: gone from /proc


def test_cpu_seconds_grow_with_work():
    before = cpu_seconds(stat_fields(os.getpid()))
    sum(i * i for i in range(2_000_000))
    after = cpu_seconds(stat_fields(os.getpid()))
    assert after > before >= 0

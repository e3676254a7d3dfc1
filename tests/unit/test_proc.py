"""/proc readings of a process (state, parent, CPU time, memory), and lowering its CPU priority."""

import os
import subprocess
import sys

from freshroute.proc import (children_by_parent, cpu_seconds, lower_priority, process_age_s, process_tree, rss_kib,
                             stat_fields)


def test_fields_of_a_live_process_and_none_once_it_exited():
    child = subprocess.Popen([sys.executable, "-c", "sum(range(3_000_000))"])
    child.wait()
    fields = stat_fields(os.getpid())
    assert fields is not None and fields[1] == str(os.getppid()) and fields[0] in "RS"
    assert stat_fields(child.pid) is None  # reaped: gone from /proc


def test_a_process_age_grows_and_is_none_once_it_exited():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    first = process_age_s(child.pid)
    child.wait()
    assert first is not None and 0.0 <= first < 60
    assert process_age_s(child.pid) is None  # reaped: gone from /proc
    assert process_age_s(os.getpid()) > first


def test_cpu_seconds_grow_with_work():
    before = cpu_seconds(stat_fields(os.getpid()))
    sum(i * i for i in range(2_000_000))
    after = cpu_seconds(stat_fields(os.getpid()))
    assert after > before >= 0


def test_a_process_tree_holds_every_process_below_its_root_but_the_excluded_branches():
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print(c.pid, flush=True)\ntime.sleep(30)\n")], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        children = children_by_parent()
        assert process_tree(os.getpid(), children)[0] == os.getpid()
        assert {parent.pid, child} <= set(process_tree(os.getpid(), children))
        assert process_tree(parent.pid, children) == [parent.pid, child]
        assert child not in process_tree(os.getpid(), children, exclude={parent.pid})
    finally:
        parent.kill()
        parent.wait()
        os.kill(child, 9)


def test_resident_memory_grows_with_what_is_held_and_is_none_once_gone():
    before = rss_kib(os.getpid())
    held = bytearray(64 * 1024 * 1024)
    held[::4096] = b"x" * len(held[::4096])  # touch every page so it is resident
    assert rss_kib(os.getpid()) >= before + 60 * 1024
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert rss_kib(child.pid) is None


def _nice_of(pid: int) -> int:
    return int(stat_fields(pid)[16])  # field 19 of /proc/<pid>/stat


def test_a_lowered_process_and_what_it_starts_later_run_at_that_nice():
    # A session of its own, as the local stack starts its components.
    # The child starts its own child only once it has been lowered (a line on stdin).
    child = subprocess.Popen([sys.executable, "-c",
                              "import subprocess, sys, time; sys.stdin.readline(); "
                              "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5)']); "
                              "print(g.pid, flush=True); time.sleep(5)"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert lower_priority(child.pid, 7) is None
        child.stdin.write("go\n")
        child.stdin.flush()
        grandchild = int(child.stdout.readline())
        assert _nice_of(child.pid) == 7 and _nice_of(grandchild) == 7
        if os.path.exists(f"/proc/{child.pid}/autogroup"):
            # The session's group, which is what ranks it against the other sessions.
            with open(f"/proc/{grandchild}/autogroup") as f:
                assert f.read().split()[-1] == "7"
        assert _nice_of(os.getpid()) != 7  # not the caller
    finally:
        os.killpg(child.pid, 9)
        child.wait()


def test_lowering_a_process_that_is_gone_says_why():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert "setpriority" in lower_priority(child.pid, 5)


def test_a_process_age_counts_from_its_start():
    import os
    import subprocess
    import sys

    from freshroute.proc import age_s, stat_fields

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        young = age_s(stat_fields(child.pid))
        assert 0.0 <= young < 5.0
        assert age_s(stat_fields(1)) >= young  # init started before anything this test runs
        assert age_s(stat_fields(os.getpid())) >= young  # this process started before its child
    finally:
        child.kill()
        child.wait()

import time
from collections import Counter

from loadtest.lookup_stages import (ROOT, ROUTER_FUNCTIONS, ROUTER_STAGES, STORE_STAGES, RoleCost, report,
                                    stage_of, stages_of_samples)

LOOP = "run_forever (/usr/lib/python3.11/asyncio/base_events.py:608);_run_once (/usr/lib/python3.11/asyncio/base_events.py:1922)"


def frame(function: str, rel: str, line: int = 1) -> str:
    return f"{function} ({ROOT / rel}:{line})"


def test_a_sample_is_charged_to_its_innermost_project_frame():
    stack = ";".join([LOOP, frame("respond", "router/rest/routes.py"), frame("_lookup", "router/rest/routes.py"),
                      frame("get", "freshroute/routing/core.py"), frame("plan_get", "freshroute/routing/core.py"),
                      "locate (/work/main/.venv/lib/python3.11/site-packages/x.py:3)"])
    assert stage_of(stack, ROUTER_STAGES, ROUTER_FUNCTIONS) == "route"


def test_a_function_of_a_file_may_have_a_stage_of_its_own():
    stack = ";".join([LOOP, frame("respond", "router/rest/routes.py", 140)])
    assert stage_of(stack, ROUTER_STAGES, ROUTER_FUNCTIONS) == "answer"
    assert stage_of(";".join([LOOP, frame("query_of", "router/rest/routes.py")]), ROUTER_STAGES,
                    ROUTER_FUNCTIONS) == "parse"


def test_no_project_frame_is_the_event_loop_and_unstaged_project_code_is_elsewhere():
    assert stage_of(LOOP, ROUTER_STAGES, ROUTER_FUNCTIONS) == "event loop"
    # Below the process's entry frame, asyncio's own work is the loop's too.
    assert stage_of(";".join([frame("run", "router/main.py"), LOOP]), ROUTER_STAGES, ROUTER_FUNCTIONS) == "event loop"
    assert stage_of(";".join([LOOP, frame("unknown", "freshroute/settings.py")]), ROUTER_STAGES,
                    ROUTER_FUNCTIONS) == "elsewhere"


def test_what_a_process_does_unasked_has_stages_of_its_own():
    assert stage_of(";".join([LOOP, frame("refresh", "freshroute/routing/refresher.py")]), ROUTER_STAGES,
                    ROUTER_FUNCTIONS) == "control plane"
    assert stage_of(frame("step", "store_node/changelog.py"), STORE_STAGES, {}) == "changelog"
    assert stage_of(frame("_run", "store_node/membership.py"), STORE_STAGES, {}) == "control plane"


def test_samples_are_counted_by_stage_from_raw_output():
    raw = "\n".join([
        f"{LOOP};{frame('data_received', 'store_node/read_port.py')} 7",
        f"{LOOP};{frame('data_received', 'store_node/read_port.py')};{frame('get', 'store_node/replica_store.py')} 5",
        f"{LOOP} 3",
        "malformed line",
    ])
    assert stages_of_samples(raw, STORE_STAGES) == Counter({"read port": 7, "read": 5, "event loop": 3})


def test_a_roles_cost_is_split_by_its_samples_in_the_order_a_lookup_meets_them():
    cost = RoleCost("router", 200.0, Counter({"answer": 1, "http": 2, "route": 1}))
    assert list(cost.by_stage().items()) == [("http", 100.0), ("route", 50.0), ("answer", 50.0)]
    fig = {"lookups": 1000, "lookups_per_s": 100.0, "connections": 32, "query": "",
           "router": {"cpu_us_per_lookup": 200.0, "samples": 4, "stages_us": cost.by_stage()},
           "store_node": {"cpu_us_per_lookup": 50.0, "samples": 1, "stages_us": {"read": 50.0}}}
    assert "router: 200.0 µs of CPU per lookup" in report(fig)
    assert "    read           50.0 µs" in report(fig)


def test_the_compiled_paths_cpu_is_its_own_stage_and_the_rest_is_split_by_samples():
    cost = RoleCost("router", 30.0, Counter({"event loop": 3, "control plane": 1}), compiled_us_per_lookup=22.0)
    assert list(cost.by_stage().items()) == [("compiled path", 22.0), ("event loop", 6.0), ("control plane", 2.0)]


def test_a_threads_cpu_is_read_by_its_name():
    import os

    from loadtest.lookup_stages import thread_cpu_seconds

    before, spent = thread_cpu_seconds(os.getpid(), ""), time.process_time()  # every thread's
    # Spin until this process has used 0.2 s of CPU by its own count, however busy the machine (at most 60 s).
    deadline = time.monotonic() + 60
    while time.process_time() - spent < 0.2 and time.monotonic() < deadline:
        pass
    assert time.process_time() - spent >= 0.2
    assert thread_cpu_seconds(os.getpid(), "") - before >= 0.15  # /proc counts in ticks of 10 ms
    assert thread_cpu_seconds(os.getpid(), "no-such-thread-") == 0.0

"""One stack (3 store nodes, one standby each, one router) for the modules that read it, or change it and put it
back: starting a stack and its pipeline's first batch cost about 20 s a module.

Each module produces its readings through ``produce_readings`` and checks the tables against everything produced
to the stack (``produced``), so the modules hold in any order. A module that restarts the router with flags of its
own (auth, TLS) starts it plain again when it ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import outlive_modules
from tests.integration.stack_fixture import start_stack


@pytest.fixture(scope="package")
def stack(request, tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("one-stack"), routers=1)
    outlive_modules(request.config, lambda: [c.pid for c in s.components.values()])
    yield s
    s.discard()


# Run first: the client install builds a wheel and a virtual environment (about 13 s) while the stack's pipeline is
# still starting, which the first module waits for anyway.
_FIRST = Path(__file__).with_name("test_client_install.py")
# Run last, in this order. Failover's wiped-disk test produces thousands of sensors of its own: every module after it
# that checks the tables against everything produced (produce_and_serve in routing, read your writes, router auth and
# TLS; input lag's last check) would look each of them up again, one lookup at a time (8.5 s a check at 4,000). A
# burst leaves the stack digesting its backlog for a minute after its test ends: after the modules that need a
# pipeline keeping up, not before them.
_LAST = [Path(__file__).with_name(name) for name in ("test_failover.py", "test_input_burst.py")]


def pytest_collection_modifyitems(items: list) -> None:
    here = [i for i, item in enumerate(items) if Path(item.path).parent == _LAST[0].parent]
    if not here:
        return
    first = [item for item in items if Path(item.path) == _FIRST]
    last = [item for module in _LAST for item in items if Path(item.path) == module]
    rest = [item for item in items[here[0]:here[-1] + 1] if Path(item.path) not in (_FIRST, *_LAST)]
    items[here[0]:here[-1] + 1] = first + rest + last

"""Real services for integration tests: one Apache Kafka broker and one redis-server per session.

Each test gets its own Redis namespace and its own topic names, so tests never see
each other's data even though they share the services.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tools.local.services import start_broker, start_redis
from tests.conftest import outlive_modules

pytestmark = pytest.mark.integration

# Every pipeline the suite starts runs the JIT's client compiler only, as a local stack's does
# (tools.local.stack.StackConfig.spark_jit): each lives minutes at test rates, and the optimising compiler's work at
# start, about 50 s of CPU a pipeline, would be a large share of what the suite asks of two cores.
os.environ.setdefault("FRESHROUTE_SPARK_JIT", "client")


def pytest_collection_modifyitems(config, items) -> None:
    """Every test under tests/integration is an integration test, whatever its module declares: ./dev test selects
    its lanes by this marker."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("services")


def _own(request, svc):
    """Mark a service process as the session's, so module leak checks ignore it."""
    outlive_modules(request.config, lambda: (svc.proc.pid,))
    return svc


@pytest.fixture(scope="session")
def broker(request, services_dir):
    """Bootstrap address of an Apache Kafka broker (KRaft, one node) on loopback."""
    svc = _own(request, start_broker(services_dir))
    yield svc.address
    svc.stop()


@pytest.fixture(scope="session")
def redis_service(request, services_dir):
    svc = _own(request, start_redis(services_dir))
    yield svc
    svc.stop()


@pytest.fixture
def redis_url(redis_service) -> str:
    return redis_service.address


@pytest.fixture
def namespace() -> str:
    """A Redis namespace and topic prefix of this test's own."""
    return f"t{uuid.uuid4().hex[:10]}"

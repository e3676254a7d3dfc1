"""The client's router fallback on the real stack: with every store node SIGSTOPped, a client given a router tries
the nodes for half its request timeout, then the router for the rest, and has its answer within the one timeout
(here a timeout too: the router cannot read paused nodes either — that the router's answer is returned when it has
one is tests/unit/test_client_fallback.py's); with the nodes back, it reads them directly again."""

from __future__ import annotations

import signal
import time

import pytest
from prometheus_client import CollectorRegistry

from freshroute.client import Client
from freshroute.errors import FreshrouteError, RetryableError
from freshroute.routing.policy import RoutingPolicy
from tests.integration.stack_fixture import FIRST_DATA_TIMEOUT_S, produce_readings, wait_until

pytestmark = pytest.mark.integration

TIMEOUT_MS = 1000
KEY = "sensor-fallback"  # a sensor as the other modules expect every key produced to the stack to be


def fallbacks(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("freshroute_client_router_fallbacks_total", {"operation": "get"}) or 0


def test_with_every_node_paused_the_client_asks_the_router_once_and_is_back_on_the_nodes_after(stack):
    produce_readings(stack, [{"sensor": KEY, "area": "cabin", "reading": 1.5}])
    c, registry = stack.config, CollectorRegistry()
    nodes = stack.store_node_names()
    with Client(c.redis_url, namespace=c.namespace, router=c.rest_url, metrics=registry,
                policy=RoutingPolicy(request_timeout_ms=TIMEOUT_MS)) as client:
        def served() -> bool:
            try:
                return client.get("sensor_stats", KEY).found
            except FreshrouteError:  # the table not registered yet, on a stack that has just started
                return False

        wait_until(served, FIRST_DATA_TIMEOUT_S, f"{KEY} to be served", stack=stack)
        assert client.get("sensor_stats", KEY).node.startswith("node-")
        # Asked of the router while the client had no tables yet (a stack that has just started): not counted below.
        earlier = fallbacks(registry)
        for name in nodes:
            stack.signal(name, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(RetryableError) as e:
                client.get("sensor_stats", KEY)
            took = time.monotonic() - t0
            assert fallbacks(registry) == earlier + 1  # the router was asked, once
            assert e.value.code == "TIMEOUT" and "router at" in e.value.message, e.value.to_body()
            assert TIMEOUT_MS / 2000 <= took < TIMEOUT_MS / 1000 + 0.1, took
        finally:
            for name in nodes:
                stack.signal(name, signal.SIGCONT)

        def direct() -> bool:
            try:
                return client.get("sensor_stats", KEY).node.startswith("node-")
            except RetryableError:
                return False

        wait_until(direct, 60, "direct reads again", stack=stack)
        before = fallbacks(registry)
        for _ in range(20):
            assert client.get("sensor_stats", KEY).node.startswith("node-")
        assert fallbacks(registry) == before  # the nodes answered: the router was not asked

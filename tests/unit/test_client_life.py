"""A client's life: reads before it started or after it closed are a clear error, never a hang or a library's."""

from __future__ import annotations

import asyncio

import pytest

from freshroute.client import AsyncClient, Client, ClientClosed
from tools.local.services import free_port


def nowhere() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: the client starts without metadata


def reads(c):
    return {"get": lambda: c.get("t", "k"), "get_many": lambda: c.get_many("t", ["k"]),
            "scan": lambda: list(c.scan("t")), "windows": lambda: c.windows("t", "k", from_ms=0, to_ms=1),
            "key_metadata": lambda: c.key_metadata("t", "k"), "tables": c.tables, "cluster": c.cluster,
            "session get": lambda: c.session().get("t", "k")}


def test_every_read_of_a_closed_client_is_client_closed():
    c = Client(redis_url=nowhere(), connect_timeout_s=0.1)
    c.close()
    c.close()  # closing twice is fine
    for name, read in reads(c).items():
        with pytest.raises(ClientClosed):
            read()
            pytest.fail(f"{name} of a closed client answered")


def test_an_async_client_refuses_reads_before_start_and_after_close_and_cannot_start_again():
    async def life() -> None:
        c = AsyncClient(redis_url=nowhere(), connect_timeout_s=0.1)

        async def scan() -> list:
            return [r async for r in c.scan("t")]

        with pytest.raises(ClientClosed, match="not started"):
            await c.get("t", "k")
        await c.start()
        await c.close()
        await c.close()
        for name, read in {"get": lambda: c.get("t", "k"), "get_many": lambda: c.get_many("t", ["k"]),
                           "scan": scan, "windows": lambda: c.windows("t", "k", from_ms=0, to_ms=1),
                           "key_metadata": lambda: c.key_metadata("t", "k"), "tables": c.tables, "cluster": c.cluster,
                           "session get": lambda: c.session().get("t", "k")}.items():
            with pytest.raises(ClientClosed):
                await read()
                pytest.fail(f"{name} of a closed client answered")
        with pytest.raises(ClientClosed, match="make a new one"):
            await c.start()

    asyncio.run(life())


def test_a_client_asked_for_metrics_counts_into_the_registry_given_and_falls_back_counted():
    from prometheus_client import CollectorRegistry

    from freshroute.client.metrics import ClientMetrics

    registry = CollectorRegistry()
    metrics = ClientMetrics(registry)
    threads = [metrics.counts(), metrics.counts()]  # two routing threads, counting apart, summed when scraped
    threads[0].lookup("ok", "active", 0.002)
    threads[1].lookup("ok", "active", 0.004, count=3)
    threads[1].lookup("timeout", "none", 2.0)
    threads[0].retry("hedge")
    metrics.fell_back("get")
    value = registry.get_sample_value
    assert value("freshroute_client_lookups_total", {"outcome": "ok", "role": "active"}) == 4
    assert value("freshroute_client_lookups_total", {"outcome": "timeout", "role": "none"}) == 1
    assert value("freshroute_client_lookup_seconds_count") == 5
    assert value("freshroute_client_lookup_seconds_bucket", {"le": "0.005"}) == 4
    assert value("freshroute_client_retries_total", {"reason": "hedge"}) == 1
    assert value("freshroute_client_router_fallbacks_total", {"operation": "get"}) == 1
    # A client given a registry counts into it from its first read, a failed one included.
    from freshroute.errors import FreshrouteError

    registry = CollectorRegistry()
    with Client(redis_url=nowhere(), connect_timeout_s=0.1, metrics=registry) as c:
        with pytest.raises(FreshrouteError):
            c.get("t", "k")
    assert registry.get_sample_value("freshroute_client_lookup_seconds_count") == 1

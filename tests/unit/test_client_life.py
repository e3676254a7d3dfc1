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


def test_a_client_starts_at_once_without_its_metadata_store_and_its_reads_name_it_after_one_wait():
    import time

    from freshroute.errors import ReplicaUnavailable

    url = nowhere()
    started = time.monotonic()
    c = Client(redis_url=url, connect_timeout_s=1.0)
    try:
        assert time.monotonic() - started < 0.5  # no read of Redis in the constructor
        for name, read in reads(c).items():
            if name == "cluster":
                continue  # the cluster view answers, saying the metadata store is down (below)
            t0 = time.monotonic()
            with pytest.raises(ReplicaUnavailable) as e:
                read()
                pytest.fail(f"{name} answered with no metadata")
            assert "metadata store (Redis, 127.0.0.1:" in e.value.message and "does not answer" in e.value.message, \
                (name, e.value.message)
            # The first read waits out the connect timeout for a first snapshot; later ones fail at once.
            assert time.monotonic() - t0 < (1.5 if name == "get" else 0.3), name
        assert c.cluster().metadata.redis_ok is False and c.cluster().nodes == []
    finally:
        c.close()

"""Rate limits shared by router processes through one bucket in Redis (fakeredis with its Lua here; two real
router processes in tests/integration/one_stack/test_router_auth.py)."""

from __future__ import annotations

import asyncio
import logging
import time

import fakeredis
import pytest

from freshroute.errors import RateLimited
from router.rate_limit import LocalRates, Rate, SharedRates


async def attempts(rates: SharedRates, name: str, rate: Rate) -> bool:
    try:
        await rates.admit(name, rate)
        return True
    except RateLimited as e:
        assert e.http_status == 429 and e.details["retry_after_s"] >= 1
        return False


def test_processes_draw_on_one_bucket_and_never_admit_more_than_it_holds():
    async def main() -> None:
        server = fakeredis.FakeServer()
        processes = [SharedRates(fakeredis.FakeAsyncRedis(server=server), "ns") for _ in range(3)]
        rate = Rate(reads_per_s=0.5, burst=12)  # refills by less than one read while the test runs
        admitted = [0, 0, 0]
        for _ in range(30):
            for i, p in enumerate(processes):
                admitted[i] += await attempts(p, "dashboards", rate)
        await asyncio.sleep(0)
        held = sum(p._leases["dashboards"].tokens for p in processes)
        assert sum(admitted) + held == 12  # what the shared bucket granted, used or still leased
        assert sum(admitted) >= 10 and all(admitted), admitted  # each process got its share; little is left leased
        # Another principal, another bucket.
        assert await attempts(processes[0], "ops", rate)

    asyncio.run(main())


def test_processes_sharing_a_principals_traffic_get_about_even_shares_of_its_rate():
    async def main() -> None:
        server = fakeredis.FakeServer()
        processes = [SharedRates(fakeredis.FakeAsyncRedis(server=server), "ns") for _ in range(2)]
        rate, interval = Rate(reads_per_s=40, burst=10), 1 / 80  # twice the rate, alternating
        served = [0, 0]
        start = time.monotonic()
        for n in range(120):
            await asyncio.sleep(max(0.0, start + n * interval - time.monotonic()))
            served[n % 2] += await attempts(processes[n % 2], "p", rate)
        granted = rate.burst + rate.reads_per_s * (time.monotonic() - start)
        assert 0.85 * granted <= sum(served) <= granted + 1, (served, granted)
        assert min(served) >= 0.35 * sum(served), served

    asyncio.run(main())


def test_reads_arriving_together_are_all_served_while_the_bucket_holds_enough():
    # A process's first lease is one token: reads that waited on it together must not be refused for finding it
    # spent by the first of them while the shared bucket still holds plenty.
    async def main() -> None:
        rates = SharedRates(fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer()), "ns")
        rate = Rate(reads_per_s=10_000_000, burst=10_000_000)
        for _ in range(3):
            served = await asyncio.gather(*(attempts(rates, "bench", rate) for _ in range(64)))
            assert all(served), served.count(False)

    asyncio.run(main())


def test_a_refused_process_is_told_when_to_come_back_and_is_served_then():
    async def main() -> None:
        rates = SharedRates(fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer()), "ns")
        # A read's worth refills in 250 ms: the three attempts finish well within it on a loaded machine too.
        rate = Rate(reads_per_s=4, burst=2)
        assert [await attempts(rates, "p", rate) for _ in range(3)] == [True, True, False]
        with pytest.raises(RateLimited) as e:
            await rates.admit("p", rate)
        assert e.value.details["retry_after_s"] == 1
        await asyncio.sleep(0.3)  # more than a read's worth refilled
        assert await attempts(rates, "p", rate)

    asyncio.run(main())


def test_a_busy_process_leases_its_demand_in_batches_not_a_redis_call_per_read():
    async def main() -> None:
        redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
        rates = SharedRates(redis, "ns")
        calls = 0
        script = rates._script

        async def counted(**kw):
            nonlocal calls
            calls += 1
            return await script(**kw)

        rates._script = counted
        rate = Rate(reads_per_s=100_000, burst=100_000)
        for _ in range(40):  # 2,000 reads over ~0.4 s: about 5,000 reads/s
            for _ in range(50):
                assert await attempts(rates, "p", rate)
            await asyncio.sleep(0.01)
        assert calls < 200, calls  # ~2,000 reads, leased in batches that grow with the demand

    asyncio.run(main())


def test_without_redis_each_process_limits_alone_and_says_so_once(caplog):
    async def main() -> None:
        server = fakeredis.FakeServer()
        server.connected = False  # every command fails with a connection error
        rates = SharedRates(fakeredis.FakeAsyncRedis(server=server), "ns")
        rate = Rate(reads_per_s=1, burst=3)
        served = [await attempts(rates, "p", rate) for _ in range(5)]
        assert served == [True, True, True, False, False]  # the burst, counted by this process alone

    with caplog.at_level(logging.WARNING, logger="router.rate_limit"):
        asyncio.run(main())
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "limits principals on its own" in caplog.records[0].message


def test_a_reload_forgets_principals_no_longer_in_the_file():
    async def main() -> None:
        rates = LocalRates()
        rate = Rate(reads_per_s=1, burst=1)
        await rates.admit("gone", rate)
        with pytest.raises(RateLimited):
            await rates.admit("gone", rate)
        rates.keep({"kept"})
        await rates.admit("gone", rate)  # a new principal of that name starts with a full bucket

    asyncio.run(main())


def test_a_lease_grants_what_the_shared_bucket_holds_and_limits_alone_without_redis():
    async def main() -> None:
        server = fakeredis.FakeServer()
        shared = SharedRates(fakeredis.FakeAsyncRedis(server=server), "ns")
        rate = Rate(reads_per_s=0.5, burst=10)
        assert [await shared.lease("p", rate, 4) for _ in range(4)] == [4, 4, 2, 0]
        assert not await attempts(shared, "p", rate)  # what was leased is gone from the one bucket
        server.connected = False
        alone = SharedRates(fakeredis.FakeAsyncRedis(server=server), "ns")
        assert [await alone.lease("p", rate, 6) for _ in range(3)] == [6, 4, 0]  # a bucket of this process's own
        local = LocalRates()
        assert [await local.lease("p", rate, 7) for _ in range(2)] == [7, 3]

    asyncio.run(main())

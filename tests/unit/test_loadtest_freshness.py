"""The freshness probes: one batch request per tick for every outstanding probe, latencies from each produce call."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson

from loadtest.freshness import _Probes, hops, run_probes


class FakeMessage:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def key(self) -> bytes:
        return self._key


class FakeProducer:
    """Takes every record except those whose key ends in one of ``refuse``; reports deliveries on poll."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.produced_at: dict[str, float] = {}
        self._refuse = refuse
        self._due: list = []

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery) -> None:
        self.produced_at[key.decode()] = time.monotonic()
        err = "refused" if key.decode().endswith(self._refuse) else None
        self._due.append((on_delivery, err, FakeMessage(key)))

    def poll(self, timeout: float) -> None:
        due, self._due = self._due, []
        for cb, err, msg in due:
            cb(err, msg)

    def flush(self, timeout: float) -> None:
        self.poll(0)


class FakeRouter:
    """Finds a key once ``visible_after_s`` has passed since it was produced, except the keys in ``never``."""

    def __init__(self, producer: FakeProducer, visible_after_s: float, never: tuple[str, ...] = ()) -> None:
        self.producer = producer
        self.visible_after_s = visible_after_s
        self.never = never
        self.requests: list[list[str]] = []
        self.found: set[str] = set()

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.method == "POST" and request.url.path == "/v1/tables/sensor_stats/keys:batchGet"
        keys = orjson.loads(request.content)["keys"]
        assert not self.found & set(keys), "a key found before was asked for again"
        self.requests.append(keys)
        now = time.monotonic()
        results = [{"key": k, "found": not k.endswith(self.never)
                    and now - self.producer.produced_at[k] >= self.visible_after_s} for k in keys]
        self.found |= {r["key"] for r in results if r["found"]}
        return httpx.Response(200, content=orjson.dumps({"table": "sensor_stats", "results": results}))


def probe(producer: FakeProducer, router: FakeRouter, probes: int, timeout_s: float = 5.0) -> dict:
    async def go() -> dict:
        async with httpx.AsyncClient(base_url="http://router", transport=httpx.MockTransport(router.handle)) as c:
            return await run_probes(producer, c, "readings", "sensor_stats", probes, spacing_s=0.02,
                                    timeout_s=timeout_s, poll_s=0.01)
    return asyncio.run(go())


def test_probes_are_polled_together_and_timed_from_their_produce_call():
    producer = FakeProducer()
    router = FakeRouter(producer, visible_after_s=0.15)
    out = probe(producer, router, probes=20)
    assert out["probes"] == 20 and out["visible"] == 20 and out["failed_to_produce"] == 0
    # Each latency is at least the time to visibility; it overstates it by a poll and a request (room left for a busy machine).
    assert 150 <= out["freshness_p50_ms"] <= 150 + 500
    assert 150 <= out["freshness_p99_ms"] <= 150 + 500
    # One request per tick, whatever the number outstanding: several probes were asked for at once,
    # and there were far fewer requests than one per probe per tick.
    assert max(len(keys) for keys in router.requests) >= 5
    assert len(router.requests) < 20 * 0.15 / 0.01
    assert len(router.found) == 20


def test_a_probe_never_seen_or_never_produced_is_not_visible():
    producer = FakeProducer(refuse=("-3",))
    router = FakeRouter(producer, visible_after_s=0.0, never=("-1",))
    out = probe(producer, router, probes=5, timeout_s=0.3)
    assert out["visible"] == 3 and out["failed_to_produce"] == 1
    asked = [k for keys in router.requests for k in keys]
    assert not any(k.endswith("-3") for k in asked)  # the broker refused it: never polled for
    # The never-visible probe was asked for until its timeout, and then no more.
    assert 5 <= sum(k.endswith("-1") for k in asked) <= 0.3 / 0.01 + 2
    assert [k[-2:] for k in router.requests[-1]] == ["-1"]


def test_each_probes_time_is_split_by_hop_from_the_record_timestamps():
    producer = FakeProducer()
    state = _Probes(producer, "readings", "r")
    state.produce(0)
    state.produce(1)
    state.produce(2)  # never seen: in no hop
    producer.poll(0)
    produced = {key: wall for key, (wall, _) in state.wall.items()}
    state.seen(["probe-r-0", "probe-r-1"], time.monotonic())
    seen = {key: state.wall[key][1] for key in ("probe-r-0", "probe-r-1")}
    # The changelog rows were written 8 and 12 ms after their produce calls.
    written = {"probe-r-0": produced["probe-r-0"] * 1000 + 8, "probe-r-1": produced["probe-r-1"] * 1000 + 12,
               "probe-r-2": produced["probe-r-2"] * 1000 + 9}
    out = hops(state, written)
    assert set(out) == {"pipeline", "serving"}
    assert out["pipeline"]["probes"] == 2 and {out["pipeline"]["p50_ms"], out["pipeline"]["p99_ms"]} <= {8.0, 12.0}
    serving = sorted(seen[k] * 1000 - written[k] for k in seen)
    assert out["serving"]["probes"] == 2 and out["serving"]["p99_ms"] == round(serving[-1], 1)

"""Read your writes on the whole stack: a reading produced, a token made of its delivery report, a lookup after it.

Writers each produce readings of a sensor of their own and look it up right after, with ``after=`` the token, through
REST, gRPC and the client: every answer must count every reading that writer produced (the sensor's count is the
writer's cycle), none may be older. The same holds while the node holding a writer's active replica is killed -9.
A reading the pipeline rejects ends its lookup with WRITE_REJECTED long before the lookup's wait is over.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from typing import Any, Callable

import grpc
import httpx
import orjson
import pytest
from confluent_kafka import Producer

from freshroute.client import Client, NotYetVisible, write_token
from freshroute.keys import partition_for, serialize_key
from freshroute.settings import kafka_client_config
from proto import router_pb2, router_pb2_grpc
from tests.integration.cluster_support import component, fully_replicated, metadata
from loadtest.read_your_writes import deliver
from tests.integration.stack_fixture import produce_and_serve, wait_until, write_reading

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("serving")]

TABLE = "sensor_stats"
WAIT_MS = 20_000  # correctness, not speed, is asserted here (the bench measures the wait)
CYCLES = 1000  # produce-then-read cycles in all, over the three ways of reading
NODES = {"node-1", "node-2", "node-3"}


@pytest.fixture(scope="module")
def serving(stack):
    """The pipeline serving the stack's tables (on a stack started for this module, its first rows)."""
    produce_and_serve(stack, [{"sensor": "ryw-first", "area": "ryw", "reading": 1.0, "ts": int(time.time() * 1000)}])
    # A pipeline another module restarted may still be warming up: one write read back, however long it takes.
    warm = Writer(stack, f"ryw-warm-{int(time.time()) % 100000}")
    with Client(stack.config.redis_url, namespace=stack.config.namespace) as client:
        wait_until(lambda: client_count(client, warm.sensor, warm.write()) == warm.written, 120,
                   "a write read back after its token", stack=stack)


def client_count(client: Client, sensor: str, token: str) -> int | None:
    try:
        return client.get(TABLE, sensor, after=token, wait_ms=WAIT_MS).value["count"]
    except NotYetVisible:
        return None


class Writer:
    """Produces readings of one sensor and reads it back after each; counts what came back without the reading."""

    def __init__(self, stack: Any, sensor: str) -> None:
        self.stack, self.sensor = stack, sensor
        self.topic = f"{stack.config.topic_prefix}readings"
        self.producer = Producer(kafka_client_config(stack.config.bootstrap, **{"linger.ms": 0,
                                                                                 "enable.idempotence": True}))
        self.written = 0
        self.missing: list[tuple[int, Any]] = []  # (cycle, what the lookup answered)
        self.rng = random.Random(sensor)

    def write(self, value: bytes | None = None) -> str:
        """One reading (or these bytes, which are not one) produced and delivered; its token."""
        if value is not None:
            return write_token(deliver(self.producer, self.topic, self.sensor.encode(), value))
        event = {"sensor": self.sensor, "area": "ryw", "reading": round(self.rng.uniform(0, 100), 2),
                 "ts": int(time.time() * 1000)}
        token = write_reading(self.stack, event, self.producer)
        self.written += 1
        return token

    def cycles(self, n: int, read: Callable[[str, str], int | None]) -> None:
        """``n`` writes, each read back after its token: ``read(sensor, token)`` answers the sensor's count."""
        for _ in range(n):
            token = self.write()
            count = read(self.sensor, token)
            if count is None or count < self.written:
                self.missing.append((self.written, count))


def in_threads(jobs: list[Callable[[], None]], timeout_s: float) -> None:
    errors: list[BaseException] = []

    def guarded(job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as e:  # noqa: BLE001 — reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(job,), daemon=True) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a writer did not finish in time"
    assert not errors, errors[0]


def test_every_read_after_a_write_includes_it_through_rest_grpc_and_the_client(stack):
    c = stack.config
    run = f"{int(time.time()) % 100000}"
    writers = [Writer(stack, f"ryw-{run}-{i}") for i in range(4)]
    with httpx.Client(base_url=c.rest_url, timeout=WAIT_MS / 1000 + 10) as http, \
            grpc.insecure_channel(c.grpc_address) as channel, Client(c.redis_url, namespace=c.namespace) as client:
        stub = router_pb2_grpc.RouterStub(channel)

        def rest(sensor: str, token: str) -> int | None:
            r = http.get(f"/v1/tables/{TABLE}/keys/{sensor}", params={"after": token, "wait_ms": WAIT_MS})
            return r.json()["value"]["count"] if r.status_code == 200 else None

        def grpc_(sensor: str, token: str) -> int | None:
            got = stub.Get(router_pb2.GetRequest(table=TABLE, key=sensor, bound=router_pb2.Bound(
                after=token, wait_ms=WAIT_MS)), timeout=WAIT_MS / 1000 + 5)
            return orjson.loads(got.value_json)["count"]

        def direct(sensor: str, token: str) -> int | None:
            return client.get(TABLE, sensor, after=token, wait_ms=WAIT_MS).value["count"]

        ways = [rest, grpc_, direct, rest]
        per_writer = CYCLES // len(writers)
        started = time.monotonic()
        in_threads([lambda w=w, way=way: w.cycles(per_writer, way) for w, way in zip(writers, ways)], 300)
        took = time.monotonic() - started
        print(f"\n{CYCLES} produce-then-read cycles in {took:.1f}s")
        assert sum(w.written for w in writers) == CYCLES
        assert [w.missing for w in writers] == [[], [], [], []]
        # A token names what a session read too: a later read after it is never older.
        seen = client.get(TABLE, writers[0].sensor, after=writers[0].write())
        again = client.get(TABLE, writers[0].sensor, after=write_token(seen.position))
        assert again.value["count"] >= seen.value["count"] == writers[0].written


def test_reads_after_a_write_include_it_through_a_kill_of_the_node_holding_the_active(stack):
    c = stack.config
    md = metadata(stack)
    writer = Writer(stack, f"ryw-kill-{int(time.time()) % 100000}")
    partition = partition_for(serialize_key(writer.sensor), md.tables()[TABLE].partitions)
    writer.cycles(3, lambda s, t: None)  # the sensor's first rows, so that it has an active to kill
    writer.missing.clear()
    victim = md.assignment().active(TABLE, partition)
    assert victim in NODES
    with Client(c.redis_url, namespace=c.namespace) as client:
        read = lambda s, t: client.get(TABLE, s, after=t, wait_ms=WAIT_MS).value["count"]  # noqa: E731
        writer.cycles(20, read)
        stack.signal(component(victim), signal.SIGKILL)
        try:
            writer.cycles(80, read)  # across the kill, the standby's promotion and the restore of a new standby
        finally:
            stack.start(component(victim))
        assert writer.missing == []
        wait_until(lambda: fully_replicated(md, NODES), 120, f"{victim} back, every partition with two copies",
                   stack=stack)


def test_a_rejected_write_is_said_at_once_not_waited_for(stack):
    c = stack.config
    writer = Writer(stack, f"ryw-bad-{int(time.time()) % 100000}")
    writer.cycles(1, lambda s, t: None)  # a row for the sensor, so that the key exists
    token = writer.write(b"{not json")
    with httpx.Client(base_url=c.rest_url, timeout=30) as http:
        started = time.monotonic()
        r = http.get(f"/v1/tables/{TABLE}/keys/{writer.sensor}", params={"after": token, "wait_ms": 20000})
        took = time.monotonic() - started
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["code"] == "WRITE_REJECTED" and "not_json" in err["message"]
        assert took < 5, f"the rejection took {took:.1f}s to be said"
        elsewhere = http.get(f"/v1/tables/{TABLE}/keys/{writer.sensor}",
                             params={"after": write_token(("orders", 0, 1))})
        assert elsewhere.status_code == 400 and elsewhere.json()["error"]["field"] == "after"
        assert f"{c.topic_prefix}readings" in elsewhere.json()["error"]["message"]

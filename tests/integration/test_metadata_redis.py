"""The metadata schema on a real redis-server: heartbeats expire, the assignor lease fences."""

import time

import pytest

from freshroute.metadata.assignment import Assignment
from freshroute.metadata.reports import NodeReport
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.tables import TableSpec

pytestmark = [pytest.mark.integration, pytest.mark.light]  # no Spark, no shared stack: runs beside the others


def test_tables_and_nodes(redis_url, namespace):
    store = MetadataStore.from_url(redis_url, namespace)
    store.register_tables([TableSpec("t", "t-changelog", 8, "k")])
    assert store.tables()["t"].partitions == 8
    store.publish_node(NodeReport("n1", "127.0.0.1:1", 1), ttl_ms=300)
    assert set(store.nodes()) == {"n1"}
    time.sleep(0.5)
    assert store.nodes() == {}  # the heartbeat expired


def test_assignor_lease_is_exclusive_and_fenced(redis_url, namespace):
    store = MetadataStore.from_url(redis_url, namespace)
    gen1 = store.try_acquire_assignor("n1", lease_ms=300)
    assert gen1 is not None
    assert store.try_acquire_assignor("n2", lease_ms=300) is None
    assert store.write_assignment(Assignment(gen1, {("t", 0): ("n1",)}), "n1", gen1)
    time.sleep(0.45)  # n1 stalls past its lease
    gen2 = store.try_acquire_assignor("n2", lease_ms=5000)
    assert gen2 is not None and gen2 > gen1
    # The deposed holder wakes up and tries to write: fenced off.
    assert not store.write_assignment(Assignment(gen1, {("t", 0): ("n1",)}), "n1", gen1)
    assert not store.renew_assignor("n1", gen1, 300)
    assert store.write_assignment(Assignment(gen2, {("t", 0): ("n2",)}), "n2", gen2)
    assert store.assignment().replicas[("t", 0)] == ("n2",)


def test_positions_between_reports_are_logged_read_and_forgotten(redis_url, namespace):
    from freshroute.heartbeats import NodeFeed, Rejections
    from freshroute.metadata.reports import NodePositions, ReplicaReport
    from freshroute.metadata.roles import ReplicaState, Role
    from freshroute.metadata.rounds import RoundRequest

    store = MetadataStore.from_url(redis_url, namespace)
    report = NodeReport("n1", "127.0.0.1:1", 1000, (ReplicaReport("t", 0, Role.ACTIVE, ReplicaState.ACTIVE, 5, 5, 0),))
    router_feed, assignor_feed = NodeFeed(Rejections("router"), positions=True), NodeFeed(Rejections("assignor"))
    store.rounds([RoundRequest("n1", 1000, 5000, report.to_json())])
    assert router_feed.poll(store.redis, store.keys) == {"n1"} == assignor_feed.poll(store.redis, store.keys)
    moved = NodePositions(1000, 1200, (9, 9, 0))
    [found] = store.rounds([RoundRequest("n1", 1200, 5000, None, moved.to_bytes())])
    assert found.report_held
    assert router_feed.poll(store.redis, store.keys) == set() and router_feed.positions == {"n1": moved}
    assert assignor_feed.poll(store.redis, store.keys) == set() and assignor_feed.positions == {}
    assert store.nodes()["n1"].replicas[0].applied == 9
    router_feed.poll(store.redis, store.keys)  # nothing new: nothing read again
    assert router_feed.positions == {"n1": moved}
    store.forget_nodes(["n1"])
    assert store.redis.exists(store.keys.node_positions("n1")) == 0
    assert store.redis.zscore(store.keys.positions, "n1") is None
    router_feed.poll(store.redis, store.keys)
    assert router_feed.positions == {} and router_feed.reports == {}

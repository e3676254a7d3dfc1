"""The metadata schema on a real redis-server: heartbeats expire, the assignor lease fences."""

import time

from freshroute.metadata import Assignment, MetadataStore, NodeReport, TableSpec


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

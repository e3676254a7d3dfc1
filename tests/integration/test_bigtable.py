"""The big-table bench's own code (loadtest/bigtable.py) at 100 thousand keys: a compacted topic written straight to
a real broker, served with ``table add`` by two real store node processes (one standby) and a real router, and
every one of its values served as the topic holds it. No Spark: it runs beside the others (``light``)."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from freshroute.metadata.store import MetadataStore
from freshroute.served_tables import add_table, remove_table
from loadtest.bigtable import mismatches, table_name, topic_name, wait_served, write_topic
from loadtest.loadclients import stop_process
from loadtest.restore import start_node, start_router, stop_node

from .stack_fixture import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.light]

KEYS = 100_000


@pytest.mark.timeout(300)
def test_a_table_of_100_thousand_keys_serves_every_value_its_topic_holds(broker, redis_url, namespace, tmp_path):
    md = MetadataStore.from_url(redis_url, namespace)
    admin = AdminClient({"bootstrap.servers": broker})
    topic, table = topic_name(namespace, "100k"), table_name("100k")
    write_topic(broker, topic, KEYS)
    nodes = [start_node(broker, redis_url, namespace, f"node-{i}", tmp_path / f"node-{i}", tmp_path / f"node-{i}.log")[0]
             for i in (1, 2)]
    router, rest_url = start_router(redis_url, namespace, tmp_path / "router.log")
    try:
        spec, warnings = add_table(md, admin, broker, table, topic, standby_replicas=1)
        assert spec.partitions == 12 and warnings == []

        def alive() -> None:
            for p in (router, *nodes):
                assert p.poll() is None, f"process {p.args} exited with {p.returncode}; see {tmp_path}"

        wait_until(lambda: b"router serving" in (tmp_path / "router.log").read_bytes(), 60, "the router to serve",
                   check=alive)
        served_s = wait_served(rest_url, table, 180)
        print(f"BIGTABLE: {KEYS:,} keys served by both replicas {served_s:.1f} s after table add")
        assert mismatches(rest_url, table, list(range(KEYS))) == []
        alive()
        remove_table(md, table)
    finally:
        stop_process(router)
        for node in nodes:
            stop_node(node)
        admin.delete_topics([topic])[topic].result(60)

"""A versioned table of the bench's own on the local stack: each key with ``versions`` versions a minute apart, written
to a compacted topic and added with ``freshroute table add --history-retention`` (``freshroute.served_tables``).

    with VersionedTable(stack.config, keys) as table:
        ...  # GET /v1/tables/{table.name}/keys/{key}?as_of={table.as_of_ms}

Everything is removed on the way out: the table from the metadata, the topic from the broker.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from freshroute.metadata.store import MetadataStore
from freshroute.served_tables import add_table, remove_table

NAME = "bench_versions"
PARTITIONS = 4
HISTORY_MS = 86_400_000
STEP_MS = 60_000


def version_times(versions: int, now_ms: int) -> list[int]:
    """The times of a key's versions: a minute apart, the last a minute before ``now_ms``."""
    return [now_ms - (versions - v) * STEP_MS for v in range(versions)]


class VersionedTable:
    """``keys`` × ``versions`` versions, the newest a minute old; ``as_of_ms`` is halfway through them."""

    def __init__(self, config: Any, keys: list[str], versions: int = 10, name: str = NAME) -> None:
        self.config = config
        self.keys = keys
        self.versions = versions
        self.name = name
        self.topic = f"{config.topic_prefix}{name}"
        now = int(time.time() * 1000)
        self.times = version_times(versions, now)
        self.as_of_ms = self.times[versions // 2] + STEP_MS // 2
        self._admin = AdminClient({"bootstrap.servers": config.bootstrap})

    def __enter__(self) -> "VersionedTable":
        from pipeline.topics import ensure_topic

        c = self.config
        ensure_topic(self._admin, self.topic, PARTITIONS, {"cleanup.policy": "compact"})
        producer = Producer({"bootstrap.servers": c.bootstrap, "partitioner": "murmur2_random", "linger.ms": 20})
        for j, at in enumerate(self.times):
            for key in self.keys:
                producer.produce(self.topic, key=key.encode(), value=orjson.dumps({"version": j, "key": key}),
                                 timestamp=at)
        if producer.flush(60) != 0:
            raise RuntimeError(f"the versions of {self.name} were not all written to {self.topic}")
        metadata = MetadataStore.at(c.redis_location(), c.namespace)
        add_table(metadata, self._admin, c.bootstrap, self.name, self.topic, history_retention_ms=HISTORY_MS,
                  kafka_config={"bootstrap.servers": c.bootstrap})
        self._wait_served()
        return self

    def _wait_served(self, within_s: float = 120.0) -> None:
        """Until every key answers as of ``as_of_ms`` with the version valid then, from any replica."""
        want = self.versions // 2
        deadline = time.monotonic() + within_s
        with httpx.Client(base_url=self.config.rest_url, timeout=5) as http:
            pending = list(self.keys)
            while pending:
                r = http.get(f"/v1/tables/{self.name}/keys/{pending[0]}", params={"as_of": self.as_of_ms})
                if r.status_code == 200 and r.json()["value"]["version"] == want:
                    pending.pop(0)
                    continue
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} was not served within {within_s:g} s: {r.status_code} {r.text}")
                time.sleep(0.5)

    def __exit__(self, *exc: object) -> None:
        c = self.config
        try:
            remove_table(MetadataStore.at(c.redis_location(), c.namespace), self.name)
        finally:
            for f in self._admin.delete_topics([self.topic], request_timeout=30).values():
                f.result(30)

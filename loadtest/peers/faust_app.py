"""The demo's sensor_stats in Faust (faust-streaming), served from its table by its web views: a key's request is
routed to the instance that owns the key's partition (``Table.route``), as Faust's documentation shows.

Run by ``python -m loadtest.peers`` in a virtual environment of its own (Faust's dependencies stay out of
freshroute's): ``python faust_app.py BOOTSTRAP TOPIC PARTITIONS APP_ID DATA_DIR PORT``.
"""

from __future__ import annotations

import json
import sys
import zlib

import faust
from aiohttp.web import Response

bootstrap, topic_name, partitions, app_id, data_dir, port = sys.argv[1:7]
# uvloop, as Faust's documentation recommends for speed (its `faust[uvloop]` extra).
sys.argv[1:] = ["--loop", "uvloop", "worker", "--web-host", "127.0.0.1", "--web-port", port, "--loglevel", "warn"]


def produced(key: bytes, partitions: list[int], available: list[int]) -> int:
    """Where the input's producers put a key: the demo producer is confluent-kafka's, whose default partitioner is
    librdkafka's CRC-32 of the key (aiokafka's, like Java's, is murmur2)."""
    return partitions[zlib.crc32(key) % len(partitions)]


# A killed worker's partitions move after the session timeout: 10 s, as the Kafka Streams peer's (Faust's is 60 s).
app = faust.App(app_id, producer_partitioner=produced, broker=f"kafka://{bootstrap}", datadir=data_dir,
                store="memory://", table_standby_replicas=1, consumer_auto_offset_reset="latest", web_enabled=True,
                broker_commit_every=100, broker_commit_interval=0.1, broker_session_timeout=10.0)
readings = app.topic(topic_name, key_type=bytes, value_serializer="raw", key_serializer="raw")
# Co-partitioned with the input, its keys the input's bytes: Table.route partitions a key as the table's changelog
# serializes it (JSON for str keys, a quoted string on another partition than the input's own).
stats = app.Table("sensor_stats", default=None, partitions=int(partitions), key_type=bytes)


@app.agent(readings)
async def aggregate(stream):
    async for key, value in stream.items():
        if key is None:
            continue
        try:
            r = float(json.loads(value)["reading"])
        except (ValueError, KeyError, TypeError):
            continue
        s = stats.get(key)
        stats[key] = ({"count": 1, "sum": r, "min": r, "max": r, "last": r} if s is None else
                      {"count": s["count"] + 1, "sum": s["sum"] + r, "min": min(s["min"], r), "max": max(s["max"], r),
                       "last": r})


@app.page("/v1/tables/sensor_stats/keys/{key}")
@app.table_route(table=stats, match_info="key")
async def lookup(web, request, key):
    s = stats.get(key.encode())
    if s is None:
        return Response(status=404, text='{"error":"not found"}', content_type="application/json")
    value = {**s, "avg": s["sum"] / s["count"]}
    return Response(text=json.dumps({"key": key, "value": value}), content_type="application/json")


if __name__ == "__main__":
    app.main()

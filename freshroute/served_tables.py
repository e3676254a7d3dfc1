"""Compacted topics served as they are: a table over a topic someone else writes (Kafka Streams, ksqlDB, Flink,
a service of one's own), registered beside the pipeline's tables (``freshroute table add``).

Registering is all it takes: the assignor places the new table's partitions like any other, store nodes restore
them from the topic with no restart, and routers and clients serve it at their next metadata refresh. Its keys
hash to partitions as Kafka's default partitioner does, so the topic must have been written keyed that way (any
Kafka client's default) — the check below reads a sample of records and refuses a topic whose records sit in other
partitions than their keys say.
"""

from __future__ import annotations

import re
import time
from typing import Any, Mapping

from confluent_kafka import KafkaException

from freshroute.errors import InvalidArgument, RetryableError, TableNotFound
from freshroute.formats import KEY_FORMATS, VALUE_FORMATS, key_problem, value_problem
from freshroute.keys import partition_for
from freshroute.metadata.catch_up import CatchUp
from freshroute.metadata.store import MetadataStore
from freshroute.metadata.table_versions import VersionedTable, listing
from freshroute.metadata.tables import MAX_STANDBY_REPLICAS, TableSpec
from freshroute.topics import describe_topic, failure, keep_history, topic_config

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SAMPLE_PER_PARTITION = 100  # records read from the start of each partition to check the formats and placement
SAMPLE_TIMEOUT_S = 30.0


class TableRefused(InvalidArgument):
    """A table that cannot be added or removed as asked; the message says why and what would do."""


def add_table(metadata: MetadataStore, admin: Any, bootstrap: str, name: str, topic: str, *, key_format: str = "string",
              value_format: str = "json", standby_replicas: int = 1, allow_uncompacted: bool = False,
              history_retention_ms: int = 0,
              kafka_config: dict[str, str] | None = None) -> tuple[TableSpec, list[str]]:
    """Register ``topic`` as table ``name``; returns the spec and warnings. Refused (TableRefused) when the name is not
    an identifier or is taken, the topic does not exist, is not compacted (unless ``allow_uncompacted``), or a
    sampled record's key or value is not of the formats given or sits in another partition than its key's.

    A versioned table (``history_retention_ms`` > 0) keeps every version of a key for that long, each from its
    record's Kafka timestamp; the topic's compaction is set to keep them (``min.compaction.lag.ms``), and a topic that
    deletes records sooner by time is refused."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise TableRefused(f"table name {name!r} must be a plain identifier (letters, digits, _)", field="name")
    if key_format not in KEY_FORMATS:
        raise TableRefused(f"--key-format must be one of {', '.join(KEY_FORMATS)}, not {key_format!r}", field="key_format")
    if value_format not in VALUE_FORMATS:
        raise TableRefused(f"--value-format must be one of {', '.join(VALUE_FORMATS)}, not {value_format!r}",
                           field="value_format")
    if not 0 <= standby_replicas <= MAX_STANDBY_REPLICAS:
        raise TableRefused(f"--standby-replicas must be within 0..{MAX_STANDBY_REPLICAS}", field="standby_replicas")
    if type(history_retention_ms) is not int or history_retention_ms < 0:
        raise TableRefused(f"--history-retention must be a positive duration, not {history_retention_ms!r}",
                           field="history_retention")
    existing = metadata.tables()
    if name in existing:
        taken = existing[name]
        by = "the pipeline" if taken.origin == "pipeline" else f"topic {taken.topic}"
        raise TableRefused(f"table {name!r} exists already (served from {by}); choose another name", field="name")
    try:
        info = describe_topic(admin, topic)
        config = topic_config(admin, topic) if info is not None else {}
    except (KafkaException, TimeoutError) as e:
        raise RetryableError(f"the broker at {bootstrap} (--bootstrap-servers) did not describe topic {topic!r}: "
                             f"{failure(e)}", setting="bootstrap_servers") from None
    if info is None:
        raise TableRefused(f"topic {topic!r} does not exist on {bootstrap}", field="topic")
    warnings = []
    policy = config.get("cleanup.policy", "delete")
    if "compact" not in policy.split(","):
        why = (f"topic {topic!r} is not compacted (cleanup.policy={policy}): records it deletes by time vanish from "
               f"a store node's restore, and its restores read every record ever kept")
        if not allow_uncompacted:
            raise TableRefused(f"{why}; pass --allow-uncompacted to serve it anyway", field="topic")
        warnings.append(why)
    if history_retention_ms:
        warnings += _keep_history(admin, bootstrap, topic, config, history_retention_ms)
    partitions = len(info.partitions)
    for problem in sample_problems(bootstrap, topic, partitions, key_format, value_format, kafka_config or {}):
        raise TableRefused(f"topic {topic!r}: {problem}", field="topic")
    spec = TableSpec(name, topic, partitions, key_column="key", value_schema={}, standby_replicas=standby_replicas,
                     key_format=key_format, value_format=value_format, origin="topic",
                     history_retention_ms=history_retention_ms)
    metadata.register_tables([spec])
    return spec, warnings


def _keep_history(admin: Any, bootstrap: str, topic: str, config: dict[str, str], retention_ms: int) -> list[str]:
    """Make the topic keep a versioned table's history: refused when it deletes records by time sooner, its
    compaction set to keep them when it would not; returns what was changed."""
    policy = config.get("cleanup.policy", "delete").split(",")
    kept = int(config.get("retention.ms", "-1"))
    if "delete" in policy and 0 <= kept < retention_ms:
        raise TableRefused(f"topic {topic!r} deletes records after retention.ms={kept}, sooner than "
                           f"--history-retention ({retention_ms} ms): its versions would vanish from restores; raise "
                           f"its retention.ms or shorten the history", field="history_retention")
    try:
        changed = keep_history(admin, topic, config, retention_ms)
    except (KafkaException, TimeoutError) as e:
        raise RetryableError(f"the broker at {bootstrap} (--bootstrap-servers) did not set min.compaction.lag.ms on "
                             f"topic {topic!r}: {failure(e)}", setting="bootstrap_servers") from None
    return [changed] if changed else []


def remove_table(metadata: MetadataStore, name: str) -> TableSpec:
    """Stop serving a table added with :func:`add_table` (store nodes let its replicas go); a pipeline's table is
    refused: it comes back with the pipeline's next start."""
    spec = metadata.tables().get(name)
    if spec is None:
        raise TableNotFound(f"no table {name!r}", table=name)
    if spec.origin == "pipeline":
        raise TableRefused(f"table {name!r} is computed by the pipeline: remove it from the tables file instead",
                           field="name")
    metadata.remove_table(name)
    return spec


def sample_problems(bootstrap: str, topic: str, partitions: int, key_format: str, value_format: str,
                    kafka_config: dict[str, str]) -> list[str]:
    """What is wrong with the first records of each partition (at most one problem per partition): a null key, a
    key or value not of its format, or a key in another partition than Kafka's default partitioner puts it."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**kafka_config, "bootstrap.servers": bootstrap, "group.id": "freshroute-table-add",
                         "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    problems: list[str] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen = {p: 0 for p in range(partitions)}
        done: set[int | None] = set()  # None: an error of no partition
        deadline = time.monotonic() + SAMPLE_TIMEOUT_S
        while len(done) < partitions and time.monotonic() < deadline:
            # A short wait: consume() waits for its whole count or its timeout, and a sample is often smaller.
            for m in consumer.consume(500, timeout=0.2):
                p = m.partition()
                if p in done:
                    continue
                if m.error() is not None:
                    done.add(p)  # the end (partition EOF) or an error: the sample of this partition is over
                    continue
                assert p is not None  # a record names its partition
                problem = _record_problem(m.key(), m.value(), p, partitions, key_format, value_format)
                seen[p] += 1
                if problem is not None:
                    problems.append(f"partition {p} offset {m.offset()}: {problem}")
                    done.add(p)
                elif seen[p] >= SAMPLE_PER_PARTITION:
                    done.add(p)
    finally:
        consumer.close()
    return problems


def _record_problem(key: bytes | None, value: bytes | None, partition: int, partitions: int, key_format: str,
                    value_format: str) -> str | None:
    if key is None:
        return "a record without a key: a table's records are keyed"
    problem = key_problem(key_format, key) or (value_problem(value_format, value) if value is not None else None)
    if problem is not None:
        flag = "--key-format" if problem.startswith("key") else "--value-format"
        return f"{problem} (given {flag} {key_format if flag == '--key-format' else value_format})"
    if partition_for(key, partitions) != partition:
        return (f"key {key[:40]!r} is in partition {partition}, where Kafka's default partitioner would not put it "
                f"(it says {partition_for(key, partitions)}): lookups would miss it")
    return None


def describe(spec: TableSpec, versions: VersionedTable | None = None,
             input_lags: Mapping[int, tuple[int, int]] | None = None,
             catch_ups: Mapping[int, CatchUp] | None = None) -> dict[str, Any]:
    """One table as ``freshroute table list`` shows it, with its versions where the pipeline keeps a record of them
    (a topic served as it is has one version and no record): each with its input lag (``input_lags``, where known)
    and, building, its progress and estimate (``catch_ups``; :func:`freshroute.metadata.catch_up.version_figures`)."""
    return {"name": spec.name, "topic": spec.topic, "partitions": spec.partitions, "origin": spec.origin,
            "key_format": spec.key_format, "value_format": spec.value_format,
            "standby_replicas": spec.standby_replicas, "windowed": spec.window is not None,
            "history_retention_ms": spec.history_retention_ms,
            **listing(versions, {v: {"records": r, "ms": ms} for v, (r, ms) in (input_lags or {}).items()},
                      {v: way.to_dict() for v, way in (catch_ups or {}).items()})}

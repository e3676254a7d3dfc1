"""Typed settings of one store node, read from flags and ``FRESHROUTE_*`` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, create_model, model_validator

from freshroute.heartbeats import NodeExpiry
from freshroute.metadata.reports import NODE_ID_PATTERN
from freshroute.settings import ServingSettings, embedded


class _StoreNodeProcess(ServingSettings):
    """Where a store node serves, where it keeps its replicas, and how it paces its loops."""

    node_id: str = Field(min_length=1, pattern=NODE_ID_PATTERN, description="this node's unique id")
    host: str = Field("127.0.0.1", description="interface the gRPC server binds")
    port: int = Field(0, ge=0, le=65535, description="gRPC port; 0 lets the OS pick (the bound port is printed)")
    read_port: int = Field(0, ge=0, le=65535, description="read port: the router's lookups as length-prefixed "
                                                          "frames on TCP (TLS with tls_cert); 0 lets the OS pick")
    read_port_front: Literal["compiled", "python"] = Field(
        "compiled", description="compiled: a thread of the compiled path (native/dataplane) accepts and reads the "
        "read port's connections, the GIL taken only to answer; python: the event loop serves the port (also where "
        "the compiled path is not built, or rustls cannot serve tls_cert and tls_key)")
    metrics_port: int | None = Field(None, ge=0, le=65535,
                                     description="serve Prometheus /metrics (every replica's lag, progress and "
                                                 "counters) on this port of host; 0 lets the OS pick; unset: none")
    advertise_host: str | None = Field(None, description="host other processes dial (default: host)")
    data_dir: Path | None = Field(None, description="replica stores (default .freshroute/store/NODE_ID); "
                                                    "never shared by two nodes")
    rack: str | None = Field(None, description="rack tag; replicas of a partition are spread across racks")

    # A dead node's actives move to their standbys about node_expiry_ms (embedded below, as routers
    # read it) + assignment_poll_ms after its last heartbeat.
    heartbeat_ms: int = Field(200, gt=0, description="how often the node publishes its heartbeat and lag")
    node_report_ttl_ms: int = Field(5000, gt=0, description="Redis TTL of a heartbeat")
    assignor_lease_ms: int = Field(1200, gt=0, description="assignor lease; another node takes over after it")
    assignment_poll_ms: int = Field(100, gt=0, description="how often the node reads the assignment (and the "
                                                           "assignor recomputes it)")

    block_cache_mb: int = Field(256, ge=8, le=1 << 20, description="RocksDB memory of the node, shared by all its "
                                "replicas: the block cache, with the memtables charged to it (at most half)")
    apply_batch_max: int = Field(5000, gt=0, description="records per poll, applied with one checkpoint per partition")
    # Within this many offsets of a fresh end offset a replica has caught up: it leaves
    # RESTORING, and the assignor treats it as warm enough to take the active role.
    caught_up_threshold: int = Field(100, ge=0, description="offsets from the end that count as caught up")
    apply_rate_limit: int = Field(0, ge=0, description="records/s this node applies at most (0 = unlimited), "
                                                       "so a restore cannot starve reads")
    bulk_restore: bool = Field(True, description="restore an empty replica in bulk: its changelog read to the end "
                               "by the native reader (native/bulkload) into table files its store ingests whole; "
                               "not while apply_rate_limit is set (false: record by record, like a replica that "
                               "resumes)")

    # Bounded per-partition fetches: the broker fills a Fetch partition by partition up to the
    # byte limit, so one partition far behind would otherwise starve the others. 1 MiB rather
    # than 256 KiB: a restore makes a quarter of the round trips.
    max_partition_fetch_bytes: int = Field(1024 * 1024, gt=0, description="fetch bytes per partition")
    fetch_max_bytes: int = Field(4 * 1024 * 1024, gt=0, description="fetch bytes per request")
    fetch_wait_max_ms: int = Field(100, gt=0, description="broker long-poll, below evidence_window_ms; bounds how "
                                                          "old the end offset can be, and costs the broker a fetch "
                                                          "per wait per node while idle")
    statistics_interval_ms: int = Field(100, gt=0, description="consumer statistics (end offsets, broker state)")
    evidence_window_ms: int = Field(1000, gt=0, description="a caught-up confirmation needs a broker response "
                                                            "at most this old; without one a replica's offset lag "
                                                            "is unknown")
    topic_check_ms: int = Field(2000, gt=0, description="how often changelog topic ids are checked for a "
                                                        "recreated topic")

    # A move the assignor makes (a node judged dead a moment too soon, a rebalance) is not a gap in
    # service: the replica it leaves answers while the ones it places restore, or until it is placed back.
    moved_replica_serve_ms: int = Field(10_000, ge=0, description="a replica moved away keeps serving, as a "
                                        "standby, this long; 0: it stops at once")
    removed_replica_grace_ms: int = Field(30_000, ge=0, description="files of a replica moved away are deleted "
                                                                    "this long after it stops serving")
    drain_timeout_ms: int = Field(1500, ge=0, description="on SIGTERM: announce draining, keep answering this long")
    restore_log_interval_ms: int = Field(5000, gt=0, description="restore progress log period")

    @model_validator(mode="after")
    def _fetch_wait_within_evidence(self) -> "_StoreNodeProcess":
        # A caught-up confirmation needs a fetch answer younger than the window: a longer
        # long-poll would leave no replica ever confirmed.
        if self.fetch_wait_max_ms >= self.evidence_window_ms:
            raise ValueError(f"fetch_wait_max_ms ({self.fetch_wait_max_ms}) must be below evidence_window_ms "
                             f"({self.evidence_window_ms})")
        return self

    @model_validator(mode="after")
    def _dialable(self) -> "_StoreNodeProcess":
        # Routers and clients dial what a node advertises: a wildcard is where it listens, not an address.
        if self.advertise_host is None and self.host in ("0.0.0.0", "::", ""):
            raise ValueError(f"host {self.host!r} listens on every interface: set advertise_host to the address "
                             f"routers and clients dial")
        return self

    @model_validator(mode="after")
    def _default_data_dir(self) -> "_StoreNodeProcess":
        if self.data_dir is None:
            # Frozen model: set through the object's dict, once, at validation time.
            object.__setattr__(self, "data_dir", Path(".freshroute") / "store" / self.node_id)
        return self

    @property
    def replica_root(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir

    def bulk_reader_config(self) -> dict[str, str]:
        """librdkafka settings of a bulk restore's reader, as the strings the native reader takes."""
        config = self.consumer_config(**{
            "client.id": f"freshroute-store-{self.node_id}-bulk",
            "statistics.interval.ms": 0,
            # The end of a partition is known only after a fetch comes back empty: a long wait would be restore time.
            "fetch.wait.max.ms": 10,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "queued.max.messages.kbytes": 64 * 1024,
        })
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in config.items()}

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka settings of the node's single changelog consumer."""
        return self.kafka(**{
            "group.id": f"{self.namespace}.store.{self.node_id}",  # never joined, never committed
            "client.id": f"freshroute-store-{self.node_id}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Never jump silently: an out-of-range position means the changelog was truncated or
            # replaced, which the tailer handles by wiping the replica and restoring from the start.
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "statistics.interval.ms": self.statistics_interval_ms,
            "fetch.wait.max.ms": self.fetch_wait_max_ms,
            # While a replica restores, librdkafka's fetch queue stays full and, without a backoff, its
            # fetch thread re-checks it without pause, spinning on the CPU the applying thread needs. A
            # 10 ms pause costs no restore time (the full queue holds about a second of records) and no
            # freshness (a replica that keeps up never fills it).
            "fetch.queue.backoff.ms": 10,
            "max.partition.fetch.bytes": self.max_partition_fetch_bytes,
            "fetch.max.bytes": self.fetch_max_bytes,
            "queued.max.messages.kbytes": 16 * 1024,
            "topic.metadata.refresh.interval.ms": 5000,
            "socket.keepalive.enable": True,
            # Reconnect quickly to a restarted broker; the repeated failures are logged once.
            "reconnect.backoff.ms": 200,
            "reconnect.backoff.max.ms": 2000,
            **overrides,
        })


# When a node is dead is one fact of the deployment: routers and the assignor read heartbeats by the same expiry.
StoreNodeSettings = create_model("StoreNodeSettings", __base__=_StoreNodeProcess, __module__=__name__,
                                 __doc__=_StoreNodeProcess.__doc__, **embedded(NodeExpiry))

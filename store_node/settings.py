"""Typed settings of one store node, read from flags and ``FRESHROUTE_*`` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from freshroute.settings import CommonSettings


class StoreNodeSettings(CommonSettings):
    """Where a store node serves, where it keeps its replicas, and how it paces its loops."""

    node_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)  # 0: the OS picks; the bound port is logged and printed
    # The host other processes dial; defaults to ``host`` (set it when binding 0.0.0.0).
    advertise_host: str | None = None
    # Defaults to .freshroute/store/{node_id}: two nodes must never share a directory.
    data_dir: Path | None = None
    rack: str | None = None

    heartbeat_ms: int = Field(200, gt=0)
    node_expiry_ms: int = Field(2000, gt=0)  # a node whose heartbeat is older is dead
    node_report_ttl_ms: int = Field(5000, gt=0)  # Redis TTL of a heartbeat; a killed node's key disappears
    assignor_lease_ms: int = Field(2000, gt=0)
    assignment_poll_ms: int = Field(200, gt=0)

    apply_batch_max: int = Field(5000, gt=0)  # records per consume() call, applied per partition in one batch
    # A replica within this many offsets of the end, with fresh evidence from the broker, has caught up:
    # it leaves RESTORING, and the assignor treats it as warm enough to take the active role.
    caught_up_threshold: int = Field(100, ge=0)
    # Records per second this node applies at most (0 = unlimited), so a restore cannot starve reads.
    apply_rate_limit: int = Field(0, ge=0)

    # Bounded per-partition fetches: the broker fills a Fetch partition by partition up to the
    # byte limit, so one partition far behind would otherwise starve the others.
    max_partition_fetch_bytes: int = Field(256 * 1024, gt=0)
    fetch_max_bytes: int = Field(4 * 1024 * 1024, gt=0)
    fetch_wait_max_ms: int = Field(100, gt=0)
    statistics_interval_ms: int = Field(100, gt=0)
    # A caught-up confirmation needs a broker response at most this old.
    evidence_window_ms: int = Field(1000, gt=0)
    topic_check_ms: int = Field(2000, gt=0)  # how often changelog topic ids are compared to the stored ones

    removed_replica_grace_ms: int = Field(30_000, ge=0)  # data of a replica moved away is deleted after this
    drain_timeout_ms: int = Field(1500, ge=0)  # on SIGTERM: announce draining, then keep answering this long
    restore_log_interval_ms: int = Field(5000, gt=0)

    @model_validator(mode="after")
    def _default_data_dir(self) -> "StoreNodeSettings":
        if self.data_dir is None:
            # Frozen model: set through the object's dict, once, at validation time.
            object.__setattr__(self, "data_dir", Path(".freshroute") / "store" / self.node_id)
        return self

    @property
    def replica_root(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir

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
            "fetch.queue.backoff.ms": 0,
            "max.partition.fetch.bytes": self.max_partition_fetch_bytes,
            "fetch.max.bytes": self.fetch_max_bytes,
            "queued.max.messages.kbytes": 16 * 1024,
            "topic.metadata.refresh.interval.ms": 5000,
            "socket.keepalive.enable": True,
            **overrides,
        })

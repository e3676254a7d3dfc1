"""A table as the pipeline declares it in the metadata store, for the store nodes that serve it and the routers
that read it: its changelog topic, partitions, key, formats, freshness defaults and how it is computed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import orjson

from freshroute.windows import WindowSpec

# A standby per node on the largest clusters anyone runs from one assignor: more is a typo.
MAX_STANDBY_REPLICAS = 16


@dataclass(frozen=True)
class TableSpec:
    """A table the pipeline materializes and store nodes serve."""

    name: str
    topic: str
    partitions: int
    key_column: str
    value_schema: dict[str, str] = field(default_factory=dict)
    standby_replicas: int = 1
    default_max_lag: int | None = None
    default_max_staleness_ms: int | None = None
    window: WindowSpec | None = None  # a windowed table's windows; None: a plain keyed table
    input_topic: str | None = None  # the Kafka topic the table is computed from
    # How the topic holds keys and values (freshroute.formats); "topic": a compacted topic served as it is
    # (`freshroute table add`), not written by the pipeline.
    key_format: str = "string"
    value_format: str = "json"
    origin: str = "pipeline"
    pipeline_mode: str | None = None  # how the pipeline runs its query: "realtime" or "microbatch" (None: a topic's)
    query: str | None = None  # the pipeline's streaming query that computes it (None: a topic's)
    # A versioned table keeps every version of a key this long after it stopped being true (store_node/history.py);
    # 0: only the latest value.
    history_retention_ms: int = 0

    @property
    def versioned(self) -> bool:
        return self.history_retention_ms > 0

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "TableSpec":
        d = orjson.loads(raw)
        window = d.pop("window", None)
        # Fields a newer pipeline added are ignored, so a rolling upgrade keeps older readers working.
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known, window=WindowSpec.from_dict(window) if window else None)

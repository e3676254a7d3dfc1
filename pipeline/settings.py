"""Settings of the pipeline process: where tables are defined, how often micro-batches run, where state lives."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from freshroute.metadata.version_switch import DEFAULT_SWITCH_LAG

from freshroute.metadata.tables import MAX_STANDBY_REPLICAS
from freshroute.settings import CommonSettings
from freshroute.windows import duration_ms

DEMO_TABLES_FILE = Path(__file__).resolve().parent / "demo_tables.py"
REPO = Path(__file__).resolve().parents[1]
# A trigger past a minute serves minutes-old tables: a batch job, not an interactive one.
MAX_TRIGGER_MS = 60_000
# A replay re-reads at most one checkpoint interval of input, after a restart of a few tens of seconds (27 s measured
# on the demo stack); ten intervals leave room for a restart that fails and is retried.
REPLAY_COMPACTION_LAG_INTERVALS = 10
REPLAY_COMPACTION_LAG_MIN_MS = 600_000


class PipelineSettings(CommonSettings):
    """Typed pipeline settings, from flags and ``FRESHROUTE_*`` environment variables."""

    tables_file: Path = Field(DEMO_TABLES_FILE, description="Python file that defines the input sources and tables")
    checkpoint_dir: Path = Field(Path(".freshroute/pipeline/checkpoints"),
                                 description="Spark checkpoints (offsets, commits, RocksDB state), one subdirectory per query")
    pipeline_mode: Literal["realtime", "microbatch"] = Field(
        "realtime", description="how tables' queries run unless a table says (pipeline_mode= in the tables file): "
                                "realtime (Spark's Real-time Mode: long-running tasks, each change in the changelog "
                                "within milliseconds) or microbatch (a batch every trigger_ms)")
    realtime_checkpoint_interval: str = Field(
        "1 minute", description="how often a Real-time query checkpoints its offsets and state (at least 5 seconds): "
                                 "a crash replays up to this much input, and each checkpoint pauses processing for "
                                 "a moment")
    spark_jit: Literal["auto", "tiered", "client"] = Field(
        "auto", description="the Spark JVMs' just-in-time compiler: tiered (C1, then C2 for hot code: the lowest cost "
                            "a row, after minutes of compiling), client (C1 only: the pipeline starts in about half "
                            "the time and CPU, and a row costs more), auto (client for a pipeline of micro-batches "
                            "only, tiered once a table runs in Real-time Mode)")
    trigger_ms: int = Field(500, ge=0, le=MAX_TRIGGER_MS,
                            description="micro-batch interval in milliseconds (0 = as fast as possible), at most "
                                        f"{MAX_TRIGGER_MS}: lower is fresher and costs more CPU")
    standby_replicas: int = Field(1, ge=0, le=MAX_STANDBY_REPLICAS,
                                  description="standbys of each partition besides its active, for tables whose "
                                              "definition names none (each replica on a distinct store node)")
    changelog_replication_factor: int = Field(
        1, ge=1, le=16, description="copies of each changelog partition on the brokers, for changelogs the pipeline "
                                    "creates (1 for the embedded broker; 3 on a real cluster), checked at start "
                                    "against the broker count")
    changelog_min_insync_replicas: int = Field(
        1, ge=1, le=16, description="min.insync.replicas of the changelogs the pipeline creates: with acks=all, a "
                                    "change is acknowledged once this many copies hold it (2 with a factor of 3)")
    changelog_segment_ms: int = Field(
        600_000, ge=1_000, description="segment.ms of the changelogs the pipeline creates: Kafka compacts only closed "
                                       "segments, so this bounds how long superseded values stay in a changelog")
    changelog_min_cleanable_dirty_ratio: float = Field(
        0.5, gt=0, le=1, description="min.cleanable.dirty.ratio of the changelogs the pipeline creates: the share of "
                                     "superseded records at which the cleaner compacts a changelog")
    changelog_min_compaction_lag_ms: int | None = Field(
        None, ge=0, description="min.compaction.lag.ms of the changelogs the pipeline writes (raised at start on "
                                "those that hold less): "
                                "a Real-time query's replay after a crash writes older rows of its keys "
                                "again, and until it has caught up the cleaner must not drop the newer row they follow "
                                "(docs/architecture.md); unset: ten checkpoint intervals, at least 10 minutes")
    changelog_partitions: int = Field(8, ge=1, description="partitions of a changelog topic the pipeline creates")
    # Frozen into each query's checkpoint on its first run: changing it later has no effect on that query. A
    # Real-time query holds a task per shuffle partition for its life beside one per input partition, and each
    # checkpoint commits every partition's state. A source's tables share one aggregation (pipeline.fusion), which
    # one partition leaves on one core: on the demo stack a 100,000-reading burst took 68–88 s with one and 41 s
    # with two, at the same CPU at rest (docs/benchmarks.md). A micro-batch query pays a task, a commit and a state
    # file per partition per batch, whatever it holds.
    shuffle_partitions: int = Field(2, ge=1, description="Spark shuffle partitions (state store partitions) of a "
                                                         "query's first start: more spread a stateful query over "
                                                         "more cores")
    max_records_per_batch: int = Field(100_000, ge=0, description="admission control: input records per micro-batch (0 = no limit)")
    auto_switch: bool = Field(True, description="serve a table's new version as soon as it has caught up with its "
                              "input (within switch_lag); off: `freshroute table switch` does it")
    switch_lag: int = Field(DEFAULT_SWITCH_LAG, ge=0, description="how far behind its input (records) and its changelog (offsets) "
                            "a table's new version may be when it is switched to")
    retain_previous: str = Field("1h", description="how long the version served before a switch is kept up to date "
                                 "for a rollback (a duration: 1h, 30m, 10s)")
    available_now: bool = Field(False, description="process the input present at start, then stop (backfills, tests); "
                                                   "in micro-batches, whatever pipeline_mode says")
    topic_prefix: str = Field("", description="prefix of every input and changelog topic name")
    create_input_topics: bool = Field(False, description="create a source's input topic that does not exist "
                                                         "(default: refuse to start, naming it)")
    input_partitions: int = Field(4, ge=1, description="partitions of an input topic the pipeline creates "
                                                       "(create_input_topics)")
    spark_master: str = Field("local[*]", description="Spark master URL")
    jars_dir: Path = Field(REPO / ".jvm", description="where Maven put the JVM artifacts (jvm/pom.xml): Spark's Kafka "
                                                      "connector is read from its spark-kafka folder")
    spark_driver_memory: str = Field("1g", description="Spark driver JVM heap")
    spark_conf: dict[str, str] = Field(
        default_factory=dict, description="more Spark settings, as JSON "
                                          "(FRESHROUTE_SPARK_CONF='{\"spark.x\": \"1\"}'), applied over "
                                          "freshroute's own: for tuning a deployment's Spark")
    spark_executor_memory: str = Field("1g", description="heap of each executor, on a Spark cluster")
    spark_worker_python: str = Field("", description="on a Spark cluster: the Python every worker runs, with "
                                                     "freshroute's dependencies installed (default: this process's "
                                                     "interpreter path, which must then exist on each worker)")
    metrics_port: int | None = Field(None, ge=0, le=65535,
                                     description="serve Prometheus /metrics (each table's last micro-batch: duration, "
                                                 "input rows and rates, watermark) on metrics_host at this port "
                                                 "(0: the OS picks); unset: none")
    metrics_host: str = Field("127.0.0.1", description="interface of the metrics endpoint")

    @field_validator("retain_previous")
    @classmethod
    def _retain_previous(cls, value: str) -> str:
        if duration_ms(value, "retain_previous") < 0:
            raise ValueError(f"retain_previous must be a duration such as 1h, not {value!r}")
        return value

    @field_validator("realtime_checkpoint_interval")
    @classmethod
    def _checkpoint_interval(cls, value: str) -> str:
        if not 5_000 <= duration_ms(value, "realtime_checkpoint_interval") <= 86_400_000:
            raise ValueError(f"realtime_checkpoint_interval must be from 5 seconds to a day, not {value!r}")
        return value

    def mode_of(self, table: Any) -> str:
        """How a table's query runs: as the table says, else ``pipeline_mode``; micro-batches in a run to the input's
        end (``available_now``: a Real-time query has none)."""
        return "microbatch" if self.available_now else table.pipeline_mode or self.pipeline_mode

    @property
    def retain_previous_ms(self) -> int:
        return duration_ms(self.retain_previous, "retain_previous")

    @property
    def realtime_checkpoint_ms(self) -> int:
        return duration_ms(self.realtime_checkpoint_interval, "realtime_checkpoint_interval")

    @model_validator(mode="after")
    def _insync_within_factor(self) -> "PipelineSettings":
        if self.changelog_min_insync_replicas > self.changelog_replication_factor:
            raise ValueError(f"changelog_min_insync_replicas {self.changelog_min_insync_replicas} is above "
                             f"changelog_replication_factor {self.changelog_replication_factor}: no write could "
                             f"ever be acknowledged")
        return self

    @property
    def replay_compaction_lag_ms(self) -> int:
        """How long a changelog record stays uncompacted: longer than a replay after a crash takes to catch up."""
        if self.changelog_min_compaction_lag_ms is not None:
            return self.changelog_min_compaction_lag_ms
        return max(REPLAY_COMPACTION_LAG_MIN_MS, REPLAY_COMPACTION_LAG_INTERVALS * self.realtime_checkpoint_ms)

    def changelog_config(self) -> dict[str, str]:
        """Topic config of a changelog the pipeline creates."""
        # A record's timestamp is when the broker appended it: when the change entered the changelog, which is what
        # a replica's staleness is reckoned against (a producer's clock at send would date a row held up in its
        # buffer, by a broker's failover, to before it existed).
        config = {"cleanup.policy": "compact", "message.timestamp.type": "LogAppendTime",
                  "segment.ms": str(self.changelog_segment_ms),
                  "min.cleanable.dirty.ratio": str(self.changelog_min_cleanable_dirty_ratio),
                  "min.compaction.lag.ms": str(self.replay_compaction_lag_ms)}
        if self.changelog_replication_factor > 1:
            config["min.insync.replicas"] = str(self.changelog_min_insync_replicas)
        return config

    def input_topic(self, source_topic: str) -> str:
        return f"{self.topic_prefix}{source_topic}"

    def changelog_topic(self, table: str) -> str:
        return f"{self.topic_prefix}{table}-changelog"

    def query_checkpoint(self, query: str) -> Path:
        """A streaming query's checkpoint (a table's own query is named after the table)."""
        return self.checkpoint_dir / query

    def window_index(self, table: str) -> Path:
        """A windowed table's index of the windows it wrote, by expiry."""
        return self.checkpoint_dir / f"{table}.windows"

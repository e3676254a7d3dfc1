"""A streaming query of some tables, whatever its mode: what the pipeline's supervising loop asks of each.

One kind of query per mode: :class:`pipeline.microbatch_query.MicrobatchQuery` (a batch every trigger, its rows through
the Python sink) and :class:`pipeline.realtime_query.RealtimeQuery` (Spark's Real-time Mode: long-running tasks, rows
through Spark's Kafka sink). Each is planned before Spark starts (the task slots it may hold size the session), built
once the session runs (its frames, its tables' changelogs and writers), then started, and started again from its
checkpoint after a failure; each knows what its batches' progress says of its tables and when it runs at its steady
pace.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from pipeline.input_lag import source_offsets
from pipeline.sink import ChangelogProducer, RejectWriter
from pipeline.tables import Table, TablesDefinition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from pipeline.follower import OutputFollower
    from pipeline.input_lag import InputLagPublisher
    from pipeline.outputs import TableRun
    from pipeline.reflected import ReflectionPublisher
    from pipeline.settings import PipelineSettings


@dataclass
class QueryContext:
    """What a pipeline's queries share: its settings and tables, the Spark session, and where their progress goes."""

    settings: PipelineSettings
    definition: TablesDefinition
    producer: ChangelogProducer
    spark: SparkSession | None = None
    microbatches: bool = False  # whether any query runs micro-batches
    slots: int = 0  # the task slots the queries hold for their life
    input_partitions: dict[str, int] = field(default_factory=dict)  # source → partitions of its input topic
    beside: frozenset[str] = frozenset()  # tables that are versions built or kept beside the served ones
    ghosts: frozenset[str] = frozenset()  # retired versions a shared query computes for its state, written nowhere
    windowed_changelogs: list[str] = field(default_factory=list)  # the changelog topics of windowed tables
    input_lag: InputLagPublisher | None = None
    follower: OutputFollower | None = None
    reflected: ReflectionPublisher | None = None

    def source_tables(self, source: str, own: Iterable[Table] = ()) -> list[Table]:
        """Every table of ``source`` whose keys and window time columns its records must have: those served, and
        ``own``, the asking query's. A version built beside the served ones takes the records they take, and
        changes nothing of what is rejected."""
        own_names = {t.name for t in own}
        return [t for t in self.definition.tables.values()
                if t.source == source and (t.name not in self.beside or t.name in own_names)]


class Query(ABC):
    """One streaming query, of one or more tables of one source (or of a source's rejected records), and what it needs
    to be supervised and restarted."""

    # The task slots it holds for its life, known once it is built.
    task_slots: int = 0
    # What the pipeline's warm line says when queries of this kind are what it waited for.
    WARM_REASON: str

    def __init__(self, context: QueryContext, name: str, source: str, tables: list[Table]) -> None:
        self.context = context
        self.name = name
        self.source = source
        self.tables = tables
        self.runs: list[TableRun] = []  # its tables' changelogs and writers, once built
        self.rejects: RejectWriter | None = None  # its source's rejected records, if this query writes them
        self.query: StreamingQuery | None = None
        self.failures: list[float] = []  # when it failed, within the restart window
        self.finished = False
        self.logged_batch = -1

    @property
    def label(self) -> str:
        """How log lines and errors name it: by its table, or by its name and its tables."""
        names = [t.name for t in self.tables]
        if not names:
            return f"query {self.name}"
        return f"table {self.name}" if names == [self.name] else f"query {self.name} ({', '.join(names)})"

    @property
    def windowed(self) -> TableRun | None:
        """The query's windowed table: its watermark is the query's."""
        return next((r for r in self.runs if r.table.window is not None and not r.ghost), None)

    def prepare(self, admin: Any) -> None:
        """Before Spark starts: what the query needs of the broker (nothing, unless its kind says)."""

    @abstractmethod
    def most_slots(self) -> int:
        """The task slots it may hold for its life, before it is planned: what the session is sized for."""

    @abstractmethod
    def build(self, admin: Any, rejects: RejectWriter) -> None:
        """Its frames, and its tables' changelogs (made if need be) and writers; ``rejects``: its source's."""

    @abstractmethod
    def start(self) -> None:
        """Start the query; after a failure, start it again from its checkpoint."""

    @abstractmethod
    def warm(self) -> bool:
        """Whether it runs at its steady pace: the JIT has compiled its hot paths and its workers are up."""

    def pause_ms(self, progress: Any) -> int | None:
        """How long the batch of ``progress`` stopped processing: nothing of a kind that is idle between batches."""
        return None

    def batch_ended(self, progress: Any) -> None:
        """A batch ended (in Real-time Mode, a checkpoint): its report is its tables' latest, and says how far each
        has read its input."""
        reflected = self.context.reflected
        pause = self.pause_ms(progress)
        for run in self.runs:
            run.last_progress, run.last_pause_ms = progress, pause
            if run.ghost:
                continue  # it writes nothing: no lag, and no mark of what it wrote
            self.input_reached(run, progress)
            if reflected is not None and progress.sources:
                reflected.batches_ended([run], source_offsets(progress.sources[0].endOffset))

    @abstractmethod
    def input_reached(self, run: TableRun, progress: Any) -> None:
        """Note, for its input lag, how far the batch of ``progress`` read the input of ``run``'s table."""

    def runs_read_back(self) -> list[TableRun]:
        """Its tables whose progress the pipeline learns from their changelogs (:mod:`pipeline.follower`)."""
        return []

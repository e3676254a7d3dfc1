"""Several tables of one source computed by one aggregation: each source row parsed once, shuffled once, one state.

Each table's frame is analysed on its own over the same parsed source rows, so their plans share the rows' attributes
and each adds its own. The fused plan, built from those analysed plans (Catalyst's own nodes, as
:mod:`pipeline.lineage` builds):

1. the source rows, under the tables' one watermark, each made one row per table (``explode``: the table's index in
   :data:`~pipeline.tables.QUERY_TABLE_COLUMN`);
2. each table's steps before its aggregation (projections, filters, its window), for its own rows only: a
   projection's new columns are null on other tables' rows, a filter passes them;
3. one aggregation grouped by the table index, key columns shared among the tables (each table's grouping values in
   them on its own rows, null on others) and the window, kept whole so that the watermark evicts finished windows;
   each distinct aggregate computed once over the rows of the tables that have it (``FILTER (WHERE table IN …)``):
   the demo's tables share their counts, minima, maxima and input positions;
4. each table's steps after its aggregation, again for its own rows;
5. one row per changed group: the table index, and per table a struct of its columns named after it (null but for the
   row's own table) — the shape :func:`pipeline.microbatch_query.union_tables` gives a micro-batch query's tables.

Tables whose shapes this cannot express (one that aggregates nothing, a join, a hopping window) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.catalyst import frame_of, python_list, scala_list
from pipeline.tables import QUERY_TABLE_COLUMN, Table, TablesFileError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Nodes a table's rows may pass on their way to its aggregation, and after it: each maps a row to at most one row.
_ROW_STEPS = ("Project", "Filter")
# Nodes that only name a plan.
_NAMES = ("SubqueryAlias", "View")
_KEY = "_freshroute_key"


class FusionRefused(TablesFileError):
    """Tables that share a Real-time query have a shape one aggregation cannot compute."""

    code = "FUSION_REFUSED"


def refused(table: Table, query: str, why: str) -> FusionRefused:
    return FusionRefused(f"table {table.name!r} cannot share Real-time query {query!r} with the other tables of source "
                         f"{table.source!r}: {why}. Give it query={table.name!r} in the tables file to run it in a "
                         f"query of its own", table=table.name, query=query)


@dataclass
class _Shape:
    """A table's analysed plan cut at its aggregation."""

    table: Table
    after: list[Any]  # the steps after the aggregation, top down
    aggregate: Any
    before: list[Any]  # the steps between the source rows and the aggregation, top down
    output: Any  # the table's columns (attributes of its plan)


def fuse(spark: "SparkSession", query: str, rows: "DataFrame", frames: list[tuple[Table, "DataFrame"]]) -> "DataFrame":
    """One streaming frame computing every table of ``frames`` (each over ``rows``, the parsed source rows): columns
    :data:`QUERY_TABLE_COLUMN` and one struct per table, named after it. ``query``: the query's name, for errors."""
    return _Fusion(spark, query, rows).fused(frames)


class _Fusion:
    """One fused plan in the making, from Catalyst's nodes through py4j (the module says what it is)."""

    def __init__(self, spark: "SparkSession", query: str, rows: "DataFrame") -> None:
        self.spark = spark
        self.jvm = spark._jvm
        self.query = query
        self.base = rows._jdf.queryExecution().analyzed()
        self.x = self.jvm.org.apache.spark.sql.catalyst.expressions
        self.logical = self.jvm.org.apache.spark.sql.catalyst.plans.logical
        self.delay_key = self.logical.EventTimeWatermark.delayKey()
        self.table: Any = None  # the table index column, once the rows are exploded
        self._shared: list[tuple[Any, Any]] = []  # each distinct aggregate, and its fused form

    # The plan, step by step.
    def fused(self, frames: list[tuple[Table, "DataFrame"]]) -> "DataFrame":
        from pyspark.sql import functions as F

        shapes = [self._shape(t, df) for t, df in frames]
        plan = self._watermarked(shapes)
        exploded = self._frame(plan).select("*", F.explode(F.array(*[F.lit(i) for i in range(len(shapes))]))
                                            .alias(QUERY_TABLE_COLUMN))
        plan = exploded._jdf.queryExecution().analyzed()
        self.table = self._output(plan)[-1]
        for i, shape in enumerate(shapes):
            for step in reversed(shape.before):
                plan = self._step(step, i, plan, {})
        plan, renamed = self._aggregate(shapes, plan)
        for i, shape in enumerate(shapes):
            for step in reversed(shape.after):
                plan = self._step(step, i, plan, renamed)
        columns = []
        for i, shape in enumerate(shapes):
            struct = self._struct(shape, renamed)
            columns.append(self._alias(self.x.If(self._is(i), struct, self.x.Literal(None, struct.dataType())),
                                       shape.table.name))
        return self._frame(self.logical.Project(self._seq([self.table] + columns), plan))

    def _shape(self, t: Table, df: "DataFrame") -> _Shape:
        plan = df._jdf.queryExecution().analyzed()
        after, node = [], plan
        while node.nodeName() != "Aggregate":
            if node.equals(self.base):
                raise refused(t, self.query, "it aggregates nothing (each of its rows is a source row's), and one "
                                             "aggregation computes the tables of a query")
            self._check_step(t, node, before=False)
            after.append(node)
            node = node.child()
        aggregate, before, node = node, [], node.child()
        while not node.equals(self.base):
            self._check_step(t, node, before=True)
            before.append(node)
            node = node.child()
        return _Shape(t, after, aggregate, before, plan.output())

    def _check_step(self, t: Table, node: Any, before: bool) -> None:
        name = node.nodeName()
        if name in _ROW_STEPS + _NAMES or (name == "EventTimeWatermark" and before):
            return
        why = ("its window is a hopping one, whose rows each fall in several windows" if name == "Expand"
               else f"its rows go through a {name} {'before' if before else 'after'} their aggregation")
        raise refused(t, self.query, why)

    def _watermarked(self, shapes: list[_Shape]) -> Any:
        """The source rows under the tables' watermark: one for all, as a query has one."""
        marks = [(s, step) for s in shapes for step in s.before if step.nodeName() == "EventTimeWatermark"]
        for s, step in marks[1:]:
            first = marks[0][1]
            if not (step.eventTime().semanticEquals(first.eventTime()) and step.delay().equals(first.delay())):
                raise refused(s.table, self.query, f"its window's time column and grace differ from table "
                                                   f"{marks[0][0].table.name!r}'s, and a query has one watermark")
        return marks[0][1].withNewChildren(self._seq([self.base])) if marks else self.base

    def _step(self, step: Any, i: int, plan: Any, renamed: dict[int, Any]) -> Any:
        """Table ``i``'s ``step`` over the fused ``plan``: on its own rows as it was, other rows passed unchanged."""
        name = step.nodeName()
        if name == "Filter":
            kept = self.x.Or(self.x.Not(self._is(i)), self._renamed(step.condition(), renamed))
            return self.logical.Filter(kept, plan)
        if name == "Project":
            have = {a.exprId().id() for a in self._output(plan)}
            added = []
            for e in python_list(step.projectList()):
                if e.exprId().id() in have or e.nodeName() != "Alias":
                    continue  # a column passed on: every column is
                child = self._renamed(e.child(), renamed)
                added.append(e.withNewChildren(self._seq([self.x.If(self._is(i), child,
                                                                    self.x.Literal(None, child.dataType()))])))
            return self.logical.Project(self._seq(self._output(plan) + added), plan) if added else plan
        return plan  # a name, or the watermark placed below the rows' explosion

    def _aggregate(self, shapes: list[_Shape], plan: Any) -> tuple[Any, dict[int, Any]]:
        """One aggregation of every table's rows; with what each table's grouping columns are named now."""
        keys: dict[tuple[int, str], list[tuple[int, Any]]] = {}  # (place, type) → (table, its grouping expression)
        window: list[tuple[int, Any]] = []
        for i, s in enumerate(shapes):
            place = 0
            for g in python_list(s.aggregate.groupingExpressions()):
                if g.nodeName() == "AttributeReference" and g.metadata().contains(self.delay_key):
                    window.append((i, g))
                    continue
                keys.setdefault((place, g.dataType().json()), []).append((i, g))
                place += 1
        slots = [self._alias(self._case(members), f"{_KEY}{n}") for n, members in enumerate(keys.values())]
        if window:
            # Its watermark with it: the aggregation evicts a window's state once the watermark passes its end.
            case = self._case(window)
            slots.append(self.x.Alias(case, "window", self.x.NamedExpression.newExprId(), self._seq([]),
                                      self.jvm.scala.Option.apply(window[0][1].metadata()), self._seq([])))
        plan = self.logical.Project(self._seq(self._output(plan) + slots), plan)
        slot_of: dict[int, list[tuple[Any, Any]]] = {}  # table → (its grouping expression, the slot holding it)
        for slot, members in zip(slots, list(keys.values()) + ([window] if window else [])):
            for i, g in members:
                slot_of.setdefault(i, []).append((g, slot.toAttribute()))
        self._shared = self._shared_aggregates(shapes)
        outputs, renamed = [self.table], {}
        for i, s in enumerate(shapes):
            for e in python_list(s.aggregate.aggregateExpressions()):
                if e.nodeName() == "Alias":
                    outputs.append(e.withNewChildren(self._seq([self._per_table(e.child(), i, slot_of[i])])))
                else:  # a grouping column passed on: its slot's value, named as it was
                    out = self._alias(self._per_table(e, i, slot_of.get(i, [])), e.name())
                    renamed[e.exprId().id()] = out.toAttribute()
                    outputs.append(out)
        groups = [self.table] + [slot.toAttribute() for slot in slots]
        return (self.logical.Aggregate(self._seq(groups), self._seq(outputs), plan, shapes[0].aggregate.hint()),
                renamed)

    def _shared_aggregates(self, shapes: list[_Shape]) -> list[tuple[Any, Any]]:
        """Each distinct aggregate of the tables, and the one expression that computes it for every table that has
        it: over the rows of those tables only (a group's rows are one table's, so it is that table's value), one
        buffer in the state however many tables ask for it — the demo's tables share count, min, max, avg and the
        input position."""
        found: list[tuple[Any, list[int]]] = []
        for i, s in enumerate(shapes):
            for e in python_list(s.aggregate.aggregateExpressions()):
                for ae in self._aggregates_in(e):
                    same = next((f for f in found if f[0].semanticEquals(ae)), None)
                    if same is None:
                        found.append((ae, [i]))
                    elif i not in same[1]:
                        same[1].append(i)
        shared = []
        for ae, tables in found:
            own = self._any_of(tables)
            kept = own if ae.filter().isEmpty() else self.x.And(ae.filter().get(), own)
            shared.append((ae, ae.copy(ae.aggregateFunction(), ae.mode(), ae.isDistinct(),
                                       self.jvm.scala.Option.apply(kept), ae.resultId())))
        return shared

    def _aggregates_in(self, e: Any) -> list[Any]:
        if e.nodeName() == "AggregateExpression":
            return [e]
        return [a for c in python_list(e.children()) for a in self._aggregates_in(c)]

    def _per_table(self, e: Any, i: int, slots: list[tuple[Any, Any]]) -> Any:
        """An aggregate output of table ``i``: its aggregates over its tables' rows (:meth:`_shared_aggregates`), its
        grouping values from its slots."""
        if e.nodeName() == "AggregateExpression":
            return next(fused for ae, fused in self._shared if ae.semanticEquals(e))
        for g, slot in slots:
            if e.semanticEquals(g):
                return slot
        children = python_list(e.children())
        return e.withNewChildren(self._seq([self._per_table(c, i, slots) for c in children])) if children else e

    # Expressions.
    def _case(self, members: list[tuple[int, Any]]) -> Any:
        """The value of table i's expression on table i's rows, for each (i, expression); null on others'."""
        value = self.x.Literal(None, members[0][1].dataType())
        for i, e in reversed(members):
            value = self.x.If(self._is(i), e, value)
        return value

    def _renamed(self, e: Any, renamed: dict[int, Any]) -> Any:
        if not renamed:
            return e
        if e.nodeName() == "AttributeReference":
            return renamed.get(e.exprId().id(), e)
        children = python_list(e.children())
        return e.withNewChildren(self._seq([self._renamed(c, renamed) for c in children])) if children else e

    def _struct(self, shape: _Shape, renamed: dict[int, Any]) -> Any:
        fields = []
        for a in python_list(shape.output):
            fields += [self.x.Literal.create(a.name(), self.jvm.org.apache.spark.sql.types.DataTypes.StringType),
                       self._renamed(a, renamed)]
        return self.x.CreateNamedStruct(self._seq(fields))

    def _any_of(self, tables: list[int]) -> Any:
        test = self._is(tables[0])
        for i in tables[1:]:
            test = self.x.Or(test, self._is(i))
        return test

    def _is(self, i: int) -> Any:
        return self.x.EqualTo(self.table, self.x.Literal(i, self.jvm.org.apache.spark.sql.types.DataTypes.IntegerType))

    def _alias(self, e: Any, name: str) -> Any:
        none = self.jvm.scala.Option.empty()
        return self.x.Alias(e, name, self.x.NamedExpression.newExprId(), self._seq([]), none, self._seq([]))

    # py4j.
    def _frame(self, plan: Any) -> "DataFrame":
        return frame_of(self.spark, plan)

    def _output(self, plan: Any) -> list[Any]:
        return python_list(plan.output())

    def _seq(self, items: list[Any]) -> Any:
        return scala_list(self.jvm, items)

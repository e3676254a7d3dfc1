"""A tables file loaded: the Python module run with its declarations collected (:mod:`pipeline.tables`), then checked
against each other, and the streaming queries its tables run in."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Callable

from pipeline.tables import REALTIME, Collector, Table, TablesDefinition, TablesFileError, loading


def load_tables(path: str | Path) -> TablesDefinition:
    """Run a tables file and return what it declares; any mistake fails naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise TablesFileError(f"tables file {path} does not exist", path=str(path))
    # One module per file content: reloading an edited file never sees the old definitions.
    digest = hashlib.sha1(str(path.resolve()).encode() + path.read_bytes()).hexdigest()[:12]
    module_name = f"freshroute_tables_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TablesFileError(f"tables file {path} is not a Python file", path=str(path))
    module = importlib.util.module_from_spec(spec)
    collector = Collector()
    token = loading.set(collector)
    try:
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(module_name, None)
        raise TablesFileError(f"tables file {path}, line {e.lineno}: syntax error: {e.msg}",
                              path=str(path), line=e.lineno) from None
    except Exception as e:
        sys.modules.pop(module_name, None)
        line = _line_in(path, e)
        where = f", line {line}" if line else ""
        raise TablesFileError(f"tables file {path}{where}: {type(e).__name__}: {e}", path=str(path), line=line) from None
    finally:
        loading.reset(token)
    _pickle_by_value(module)
    definition = TablesDefinition(path, dict(collector.sources), dict(collector.tables))
    validate(definition)
    return definition


def validate(definition: TablesDefinition) -> None:
    """Check references between declarations (Spark checks schemas and columns when the plan is built)."""
    path = definition.path
    if not definition.tables:
        raise TablesFileError(f"tables file {path} declares no table (use @table(...) or sql_table(...))", path=str(path))
    for t in definition.tables.values():
        if t.source not in definition.sources:
            known = ", ".join(sorted(definition.sources)) or "none"
            raise TablesFileError(f"tables file {path}: table {t.name!r} reads source {t.source!r}, which is not "
                                  f"declared (declared sources: {known})", path=str(path), table=t.name)
        if not isinstance(t.key, str) or not t.key:
            raise TablesFileError(f"tables file {path}: table {t.name!r} needs a key column", path=str(path), table=t.name)
    for name, tables in queries(definition).items():
        first = tables[0]
        for t in tables[1:]:
            if t.source != first.source or t.trigger_ms != first.trigger_ms:
                raise TablesFileError(f"tables file {path}: tables {first.name!r} and {t.name!r} share query {name!r}, "
                                      f"so they must read the same source with the same trigger_ms (they read "
                                      f"{first.source!r} every {_every(first)} and {t.source!r} every {_every(t)})",
                                      path=str(path), table=t.name)


def check_modes(definition: TablesDefinition, mode_of: Callable[[Table], str]) -> None:
    """A query runs in one mode, and has one watermark: a micro-batch query holds at most one windowed table (each
    table's frame has its own), a Real-time query windowed tables of one time column and grace (its tables' rows go
    through one aggregation, :mod:`pipeline.fusion`)."""
    path = definition.path
    for name, tables in queries(definition, mode_of).items():
        modes = {mode_of(t) for t in tables}
        if len(modes) > 1:
            raise TablesFileError(f"tables file {path}: tables {[t.name for t in tables]} share query {name!r} but "
                                  f"not a pipeline_mode ({sorted(modes)})", path=str(path), table=tables[0].name)
        windowed = [t for t in tables if t.window is not None]
        if modes == {REALTIME}:
            other = next((t for t in windowed if not fusable_window(windowed[0], t)), None)
            if other is not None:
                raise TablesFileError(f"tables file {path}: windowed tables {windowed[0].name!r} and {other.name!r} "
                                      f"share Real-time query {name!r}, which has one watermark: their windows must "
                                      f"be tumbling ones of one time column and grace. Give {other.name!r} a query "
                                      f"of its own", path=str(path), table=other.name)
        elif len(windowed) > 1:
            raise TablesFileError(f"tables file {path}: windowed tables {[t.name for t in windowed]} share query "
                                  f"{name!r}; a query has one watermark, so each windowed table needs a query of its "
                                  f"own (keyed tables may join it)", path=str(path), table=windowed[1].name)


def fusable_window(first: Table, t: Table) -> bool:
    """Whether windowed table ``t`` can share a Real-time query (its watermark) with windowed table ``first``."""
    a, b = first.window, t.window
    assert a is not None and b is not None
    return b.slide_ms == b.size_ms and a.slide_ms == a.size_ms and (b.time_column, b.grace_ms) == (a.time_column,
                                                                                                  a.grace_ms)


def queries(definition: TablesDefinition, mode_of: Callable[[Table], str] | None = None) -> dict[str, list[Table]]:
    """The streaming queries the tables run in, by name, each with its tables in name order: the order of their
    union, which the query's state in its checkpoint follows, whatever the order of the tables file.

    A table runs in the query it names, else in its own; but with ``mode_of`` (how each table runs, as the
    pipeline's settings say), the Real-time tables of a source that name none share one query,
    ``<source>.tables`` (:mod:`pipeline.fusion`): each record parsed once, shuffled once, one state. A windowed
    table joins it when its window can share the query's watermark (:func:`fusable_window`), else runs in its own.
    """
    tables = sorted(definition.tables.values(), key=lambda t: t.name)
    shared: dict[str, list[Table]] = {}
    for t in tables:
        if t.query is None and mode_of is not None and mode_of(t) == REALTIME:
            members = shared.setdefault(t.source, [])
            window = next((m for m in members if m.window is not None), t)
            if t.window is None or fusable_window(window, t):
                members.append(t)
    query_of = {t.name: f"{source}.tables" if len(members) > 1 else t.name
                for source, members in shared.items() for t in members}
    out: dict[str, list[Table]] = {}
    for t in tables:
        out.setdefault(query_of.get(t.name, t.query_name), []).append(t)
    return out


def _every(t: Table) -> str:
    return "the pipeline's trigger" if t.trigger_ms is None else f"{t.trigger_ms} ms"


def _line_in(path: Path, exc: BaseException) -> int | None:
    """The deepest line of the tables file in the exception's traceback."""
    target = str(path.resolve())
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            if str(Path(frame.filename).resolve()) == target:
                line = frame.lineno
        except OSError:
            continue
    return line


def _pickle_by_value(module: object) -> None:
    # A UDF defined in the tables file is shipped to Spark's Python workers, which cannot
    # import a module loaded by path: send its code along instead of a reference.
    try:
        from pyspark import cloudpickle
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return
    cloudpickle.register_pickle_by_value(module)

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
        windowed = [t.name for t in tables if t.window is not None]
        if len(windowed) > 1:
            raise TablesFileError(f"tables file {path}: windowed tables {windowed} share query {name!r}; a query has "
                                  f"one watermark, so each windowed table needs a query of its own (keyed tables may "
                                  f"join it)", path=str(path), table=windowed[1])


def check_modes(definition: TablesDefinition, mode_of: Callable[[Table], str]) -> None:
    """A query runs in one mode, and a Real-time query holds one table: it reads its source once, and Real-time
    Mode cannot read one source twice in a query (Spark: IDENTICAL_SOURCES_IN_UNION_NOT_SUPPORTED)."""
    path = definition.path
    for name, tables in queries(definition).items():
        modes = {mode_of(t) for t in tables}
        if len(modes) > 1:
            raise TablesFileError(f"tables file {path}: tables {[t.name for t in tables]} share query {name!r} but "
                                  f"not a pipeline_mode ({sorted(modes)})", path=str(path), table=tables[0].name)
        if modes == {REALTIME} and len(tables) > 1:
            raise TablesFileError(f"tables file {path}: tables {[t.name for t in tables]} share query {name!r}, and a "
                                  f"query in Real-time Mode holds one table (it cannot read its source twice); give "
                                  f"each its own query, or pipeline_mode='microbatch'", path=str(path),
                                  table=tables[1].name)


def queries(definition: TablesDefinition) -> dict[str, list[Table]]:
    """The streaming queries the tables run in, by name, each with its tables in name order: the order of their
    union, which the query's state in its checkpoint follows, whatever the order of the tables file."""
    out: dict[str, list[Table]] = {}
    for t in definition.tables.values():
        out.setdefault(t.query_name, []).append(t)
    return {name: sorted(tables, key=lambda t: t.name) for name, tables in out.items()}


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

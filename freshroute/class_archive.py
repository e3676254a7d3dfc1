"""Class archives of freshroute's JVMs: their classes parsed once and mapped at every start (Java's AppCDS).

A Spark driver loads some 20,000 classes from PySpark's 280 jars before it runs a query, a Kafka broker thousands
more, and on a small machine that is most of their start: a Spark session took 10.4 s without its archive and
5.7 s with it, a broker 4.0 s and 2.0 s (docs/benchmarks.md). ``python -m tools.class_archive``, which ``./dev`` runs
after resolving the jars, makes each archive once: a short training run does the JVM's usual work and the JVM
writes every class it loaded as it exits. An archive is named for what it was made from (the JVM and the jars), and
a JVM given one that does not match its classpath only warns and loads its classes as before: a stale or missing
archive costs start-up time, never a failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Iterable


def archive_path(folder: Path, name: str, made_from: Iterable[str]) -> Path:
    """Where the archive ``name`` of this JVM and ``made_from`` (jar names, versions) is, made or not."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.realpath(shutil.which("java", path=os.path.join(home, "bin") if home else None) or "java")
    what = "\n".join([java, *sorted(made_from)])
    return folder / f"{name}-{hashlib.sha256(what.encode()).hexdigest()[:12]}.jsa"


def mapping(path: Path) -> list[str]:
    """The JVM options that map the archive at ``path``, if it has been made."""
    return [f"-XX:SharedArchiveFile={path}"] if path.is_file() else []


def making(path: Path) -> list[str]:
    """The JVM options that write the classes it loaded to ``path`` as it exits (and only errors about it)."""
    return [f"-XX:ArchiveClassesAtExit={path}", "-Xlog:cds=error"]

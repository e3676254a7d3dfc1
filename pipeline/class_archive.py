"""The Spark driver's class archive: the JVM's classes parsed once and mapped at every start (Java's AppCDS).

A Spark driver loads some 20,000 classes from PySpark's 280 jars before it runs a query, and on a small machine that
is most of its start: a session took 10.7 s without the archive and 5.8 s with it, its first job 4.8 s and 2.5 s
(docs/benchmarks.md). The archive is made once per JVM, PySpark and connector (its name says which), by
``python -m tools.class_archive``, which ``./dev`` runs after resolving the jars: a training session runs the
pipeline's kinds of work (JSON, a stateful aggregation in RocksDB, windows) and the JVM writes every class it loaded
when it exits. A driver given an archive that does not match its classpath or JVM only warns and loads classes as
before, so a stale or missing archive costs start-up time, never a failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Iterable


def archive_path(jars_dir: Path, connector: Iterable[Path]) -> Path:
    """Where the archive of this JVM, PySpark and ``connector`` (its jars) is, whether or not it exists yet."""
    import pyspark

    home = os.environ.get("JAVA_HOME")
    java = os.path.realpath(shutil.which("java", path=os.path.join(home, "bin") if home else None) or "java")
    what = "\n".join([java, pyspark.__version__, *sorted(j.name for j in connector)])
    return jars_dir / "class-archive" / f"spark-driver-{hashlib.sha256(what.encode()).hexdigest()[:12]}.jsa"


def java_options(jars_dir: Path, connector: Iterable[Path]) -> str:
    """The driver's JVM options that map the archive, if there is one."""
    path = archive_path(jars_dir, connector)
    return f" -XX:SharedArchiveFile={path}" if path.is_file() else ""

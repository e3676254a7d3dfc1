"""How the project's code reaches a Spark cluster's executors: as a py-file Spark ships, never a driver path.

Executors run a tables file's Python (its functions travel pickled by value) and whatever it imports
from ``freshroute`` or ``pipeline``. The packages go into one
zip that the driver hands to Spark (``addPyFile``), which serves it to every executor and puts
it first on their Python path. The interpreter and the third-party dependencies are the
workers' own: a Python with freshroute's dependencies installed on each worker
(``spark_worker_python``).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import freshroute
import pipeline
import proto

PACKAGES = (freshroute, pipeline, proto)
ZIP_NAME = "freshroute-pyfiles.zip"


def project_zip(directory: Path) -> Path:
    """Write the project's packages (sources only) to ``directory/freshroute-pyfiles.zip``; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / ZIP_NAME
    partial = target.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in PACKAGES:
            root = Path(package.__file__).parent
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".pyi", ".sh",
                                                                                         ".properties"):
                    zf.write(path, Path(root.name) / path.relative_to(root))
    partial.replace(target)
    return target

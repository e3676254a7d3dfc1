"""The tables files table versions were defined in, kept beside the checkpoints they explain: a version can go on
computing its own definition after the tables file has moved on to another.

A copy is named by the digest of its content, which a version's record names (``TableVersion.definition``). A
tables file that imports modules of its own directory needs that directory on the path to be loaded from its copy.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.tables import TablesDefinition, TablesFileError
from pipeline.tables_file import load_tables

DEFINITIONS = ".definitions"  # under the checkpoint directory; a dot-directory, which no query's checkpoint is


def keep(checkpoint_dir: Path, tables_file: Path) -> str:
    """Keep a copy of ``tables_file`` (once for each content); its digest."""
    return keep_text(checkpoint_dir, tables_file.read_bytes())


def keep_text(checkpoint_dir: Path, body: bytes) -> str:
    """Keep a tables file of content ``body`` (a deployed one, :mod:`pipeline.deploys`); its digest."""
    digest = hashlib.sha256(body).hexdigest()[:16]
    copy = checkpoint_dir / DEFINITIONS / f"{digest}.py"
    if not copy.is_file():
        copy.parent.mkdir(parents=True, exist_ok=True)
        partial = copy.with_suffix(".partial")
        partial.write_bytes(body)
        partial.replace(copy)  # whole or not at all
    return digest


def load(checkpoint_dir: Path, digest: str) -> TablesDefinition:
    """The tables file kept under ``digest``, loaded."""
    copy = checkpoint_dir / DEFINITIONS / f"{digest}.py"
    if not copy.is_file():
        raise TablesFileError(f"the tables file of digest {digest} is not kept in {copy.parent}", path=str(copy))
    return load_tables(copy)

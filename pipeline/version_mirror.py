"""The tables' version records as the pipeline last read them, kept on disk beside the checkpoints: Redis holds soft
state, and one that lost them must not make a table serve its first version again, nor its pipeline build anew a
version it already has."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import orjson

from freshroute.metadata.table_versions import VersionedTable

MIRROR = ".versions.json"  # under the checkpoint directory; a dot-file, which no query's checkpoint is


def save(checkpoint_dir: Path, records: Mapping[str, VersionedTable]) -> None:
    """Keep ``records`` (whole or not at all), unless they are kept as they are already."""
    body = orjson.dumps({name: orjson.loads(r.to_json()) for name, r in sorted(records.items())})
    path = checkpoint_dir / MIRROR
    if path.is_file() and path.read_bytes() == body:
        return
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_bytes(body)
    partial.replace(path)


def saved(checkpoint_dir: Path) -> dict[str, VersionedTable]:
    """The records kept; none when none are, or when what is kept cannot be read (Redis's are then all there is)."""
    try:
        doc = orjson.loads((checkpoint_dir / MIRROR).read_bytes())
        return {name: VersionedTable.from_json(orjson.dumps(r)) for name, r in doc.items()}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return {}

"""Settings declared once, as fields of a plain dataclass that say what each means and the limits it keeps.

Standard library only: the client installs without pydantic. A process's settings embed such fields
(:func:`freshroute.settings.embedded`), so that a flag, its variable and the library's argument share one declaration.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def setting(default: Any, description: str, **limits: float) -> Any:
    """A setting: its default, what it means, and the limits a value must keep (``ge``, ``gt``, ``le``, ``lt``)."""
    if callable(default):
        return field(default_factory=default, metadata={"description": description, "limits": limits})
    return field(default=default, metadata={"description": description, "limits": limits})

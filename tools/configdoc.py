"""Writes docs/configuration.md from the components' typed settings, so the reference never drifts.

Run ``python -m tools.configdoc``; a unit test fails when the committed file is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tools.cli import COMPONENTS, _resolve
from freshroute.settings import CommonSettings

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

INTRO = """# Configuration reference

Every component reads typed settings from command-line flags and from `FRESHROUTE_*`
environment variables (a flag wins). A wrong value stops the component at start with a message
naming the setting. Settings shared by every component come first.

This file is generated from the settings classes: `python -m tools.configdoc`.
"""


ROOT = DOC.parent.parent


def _row(name: str, field) -> str:
    if field.is_required():
        default = "required"
    elif field.default_factory is not None:
        default = repr(field.default_factory()) if field.default_factory() else "(empty)"
    elif field.default is None:
        default = "—"
    elif field.default in ({}, "", ()):
        default = "(empty)"
    else:
        # Paths inside the checkout are shown relative to it, so the doc is the same everywhere.
        default = str(field.default).replace(str(ROOT) + "/", "")
    desc = (field.description or "").replace("\n", " ").replace("|", "\\|")
    return f"| `--{name.replace('_', '-')}` | `FRESHROUTE_{name.upper()}` | `{default}` | {desc} |"


def _section(title: str, cls, skip: set[str]) -> list[str]:
    lines = [f"## {title}", "", "| flag | environment | default | meaning |", "|---|---|---|---|"]
    lines += [_row(n, f) for n, f in cls.model_fields.items() if n not in skip]
    return lines + [""]


def render() -> str:
    common = set(CommonSettings.model_fields)
    parts = [INTRO, *_section("Common (every component)", CommonSettings, set())]
    for command, (settings_ref, _, help_text) in COMPONENTS.items():
        parts += _section(f"`freshroute {command}` — {help_text}", _resolve(settings_ref), common)
    return "\n".join(parts).rstrip() + "\n"


def main() -> int:
    DOC.write_text(render())
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

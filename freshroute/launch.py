"""A component's process from its typed settings: every setting a flag (``--node-id``) and an environment variable
(``FRESHROUTE_NODE_ID``), a wrong value one line naming it.

``python -m router`` (and ``store_node``, ``pipeline``) starts through :func:`launch`; ``freshroute router`` through
the same :func:`add_settings_flags` and :func:`start`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from freshroute.errors import FreshrouteError


def add_settings_flags(parser: argparse.ArgumentParser, settings_cls: Any) -> None:
    """A flag for every field of ``settings_cls`` (unset flags leave the environment's value or the default)."""
    for name, field in settings_cls.model_fields.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, default=None, metavar=name.upper(),
                            help=f"{field.description or name} (env FRESHROUTE_{name.upper()}; default {field.default!r})")


def start(settings_cls: Any, run: Callable[[Any], Any], args: argparse.Namespace) -> None:
    """Load the settings from the flags given (over ``FRESHROUTE_*`` and the defaults) and run the component."""
    from freshroute.settings import load

    values = {k: v for k, v in vars(args).items() if k in settings_cls.model_fields and v is not None}
    settings = load(settings_cls, **values)
    settings.redis().check_master_known()
    run(settings)


def stopped(e: FreshrouteError) -> int:
    """Say why a command stopped, as one line ``freshroute: CODE: message`` on stderr; its exit status (2)."""
    print(f"freshroute: {e.code}: {e.message}", file=sys.stderr)
    return 2


def launch(prog: str, description: str, settings_cls: Any, run: Callable[[Any], Any],
           argv: list[str] | None = None) -> int:
    """Parse ``argv`` into ``settings_cls`` and run the component; a named error is one line on stderr and exit 2."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_settings_flags(parser, settings_cls)
    args = parser.parse_args(argv)
    try:
        start(settings_cls, run, args)
    except FreshrouteError as e:  # a component stopped for a reason it has named (config, lost data …)
        return stopped(e)
    except KeyboardInterrupt:
        return 130
    return 0

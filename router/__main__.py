"""``python -m router``: run the router with settings from ``FRESHROUTE_*`` environment variables."""

from __future__ import annotations

import sys

from freshroute.errors import ConfigError
from freshroute.settings import load

from router.main import run
from router.settings import RouterSettings


def main() -> int:
    try:
        settings = load(RouterSettings)
    except ConfigError as e:
        print(e.message, file=sys.stderr)
        return 2
    run(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())

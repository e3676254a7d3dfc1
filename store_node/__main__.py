"""``python -m store_node``: run one store node with settings from ``FRESHROUTE_*`` environment variables."""

from __future__ import annotations

import sys

from freshroute.errors import ConfigError
from freshroute.settings import load
from store_node.node import run
from store_node.settings import StoreNodeSettings


def main() -> int:
    try:
        settings = load(StoreNodeSettings)
    except ConfigError as e:
        print(e.message, file=sys.stderr)
        return 2
    run(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())

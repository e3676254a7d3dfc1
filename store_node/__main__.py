"""``python -m store_node``: ``freshroute store-node`` — run one store node, settings from flags and ``FRESHROUTE_*`` environment variables."""

from __future__ import annotations

import sys

from tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["store-node", *sys.argv[1:]]))

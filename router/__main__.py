"""``python -m router``: ``freshroute router`` — run the router, settings from flags and ``FRESHROUTE_*`` environment variables."""

from __future__ import annotations

import sys

from tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["router", *sys.argv[1:]]))

"""``python -m pipeline``: ``freshroute pipeline`` — run the pipeline, settings from flags and ``FRESHROUTE_*`` environment variables."""

from __future__ import annotations

import sys

from tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["pipeline", *sys.argv[1:]]))

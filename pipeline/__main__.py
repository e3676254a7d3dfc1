"""``python -m pipeline``: run the pipeline with settings from ``FRESHROUTE_*`` environment variables."""

from __future__ import annotations

import logging
import sys

from freshroute.errors import FreshrouteError


def main() -> int:
    from freshroute.settings import load
    from pipeline.job import configure_logging, run
    from pipeline.settings import PipelineSettings

    configure_logging()
    try:
        settings = load(PipelineSettings)
    except FreshrouteError as e:
        logging.getLogger("pipeline").error("%s: %s", e.code, e.message)
        return 2
    try:
        run(settings)
    except FreshrouteError:
        return 2  # run() has logged why
    return 0


if __name__ == "__main__":
    sys.exit(main())

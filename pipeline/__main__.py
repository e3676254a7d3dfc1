"""``python -m pipeline``: ``freshroute pipeline`` — run the component, settings from flags and ``FRESHROUTE_*`` environment
variables (:mod:`freshroute.launch`)."""

from __future__ import annotations

import sys

from freshroute.launch import launch
from pipeline.job import run
from pipeline.settings import PipelineSettings

DESCRIPTION = "Run the streaming pipeline (tables → changelogs)."

if __name__ == "__main__":
    sys.exit(launch("pipeline", DESCRIPTION, PipelineSettings, run))

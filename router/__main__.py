"""``python -m router``: ``freshroute router`` — run the component, settings from flags and ``FRESHROUTE_*`` environment
variables (:mod:`freshroute.launch`)."""

from __future__ import annotations

import sys

from freshroute.launch import launch
from router.main import run
from router.settings import RouterSettings

DESCRIPTION = "Run the router (REST + gRPC)."

if __name__ == "__main__":
    sys.exit(launch("router", DESCRIPTION, RouterSettings, run))

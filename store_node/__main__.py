"""``python -m store_node``: ``freshroute store-node`` — run the component, settings from flags and ``FRESHROUTE_*`` environment
variables (:mod:`freshroute.launch`)."""

from __future__ import annotations

import sys

from freshroute.launch import launch
from store_node.node import run
from store_node.settings import StoreNodeSettings

DESCRIPTION = "Run a store node (changelogs → RocksDB, internal gRPC)."

if __name__ == "__main__":
    sys.exit(launch("store-node", DESCRIPTION, StoreNodeSettings, run))

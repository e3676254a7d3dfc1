"""A Prometheus ``/metrics`` endpoint on a port of its own: for processes without a web server (store nodes, the
pipeline), and for each router process of several sharing one REST port."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector


def serve_metrics(source: Collector | CollectorRegistry, host: str, port: int) -> Any:
    """Serve ``/metrics`` of a collector or a whole registry on ``host:port`` (0: a free port) from a thread of
    prometheus_client's.

    Returns the server: ``server.server_address[1]`` is its port, ``server.shutdown()`` stops it."""
    registry = source
    if not isinstance(source, CollectorRegistry):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(source)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server

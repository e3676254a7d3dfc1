"""A Prometheus ``/metrics`` endpoint for processes without a web server of their own (store nodes, the pipeline)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector


def serve_metrics(collector: Collector, host: str, port: int) -> Any:
    """Serve ``/metrics`` on ``host:port`` (0: a free port) from a thread of prometheus_client's.

    Returns the server: ``server.server_address[1]`` is its port, ``server.shutdown()`` stops it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server

"""The Python client: reads store nodes directly, through the same routing core as the router.

    from freshroute.client import Client
    with Client(redis_url="redis://127.0.0.1:16379/0") as client:
        row = client.get("sensor_stats", "sensor-1", max_staleness_ms=1000)

Errors are the project's typed errors; ``Timeout`` and ``Unavailable`` are the names this
package gives :class:`~freshroute.errors.LookupTimeout` and
:class:`~freshroute.errors.ReplicaUnavailable`.
"""

from freshroute.errors import (ClientClosed, FreshrouteError, InvalidArgument, LookupTimeout, NoReplicaWithinBound,
                               NotWindowedTable, NotYetVisible, ReplicaUnavailable, TableNotFound, WindowedTable,
                               WriteRejected)
from freshroute.routing.policy import RoutingPolicy

from freshroute.client.async_client import AsyncClient, AsyncSession
from freshroute.client.lookup import AsOfLookup, KeyVersion, KeyVersions, Lookup, Windows, WindowValue
from freshroute.client.sync_client import Client, Session
from freshroute.write_tokens.make import write_token

Timeout = LookupTimeout
Unavailable = ReplicaUnavailable

__all__ = ["AsOfLookup", "AsyncClient", "AsyncSession", "Client", "ClientClosed", "FreshrouteError", "InvalidArgument", "KeyVersion", "KeyVersions", "Lookup",
           "NoReplicaWithinBound", "NotWindowedTable", "NotYetVisible", "RoutingPolicy", "Session", "TableNotFound", "Timeout",
           "Unavailable", "WindowedTable", "Windows", "WindowValue", "WriteRejected", "write_token"]

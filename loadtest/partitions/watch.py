"""What an operator sees of a fault: the router's cluster view (``/v1/cluster``, with ``/v1/tables``' tables under
``tables``), read every 200 ms while a scenario runs, judged by the scenario's sign of trouble."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import httpx

POLL_S = 0.2
Sign = Callable[[dict[str, Any]], bool]


def replicas_behind(node: str, slack_ms: int) -> Sign:
    """The node's replicas show an unknown offset lag, or staleness past the slack."""
    def sign(cluster: dict[str, Any]) -> bool:
        for n in cluster.get("nodes", []):
            if n.get("node") == node:
                return any(r["lag"]["offsets"] is None or r["lag"]["ms"] is None or r["lag"]["ms"] > slack_ms
                           for r in n.get("replicas", []))
        return False
    return sign


def node_dead(node: str) -> Sign:
    """The router takes the node for dead: its heartbeats stopped reaching Redis."""
    def sign(cluster: dict[str, Any]) -> bool:
        return any(n.get("node") == node and not n.get("alive") for n in cluster.get("nodes", []))
    return sign


def input_behind(table: str, slack_ms: int) -> Sign:
    """The table's input lag is unknown or past the slack: the pipeline's progress is not reaching the router."""
    def sign(cluster: dict[str, Any]) -> bool:
        for t in cluster.get("tables", []):
            if t.get("name") == table:
                lag = t.get("input_lag") or {}
                return lag.get("ms") is None or lag["ms"] > slack_ms
        return False
    return sign


def metadata_lost(cluster: dict[str, Any]) -> bool:
    """The router cannot read Redis."""
    return not cluster.get("metadata", {}).get("redis_ok", True)


class ClusterWatch:
    """Reads the cluster view in a thread of its own until stopped; ``seen`` holds (monotonic time, view)."""

    def __init__(self, rest_url: str) -> None:
        self._url = rest_url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cluster-watch")
        self.seen: list[tuple[float, dict[str, Any]]] = []

    def __enter__(self) -> "ClusterWatch":
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        with httpx.Client(timeout=1) as client:
            while not self._stop.is_set():
                try:
                    at = time.monotonic()
                    view = client.get(f"{self._url}/v1/cluster").json()
                    view["tables"] = client.get(f"{self._url}/v1/tables").json()["tables"]
                    self.seen.append((at, view))
                except (httpx.HTTPError, ValueError):
                    pass  # the router's own trouble shows in the lookups
                self._stop.wait(POLL_S)

    def shows(self, sign: Sign, t0: float, cut: float, heal: float) -> tuple[float | None, float | None]:
        """(s from the cut to the first view showing the sign, s from healing to the first view after it without)."""
        shown = cleared = None
        for at, view in self.seen:
            t = at - t0
            troubled = sign(view)
            if shown is None and t >= cut and troubled:
                shown = round(t - cut, 2)
            if shown is not None and cleared is None and t >= heal and not troubled:
                cleared = round(t - heal, 2)
        return shown, cleared

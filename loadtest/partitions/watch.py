"""What an operator sees of a fault: the router's cluster view (``/v1/cluster``, with ``/v1/tables``' tables under
``tables``) and its Prometheus metrics (under ``metrics``: each sample's name, labels and value), read every 200 ms
while a scenario runs, judged by the scenario's signs of trouble."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import httpx

POLL_S = 0.2
Sign = Callable[[dict[str, Any]], bool]


def past(ms: int | None, slack_ms: int) -> bool:
    """A time behind (staleness, input lag) that is unknown, or longer than a label may trail."""
    return ms is None or ms > slack_ms


def lag_behind(lag: dict[str, Any], slack_ms: int) -> bool:
    """A lag (an answer's label or a replica's in the cluster view) that says behind: its offsets unknown, or its
    staleness past the slack."""
    return lag.get("offsets") is None or past(lag.get("ms"), slack_ms)


def replicas_behind(node: str, slack_ms: int) -> Sign:
    """The node's replicas show an unknown offset lag, or staleness past the slack."""
    def sign(cluster: dict[str, Any]) -> bool:
        for n in cluster.get("nodes", []):
            if n.get("node") == node:
                return any(lag_behind(r["lag"], slack_ms) for r in n.get("replicas", []))
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
                return past((t.get("input_lag") or {}).get("ms"), slack_ms)
        return False
    return sign


def metadata_lost(cluster: dict[str, Any]) -> bool:
    """The router cannot read Redis."""
    return not cluster.get("metadata", {}).get("redis_ok", True)


def _samples(view: dict[str, Any], name: str, node: str | None = None) -> list[tuple[dict[str, str], float]]:
    return [(labels, value) for n, labels, value in view.get("metrics", ())
            if n == name and (node is None or labels.get("node") == node)]


def metrics_replicas_behind(node: str, slack_ms: int) -> Sign:
    """In the router's metrics: the node's replicas stale past the slack, or with no offset lag sample (unknown)."""
    def sign(view: dict[str, Any]) -> bool:
        known = {(labels["table"], labels["partition"])
                 for labels, _ in _samples(view, "freshroute_router_replica_lag_offsets", node)}
        stale = _samples(view, "freshroute_router_replica_staleness_ms", node)
        return any(value > slack_ms or (labels["table"], labels["partition"]) not in known for labels, value in stale)
    return sign


def metrics_node_dead(node: str) -> Sign:
    def sign(view: dict[str, Any]) -> bool:
        return any(value == 0 for _, value in _samples(view, "freshroute_router_replica_alive", node))
    return sign


def metrics_metadata_lost(view: dict[str, Any]) -> bool:
    return any(value == 0 for _, value in _samples(view, "freshroute_router_redis_up"))


def router_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The router's own gauges of a Prometheus exposition: replicas' lag, staleness and liveness, Redis."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = ("freshroute_router_replica_", "freshroute_router_redis_up")
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith(wanted)]


class ClusterWatch:
    """Reads the cluster view in a thread of its own until stopped; ``seen`` holds (monotonic time, view)."""

    def __init__(self, rest_url: str, metrics_url: str) -> None:
        self._url = rest_url
        self._metrics_url = metrics_url
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
                    view["metrics"] = router_samples(client.get(self._metrics_url).text)
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

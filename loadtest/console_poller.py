"""One open console, as the router sees it: the page's files once, then every half second the cluster summary and
the first table's replicas (what ``router/console/static/console.js`` asks for), on a thread, for a bounded time.

The bench runs REST lookups with and without it to show that a console costs lookups nothing; a browser is not
used there because its own rendering would take CPU from the router on a 2-core machine, which measures the
machine, not the router.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

POLL_S = 0.5  # the page's poll interval (console.js POLL_MS)
GRID_PAGE = 256  # the page's partitions per grid page (console.js GRID_PAGE)


class ConsolePoller:
    """Polls like one open console until stopped or ``max_s`` has passed."""

    def __init__(self, rest_url: str, headers: dict[str, str] | None = None, max_s: float = 600.0) -> None:
        self._http = httpx.Client(base_url=rest_url, headers=headers, timeout=5)
        self._max_s = max_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0
        self.failures = 0
        self.poll_ms: list[float] = []  # the summary and the grid, one poll's round trips together

    def __enter__(self) -> "ConsolePoller":
        for name in ("", "/console.js", "/console.css"):
            self._http.get(f"/console{name}").raise_for_status()
        self._thread = threading.Thread(target=self._run, name="console-poller", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._http.close()

    def _run(self) -> None:
        deadline = time.monotonic() + self._max_s
        table: str | None = None
        while not self._stop.is_set() and time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                summary = self._http.get("/v1/cluster/summary")
                summary.raise_for_status()
                tables = summary.json()["tables"]
                table = table or (tables[0]["name"] if tables else None)
                if table is not None:
                    self._http.get(f"/v1/cluster/tables/{table}", params={"from": 0, "limit": GRID_PAGE}
                                   ).raise_for_status()
                self.polls += 1
                self.poll_ms.append((time.perf_counter() - start) * 1000)
            except (httpx.HTTPError, KeyError, ValueError):
                self.failures += 1
            self._stop.wait(max(0.0, POLL_S - (time.perf_counter() - start)))

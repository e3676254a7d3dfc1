"""A client's way through a router: its metadata API as a snapshot source, and its REST API as the fallback for reads."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, TypeVar, overload
from urllib.parse import quote

import httpx
import orjson

from freshroute.errors import FreshrouteError, InvalidArgument, LookupTimeout, ReplicaUnavailable, from_body
from freshroute.bound import Bound
from freshroute.lag import now_ms
from freshroute.keys import key_bytes, not_a_batch
from freshroute.metadata.catch_up import CatchUp
from freshroute.metadata.progress import InputLag
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.metadata.table_versions import VersionedTable
from freshroute.metadata.tables import TableSpec
from freshroute.routing.results import KeyLocation, TableInfo, optional_int
from freshroute.routing.refresher import refresh_until
from freshroute.routing.snapshot import NodeView, ReplicaView, Snapshot
from freshroute.windows import WindowSpec

from freshroute.client.lookup import AsOfLookup, KeyVersions, Lookup, Windows

log = logging.getLogger("freshroute.client")
R = TypeVar("R")

# Errors of a direct read after which the router may still answer: nothing direct could be reached in time.
FALL_BACK = (ReplicaUnavailable, LookupTimeout)


def snapshot_from_router(tables_doc: dict[str, Any], cluster_doc: dict[str, Any], now: int) -> Snapshot:
    """The snapshot a router's ``/v1/tables`` and ``/v1/cluster`` describe, as of ``now``."""
    tables = {}
    lags = {}
    for t in tables_doc["tables"]:
        behind, pipeline = t.get("input_lag") or {}, t.get("pipeline") or {}
        if behind.get("records") or pipeline.get("last_progress_ms") is not None:
            # As the router worked it out just now; a pipeline it says is not running stays counted as such.
            lags[t["name"]] = InputLag(int(behind.get("records") or 0), now - int(behind.get("ms") or 0), now,
                                       alive_ms=now if pipeline.get("alive", True) else 0)
        default = t.get("default_bound") or {}
        window = t.get("window")
        tables[t["name"]] = TableSpec(t["name"], t["topic"], int(t["partitions"]), t.get("key_column", ""),
                                      dict(t.get("schema") or {}), int(t.get("standby_replicas", 1)),
                                      default.get("max_lag"), default.get("max_staleness_ms"),
                                      WindowSpec.from_dict(window) if window else None,
                                      history_retention_ms=int(t.get("history_retention_ms") or 0))
    nodes: dict[str, NodeView] = {}
    heard: dict[str, int] = {}
    replicas: dict[tuple[str, int], list[ReplicaView]] = {}
    for n in cluster_doc["nodes"]:
        age = int(n.get("heartbeat_age_ms") or 0)
        draining = bool(n.get("draining"))
        nodes[n["node"]] = NodeView(n["node"], n["address"], bool(n["alive"]), draining, None, n.get("read_address"))
        heard[n["node"]] = now - age
        for r in n["replicas"]:
            state = ReplicaState(r["state"]) if r.get("state") else None
            replicas.setdefault((r["table"], int(r["partition"])), []).append(ReplicaView(
                r["node"], r["address"], r["table"], int(r["partition"]), Role(r["role"]), state,
                int(r["applied_offset"]), optional_int(r["end_offset"]), int(r["lag"]["ms"] or 0), now, bool(r["alive"]),
                draining, failure=r.get("failure")))
    ordered = {tp: tuple(sorted(vs, key=lambda v: (v.role is not Role.ACTIVE, v.node))) for tp, vs in replicas.items()}
    return Snapshot(MappingProxyType(tables), MappingProxyType(ordered), MappingProxyType(nodes), None, now, True,
                    MappingProxyType(heard), MappingProxyType(lags))


class RouterHttp:
    """A router's REST API: metadata for the snapshot, and every read as the fallback."""

    def __init__(self, url: str, timeout_s: float, token: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """``tls``: the client's TLS context (its CA and certificate); None: the system's defaults."""
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout_s, verify=tls or True,
                                       headers={"authorization": f"Bearer {token}"} if token else None)

    async def call(self, method: str, path: str, deadline: float | None = None, **kw: Any) -> tuple[int, Any]:
        """(status, JSON body); an unreachable router or a body that is not JSON is :class:`ReplicaUnavailable`, no
        answer by ``deadline`` (``time.monotonic()``; a read's request timeout) :class:`LookupTimeout`."""
        if deadline is not None:
            kw["timeout"] = max(0.001, deadline - time.monotonic())
        try:
            resp = await self._http.request(method, path, **kw)
            return resp.status_code, orjson.loads(resp.content) if resp.content else None
        except (httpx.HTTPError, orjson.JSONDecodeError) as e:
            if deadline is not None and isinstance(e, httpx.TimeoutException):
                raise LookupTimeout(f"router at {self.url}: no answer within the request timeout",
                                    router=self.url) from None
            raise ReplicaUnavailable(f"router at {self.url}: {type(e).__name__}: {e}", router=self.url) from None

    async def ok(self, method: str, path: str, deadline: float | None = None, **kw: Any) -> Any:
        status, body = await self.call(method, path, deadline, **kw)
        if status != 200:
            raise from_body(body, status)
        return body

    async def get(self, table: str, key: str, bound: Bound, deadline: float | None = None) -> Lookup:
        return await self._key(table, key, bound.to_query(), deadline, Lookup.from_json)

    async def as_of(self, table: str, key: str, as_of_ms: int, bound: Bound,
                    deadline: float | None = None) -> AsOfLookup:
        return await self._key(table, key, {"as_of": as_of_ms, **bound.to_query()}, deadline, AsOfLookup.from_json)

    async def _key(self, table: str, key: str, params: dict[str, Any], deadline: float | None,
                   answer: Callable[..., R]) -> R:
        """A key lookup's answer made by ``answer`` from the body: a 200's, or a KEY_NOT_FOUND's details (found
        False); any other error raised."""
        status, body = await self.call("GET", f"/v1/tables/{_seg(table, 'table')}/keys/{_seg(key)}", deadline,
                                       params=params)
        if status == 200:
            return answer(body)
        err = from_body(body, status)
        if err.code == "KEY_NOT_FOUND":
            return answer(err.details | {"key": key}, found=False)
        raise err

    async def versions(self, table: str, key: str, from_ms: int | None, to_ms: int | None, limit: int | None,
                       page_token: str | None, bound: Bound, deadline: float | None = None) -> KeyVersions:
        params = {k: v for k, v in (("from", from_ms), ("to", to_ms), ("limit", limit), ("page_token", page_token))
                  if v is not None}
        body = await self.ok("GET", f"/v1/tables/{_seg(table, 'table')}/keys/{_seg(key)}/versions", deadline,
                             params=params | bound.to_query())
        return KeyVersions.from_json(body)

    async def windows(self, table: str, key: str, from_ms: int, to_ms: int, bound: Bound,
                      deadline: float | None = None) -> Windows:
        body = await self.ok("GET", f"/v1/tables/{_seg(table, 'table')}/keys/{_seg(key)}/windows", deadline,
                             params={"from": from_ms, "to": to_ms, **bound.to_query()})
        return Windows.from_json(body)

    @overload
    async def get_many(self, table: str, keys: list[str], bound: Bound, deadline: float | None = None,
                       as_of_ms: None = None) -> list[Lookup | FreshrouteError]: ...

    @overload
    async def get_many(self, table: str, keys: list[str], bound: Bound, deadline: float | None,
                       as_of_ms: int) -> list[AsOfLookup | FreshrouteError]: ...

    async def get_many(self, table: str, keys: list[str], bound: Bound, deadline: float | None = None,
                       as_of_ms: int | None = None
                       ) -> list[Lookup | FreshrouteError] | list[AsOfLookup | FreshrouteError]:
        """Many keys through the router: each a :class:`Lookup` (as of a time, an :class:`AsOfLookup`), or the
        error of its key."""
        for i, key in enumerate(keys):  # what the JSON body could not carry
            try:
                key_bytes(key)
            except InvalidArgument:
                raise not_a_batch(keys, i) from None
        body = await self.ok("POST", f"/v1/tables/{_seg(table, 'table')}/keys:batchGet", deadline,
                             json={"keys": keys, **bound.to_query(), **_as_of_query(as_of_ms)})
        lag, which = body.get("input_lag"), _which(body)
        if as_of_ms is None:
            return [from_body(item, 503) if "error" in item else
                    Lookup.from_json({**which, **item}, bool(item["found"]), lag) for item in body["results"]]
        return [from_body(item, 503) if "error" in item else
                AsOfLookup.from_json({**which, **item, "as_of": body["as_of"]}, bool(item["found"]), lag)
                for item in body["results"]]

    async def scan_page(self, table: str, prefix: str, start: str, end: str, limit: int | None,
                        page_token: str | None, bound: Bound,
                        as_of_ms: int | None = None) -> tuple[list[Lookup | AsOfLookup], str | None]:
        for field, text in (("prefix", prefix), ("start", start), ("end", end)):
            key_bytes(text, field)  # what the query string could not carry
        params = {k: v for k, v in (("prefix", prefix), ("start", start), ("end", end), ("page_token", page_token),
                                    ("limit", str(limit) if limit else None)) if v}
        body = await self.ok("GET", f"/v1/tables/{_seg(table, 'table')}/scan",
                             params=params | bound.to_query() | _as_of_query(as_of_ms))
        served = {p["partition"]: p for p in body.get("partitions", ())}
        docs = [{**_which(body), **served.get(i["partition"], {}), **i} for i in body["items"]]
        if as_of_ms is None:
            items: list[Lookup | AsOfLookup] = [Lookup.from_json(d, True, body.get("input_lag")) for d in docs]
        else:
            items = [AsOfLookup.from_json({**d, "as_of": body["as_of"], "final": body["final"]}, True,
                                          body.get("input_lag")) for d in docs]
        return items, body.get("next_page_token")

    async def key_metadata(self, table: str, key: str) -> KeyLocation:
        return KeyLocation.from_dict(await self.ok("GET", f"/v1/tables/{_seg(table, 'table')}/keys/{_seg(key)}/metadata"))

    async def aclose(self) -> None:
        await self._http.aclose()


def _as_of_query(as_of_ms: int | None) -> dict[str, int]:
    """A read's ``as_of`` parameter: none for the latest value."""
    return {} if as_of_ms is None else {"as_of": as_of_ms}


def table_infos(snap: Snapshot, tables_doc: dict[str, Any] | None = None) -> list[TableInfo]:
    """The tables of ``snap``; with the router's ``/v1/tables`` body it was made from, each with its versions as the
    router listed them (state, input lag and, building, progress and estimate)."""
    docs = {t["name"]: t for t in (tables_doc or {}).get("tables", ())}
    return [_with_versions(TableInfo(s, s.default_max_lag, s.default_max_staleness_ms), docs.get(name))
            for name, s in sorted(snap.tables.items())]


def _with_versions(info: TableInfo, doc: dict[str, Any] | None) -> TableInfo:
    if not doc or not doc.get("versions"):
        return info
    listed = doc["versions"]
    record = VersionedTable.from_json(orjson.dumps({"name": doc["name"], "serving": doc["version"],
                                                    "versions": listed}))
    lags = {int(v["version"]): (int(v["input_lag"]["records"]), int(v["input_lag"]["ms"]))
            for v in listed if v.get("input_lag")}
    ways = {int(v["version"]): CatchUp(v.get("progress"), v.get("caught_up_in_ms"))
            for v in listed if "progress" in v or "caught_up_in_ms" in v}
    return replace(info, versions=record, version_lags=lags, version_catch_ups=ways)


def _seg(text: str, field: str = "key") -> str:
    """``text`` as one segment of a URL path: its UTF-8, percent-encoded."""
    if not text:
        raise InvalidArgument(f"{field} must not be empty", field=field)
    return quote(key_bytes(text, field), safe="")


class RouterMetadata:
    """The routing snapshot as a router describes it, rebuilt every ``refresh_ms`` (a client with no metadata store)."""

    def __init__(self, http: RouterHttp, refresh_ms: int, on_swap: Callable[[Snapshot], None] | None = None,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        self._http = http
        self._refresh_s = refresh_ms / 1000
        self._on_swap = on_swap
        self._clock_ms = clock_ms
        self.current = Snapshot()
        self.redis_ok = False
        self.last_error: str | None = None
        self._failing = False

    async def refresh_once(self) -> bool:
        try:
            tables, cluster = await asyncio.gather(self._http.ok("GET", "/v1/tables"), self._http.ok("GET", "/v1/cluster"))
            snap = snapshot_from_router(tables, cluster, self._clock_ms())
        except (FreshrouteError, KeyError, TypeError, ValueError) as e:
            self.last_error = f"the router does not describe the cluster ({e})"
            if not self._failing:
                self._failing = True
                log.warning("metadata: cannot read the router's metadata (%s); keeping the last snapshot", e)
            return False
        self._failing = False
        self.last_error = None
        self.redis_ok = bool(cluster.get("metadata", {}).get("redis_ok"))
        self.current = snap
        if self._on_swap is not None:
            self._on_swap(snap)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh until ``stop`` is set."""
        await refresh_until(self.refresh_once, self._refresh_s, stop)


def _which(body: dict[str, Any]) -> dict[str, Any]:
    """The table and version a batch's or a page's answer names, for each of its items."""
    return {"table": body["table"], "table_version": body.get("table_version", 1)}

"""The router's answers as the public gRPC API's messages: one function per result, from the results the routing
core returns (:mod:`freshroute.routing.results`) to the messages of ``router.proto``.

A found value travels as JSON text (``value_json``), as bytes for a bytes table (``value_bytes``), and, when the
caller asks for typed values, as a ``Struct`` too.
"""

from __future__ import annotations

import orjson
from google.protobuf.struct_pb2 import Struct

from freshroute.errors import FreshrouteError
from freshroute.metadata.table_versions import named
from freshroute.metadata.tables import TableSpec
from freshroute.routing.history import AsOf, Versions
from freshroute.routing.results import ClusterView, LookupResult, ReplicaInfo, TableInfo, WindowsResult, pipeline_doc
from freshroute.windows import Window
from proto import router_pb2
from router.grpc_errors import grpc_status
from router.routing import Router


def typed_value(value: bytes) -> Struct | None:
    """A JSON object value as a Struct (numbers become doubles, as Struct holds them); None for any other JSON."""
    parsed = orjson.loads(value)
    if not isinstance(parsed, dict):
        return None
    struct = Struct()
    struct.update(parsed)
    return struct


def value_json_of(value_format: str, raw: bytes) -> str:
    """A found value as ``value_json`` carries it; empty for bytes (``value_bytes`` carries them)."""
    if value_format == "json":
        return raw.decode("utf-8")
    if value_format == "string":
        return orjson.dumps(raw.decode("utf-8")).decode("utf-8")
    return ""


def get_response(r: LookupResult, typed: bool = False, value_format: str = "json") -> router_pb2.GetResponse:
    if value_format == "json":
        value_json, value_bytes = r.value.decode("utf-8") if r.found else "", b""
    else:
        value_json, value_bytes = (value_json_of(value_format, r.value), r.value if value_format == "bytes" else b"") \
            if r.found else ("", b"")
    return router_pb2.GetResponse(
        **named(r.table), key=r.key, value_json=value_json, value_bytes=value_bytes, partition=r.partition,
        served_by=router_pb2.ServedBy(node=r.node, role=r.role),
        lag=router_pb2.Lag(offsets=r.lag_offsets, ms=r.lag_ms), position=r.position, found=r.found,
        value=typed_value(r.value) if typed and r.found and value_format == "json" else None)


# Who answered a partition of a scan: a key scan's or a windows scan's (both carry node, role, lag and position).
Served = LookupResult | WindowsResult


def scan_summary(served: dict[int, Served], next_page_token: str | None,
                 input_lag: router_pb2.InputLag | None, table_version: int = 1) -> router_pb2.ScanSummary:
    return router_pb2.ScanSummary(input_lag=input_lag, table_version=table_version,
        partitions=[router_pb2.ScanPartition(partition=p, served_by=router_pb2.ServedBy(node=r.node, role=r.role),
                                             lag=router_pb2.Lag(offsets=r.lag_offsets, ms=r.lag_ms),
                                             position=r.position)
                    for p, r in sorted(served.items())],
        next_page_token=next_page_token or "")


def window_message(w: Window, typed: bool) -> router_pb2.Window:
    return router_pb2.Window(start_ms=w.start, end_ms=w.end, value_json=w.value.decode("utf-8"), final=w.final,
                             value=typed_value(w.value) if typed else None)


def windows_response(r: WindowsResult, typed: bool,
                      input_lag: router_pb2.InputLag | None) -> router_pb2.WindowsResponse:
    return router_pb2.WindowsResponse(input_lag=input_lag,
        **named(r.table), key=r.key, windows=[window_message(w, typed) for w in r.windows], partition=r.partition,
        served_by=router_pb2.ServedBy(node=r.node, role=r.role),
        lag=router_pb2.Lag(offsets=r.lag_offsets, ms=r.lag_ms), position=r.position, watermark_ms=r.watermark_ms)


def table_window(spec: TableSpec) -> router_pb2.TableWindow | None:
    w = spec.window
    return None if w is None else router_pb2.TableWindow(size_ms=w.size_ms, slide_ms=w.slide_ms, grace_ms=w.grace_ms,
                                                         retention_ms=w.retention_ms)


def table_info(t: TableInfo) -> router_pb2.TableInfo:
    """A table as ``ListTables`` gives it: what ``/v1/tables`` says of it, typed."""
    s, versions = t.spec, t.versions_doc()
    return router_pb2.TableInfo(name=s.name, topic=s.topic, partitions=s.partitions,
                                standby_replicas=s.standby_replicas, key_column=s.key_column,
                                schema=dict(s.value_schema), window=table_window(s),
                                input_lag=router_pb2.InputLag(records=t.input_lag[0], ms=t.input_lag[1]),
                                pipeline=router_pb2.Pipeline(**pipeline_doc(t.pipeline)),
                                key_format=s.key_format, value_format=s.value_format, origin=s.origin,
                                pipeline_mode=s.pipeline_mode or "", query=s.query or "",
                                history_retention_ms=s.history_retention_ms, version=versions["version"],
                                # Unknown (null) is unset: a progress or estimate never reads as 0 for want of one.
                                versions=[router_pb2.TableVersionInfo(**{k: x for k, x in v.items() if x is not None})
                                          for v in versions["versions"]])


def input_lag_message(router: Router, table: str) -> router_pb2.InputLag | None:
    """The table's input lag as the responses carry it: unset while the pipeline is caught up (it reads as zero)."""
    records, ms = router.input_lag(table)
    return router_pb2.InputLag(records=records, ms=ms) if records else None


def key_error(table: str, key: str, err: FreshrouteError) -> router_pb2.GetResponse:
    """A BatchGet result for a key that could not be read: the error a Get of it alone would carry."""
    body = orjson.dumps(err.to_body(), default=str).decode()
    return router_pb2.GetResponse(
        table=table, key=key, partition=int(err.details.get("partition") or 0), found=False,
        error=router_pb2.KeyError(code=err.code, message=err.message, status=grpc_status(err).value[0],
                                  body_json=body))


def replica_info(i: ReplicaInfo) -> router_pb2.ReplicaInfo:
    return router_pb2.ReplicaInfo(node=i.node, address=i.address, role=i.role, state=i.state or "", alive=i.alive,
                                  lag=router_pb2.Lag(offsets=i.lag_offsets, ms=i.lag_ms), applied_offset=i.applied,
                                  end_offset=i.end, failure=i.failure or "")


def as_of_response(answer: AsOf, typed: bool, value_format: str) -> router_pb2.GetResponse:
    """A key as of a time: a get's answer with the version's interval (unset: no version then) and ``final``."""
    response = get_response(answer.lookup, typed, value_format)
    version = answer.version
    if version is not None:
        response.valid_from = version.valid_from_ms
        if version.valid_to_ms is not None:
            response.valid_to = version.valid_to_ms
    response.final = answer.final
    return response


def versions_response(page: Versions, typed: bool, value_format: str,
                       input_lag: router_pb2.InputLag | None) -> router_pb2.VersionsResponse:
    r = page.lookup
    versions = [router_pb2.Version(
        value_json=value_json_of(value_format, v.value) if v.value is not None else "",
        value_bytes=v.value if value_format == "bytes" and v.value is not None else b"",
        valid_from=v.valid_from_ms, valid_to=v.valid_to_ms, deleted=v.value is None,
        value=typed_value(v.value) if typed and v.value is not None and value_format == "json" else None)
        for v in page.versions]
    return router_pb2.VersionsResponse(
        **named(r.table), key=r.key, versions=versions,
        next_page_token="" if page.next_to_ms is None else str(page.next_to_ms), complete_to=page.complete_ms,
        partition=r.partition, served_by=router_pb2.ServedBy(node=r.node, role=r.role),
        lag=router_pb2.Lag(offsets=r.lag_offsets, ms=r.lag_ms), position=r.position, input_lag=input_lag)


def cluster_response(view: ClusterView) -> router_pb2.ClusterResponse:
    return router_pb2.ClusterResponse(
        nodes=[router_pb2.NodeInfo(
            node=n.node, address=n.address, alive=n.alive, heartbeat_age_ms=n.heartbeat_age_ms or 0,
            read_address=n.read_address or "", draining=n.draining,
            replicas=[router_pb2.PartitionReplica(table=r.table, partition=r.partition, replica=replica_info(r.info))
                      for r in n.replicas]) for n in view.nodes],
        assignment_generation=view.assignment_generation or 0,
        assignment=[router_pb2.AssignedPartition(table=t, partition=p, nodes=ns) for t, p, ns in view.assignment or ()],
        metadata=router_pb2.MetadataHealth(loaded=view.metadata.loaded, age_ms=view.metadata.age_ms,
                                           redis_ok=view.metadata.redis_ok),
        pipelines=[router_pb2.TablePipeline(
            table=t.table, pipeline=router_pb2.Pipeline(alive=t.alive, last_progress_ms=t.last_progress_ms),
            input_lag=router_pb2.InputLag(records=t.input_lag[0], ms=t.input_lag[1])) for t in view.pipelines])

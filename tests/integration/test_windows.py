"""Windowed tables: a user's tumbling windows by record timestamp, run by the real pipeline, served by a real store
node and router.

Records are produced with explicit timestamps, some out of order. The served windows equal a recomputation
from the records the pipeline accepted; a late record within grace revises its window, one past grace is
dropped and counted; ``final`` flips once the watermark passes a window's end + grace; retention removes
old windows from the node, from the changelog (tombstones) and from a restore.
"""

from __future__ import annotations

import os
import textwrap
import urllib.request

import grpc
import httpx
import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from freshroute.client import Client, WindowedTable
from freshroute.keys import partition_for, serialize_key
from tools.local.services import free_port
from freshroute.windows import WATERMARK_KEY, split_window_key
from pipeline.topics import ensure_topic
from proto import router_pb2, router_pb2_grpc

from .pipeline_support import PipelineProcess, Processes, read_topic
from .stack_fixture import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.beside]

TABLES = textwrap.dedent('''
    from pyspark.sql import functions as F

    from pipeline.tables import hopping, source, sql_table, table, tumbling

    source("temps", schema="sensor STRING, reading DOUBLE", topic="temps")

    @table(name="temp_windows", key="sensor", source="temps",
           window=tumbling("10 seconds", grace="5 seconds", retention="20 seconds"))
    def temp_windows(temps):
        return temps.groupBy("sensor", "window").agg(F.count("reading").alias("count"),
                                                     F.min("reading").alias("min"), F.max("reading").alias("max"))

    sql_table(name="temp_counts", key="sensor", source="temps", window=hopping("10 seconds", "5 seconds", grace="5 seconds"),
              sql="SELECT sensor, window, count(*) AS count FROM temps GROUP BY sensor, window")
''')

T0 = 1_700_000_000_000  # a multiple of 10 s: window starts are T0 + k·10 s
S = 1000


def recompute(sent: list[tuple[str, int, float, int]], size: int = 10 * S,
              slide: int = 10 * S) -> dict[str, dict[int, dict]]:
    """sensor → window start → {count, min, max}, from the records sent: Spark adds a record to each of its windows
    that is not final yet (its end is past the watermark the record's batch ran with)."""
    out: dict[str, dict[int, dict]] = {}
    for sensor, ts, reading, watermark in sent:
        start = ts - ts % slide
        while start + size > ts:
            if start + size > watermark:
                w = out.setdefault(sensor, {}).setdefault(start, {"count": 0, "min": reading, "max": reading})
                w["count"] += 1
                w["min"], w["max"] = min(w["min"], reading), max(w["max"], reading)
            start -= slide
    return out


@pytest.mark.timeout(600)
def test_windows_are_recomputed_revised_finalised_expired_and_restored(broker, redis_url, namespace, tmp_path):
    tables_file = tmp_path / "temps.py"
    tables_file.write_text(TABLES)
    topic = f"{namespace}temps"
    # One input partition: event order is send order. Kept for ever: the records are stamped in 2023, and the
    # broker's time retention would otherwise delete them at its next check, before the pipeline reads them.
    ensure_topic(AdminClient({"bootstrap.servers": broker}), topic, 1, {"retention.ms": "-1"})
    metrics_port = free_port()
    env = {**os.environ, "FRESHROUTE_BOOTSTRAP_SERVERS": broker, "FRESHROUTE_REDIS_URL": redis_url,
           "FRESHROUTE_NAMESPACE": namespace, "FRESHROUTE_TOPIC_PREFIX": namespace,
           "FRESHROUTE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "FRESHROUTE_CHANGELOG_PARTITIONS": "4",
           "FRESHROUTE_TABLES_FILE": str(tables_file), "FRESHROUTE_TRIGGER_MS": "200",
           # Batch by batch, as the steps below model the watermark (test_pipeline_realtime has windows in Real-time
           # Mode, where it moves at checkpoints).
           "FRESHROUTE_PIPELINE_MODE": "microbatch",
           "FRESHROUTE_STANDBY_REPLICAS": "0"}
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 0})
    accepted: list[tuple[str, int, float, int]] = []  # (sensor, event time, reading, watermark of its batch)
    watermark = [-1]

    def send(sensor: str, at_s: float, reading: float) -> None:
        ts = T0 + int(at_s * S)
        producer.produce(topic, key=sensor.encode(), value=orjson.dumps({"sensor": sensor, "reading": reading}),
                         timestamp=ts)
        assert producer.flush(10) == 0
        accepted.append((sensor, ts, reading, watermark[0]))

    def batches_done() -> None:
        """The records sent so far were processed: later batches run with the watermark they moved."""
        watermark[0] = max(ts for _s, ts, _r, _w in accepted) - 5 * S

    send("s1", 1, 1.0)
    send("s1", 2, 3.0)
    send("s2", 3, 10.0)
    send("s1", 12, 5.0)  # event time T0+12 s: watermark T0+7 s, window [T0, T0+10 s) still open
    # The metrics port is the pipeline's alone (the node and router read the same variable).
    pipeline = PipelineProcess({**env, "FRESHROUTE_METRICS_PORT": str(metrics_port)}, tmp_path / "pipeline.log")
    procs = Processes(tmp_path, env)
    rest_port, grpc_port = free_port(), free_port()
    try:
        procs.start("node", "store-node", "--node-id", "n1", "--data-dir", str(tmp_path / "n1-a"))
        procs.start("router", "router", "--rest-port", str(rest_port), "--grpc-port", str(grpc_port))
        with httpx.Client(base_url=f"http://127.0.0.1:{rest_port}", timeout=5) as http:
            def windows(sensor: str, table: str = "temp_windows", frm: int = T0 - 60 * S, to: int = T0 + 120 * S):
                try:
                    r = http.get(f"/v1/tables/{table}/keys/{sensor}/windows", params={"from": frm, "to": to,
                                                                                        "max_lag": 0})
                except httpx.TransportError:
                    return None
                return r.json() if r.status_code == 200 else None

            def served(sensor: str) -> dict[int, dict] | None:
                body = windows(sensor)
                return None if body is None else {w["start"]: w["value"] for w in body["windows"]}

            def hop_counts(sensor: str) -> dict[int, int]:
                return {w["start"]: w["value"]["count"] for w in (windows(sensor, table="temp_counts") or
                                                                   {"windows": []})["windows"]}

            def finals(sensor: str) -> dict[int, bool]:
                return {w["start"]: w["final"] for w in (windows(sensor) or {"windows": []})["windows"]}

            wait_until(lambda: served("s1") == recompute(accepted)["s1"], 240, "s1's windows to be served",
                       check=lambda: (pipeline.check(), procs.check()))
            assert served("s2") == recompute(accepted)["s2"]
            assert finals("s1") == {T0: False, T0 + 10 * S: False}
            # The SQL form's hopping windows (10 s every 5 s) hold each of these records in both windows that
            # contain it: they were all in the first batch, before any watermark.
            first = recompute(accepted, 10 * S, 5 * S)
            wait_until(lambda: {sensor: hop_counts(sensor) for sensor in first} ==
                       {sensor: {s: v["count"] for s, v in ws.items()} for sensor, ws in first.items()}, 60,
                       "the hopping counts")
            batches_done()

            # Out of order within grace: revises [T0, T0+10 s).
            send("s1", 4, 0.5)
            wait_until(lambda: served("s1") == recompute(accepted)["s1"], 60, "the revision within grace")
            assert served("s1")[T0] == {"count": 3, "min": 0.5, "max": 3.0}
            batches_done()

            # Event time T0+16 s: the watermark passes T0+10 s, so [T0, T0+10 s) is final (no more input needed).
            send("s2", 16, 20.0)
            wait_until(lambda: finals("s1") == {T0: True, T0 + 10 * S: False}, 60, "s1's first window to be final")
            # Each partition applies the watermark record written to it on its own.
            wait_until(lambda: finals("s2") == {T0: True, T0 + 10 * S: False}, 30, "s2's first window to be final")
            body = windows("s1")
            assert body["watermark_ms"] >= T0 + 10 * S and body["served_by"]["role"] == "active"
            assert body["partition"] == partition_for(serialize_key("s1"), 4) and body["position"].startswith("p1.")
            assert [w["end"] - w["start"] for w in body["windows"]] == [10 * S, 10 * S]

            batches_done()
            # Past grace (event time T0+5 s < watermark T0+11 s): dropped and counted; the final window stays.
            send("s1", 5, -100.0)
            send("s3", 17, 1.0)

            def late_dropped() -> float:
                text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
                line = next((ln for ln in text.splitlines()
                             if ln.startswith('freshroute_pipeline_late_rows_dropped_total{table="temp_windows"}')), None)
                return float(line.split()[-1]) if line else 0.0

            wait_until(lambda: served("s3") == recompute(accepted)["s3"] and late_dropped() >= 1, 60,
                       "the late record to be dropped and counted")
            assert served("s1") == recompute(accepted)["s1"]
            assert served("s1")[T0] == {"count": 3, "min": 0.5, "max": 3.0}
            batches_done()

            # A time range selects windows by start.
            one = windows("s1", frm=T0 + 10 * S, to=T0 + 20 * S)
            assert [w["start"] for w in one["windows"]] == [T0 + 10 * S]
            counts = windows("s1", table="temp_counts")
            assert all(w["end"] - w["start"] == 10 * S for w in counts["windows"])

            # Across keys, paged: every window of every sensor, in (key, start) order.
            expected = sorted((s, start, v) for s, ws in recompute(accepted).items() for start, v in ws.items())
            got, token = [], None
            for _ in range(10):
                r = http.get("/v1/tables/temp_windows/windows", params={
                    "from": T0 - 60 * S, "to": T0 + 120 * S, "limit": 2, "max_lag": 0,
                    **({"page_token": token} if token else {})})
                assert r.status_code == 200, r.text
                page = r.json()
                got += [(i["key"], i["start"], i["value"]) for i in page["items"]]
                token = page["next_page_token"]
                if token is None:
                    break
            assert got == expected

            # gRPC: the same windows, and the same refusals.
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = router_pb2_grpc.RouterStub(channel)
                g = stub.GetWindows(router_pb2.WindowsRequest(table="temp_windows", key="s1", from_ms=T0 - 60 * S,
                                                              to_ms=T0 + 120 * S, typed_values=True), timeout=5)
                assert [(w.start_ms, w.final, orjson.loads(w.value_json)) for w in g.windows] == \
                    [(start, start == T0, v) for start, v in sorted(recompute(accepted)["s1"].items())]
                assert g.windows[0].value["count"] == 3.0 and g.watermark_ms >= T0 + 10 * S
                items = list(stub.ScanWindows(router_pb2.ScanWindowsRequest(
                    table="temp_windows", from_ms=T0 - 60 * S, to_ms=T0 + 120 * S), timeout=10))
                assert [(i.key, i.window.start_ms) for i in items[:-1]] == [(s, start) for s, start, _ in expected]
                assert items[-1].HasField("summary") and len(items[-1].summary.partitions) == 4
                with pytest.raises(grpc.RpcError) as e:
                    stub.Get(router_pb2.GetRequest(table="temp_windows", key="s1"), timeout=5)
                assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "windowed" in e.value.details()
                with pytest.raises(grpc.RpcError) as e:
                    stub.GetWindows(router_pb2.WindowsRequest(table="temp_windows", key="s1", from_ms=5, to_ms=1),
                                    timeout=5)
                assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT

            # The Python client reads the same windows straight from the node, bootstrapped either way.
            expected_s1 = [(start, v, start == T0) for start, v in sorted(recompute(accepted)["s1"].items())]
            with Client(redis_url=redis_url, namespace=namespace) as client:
                direct = client.windows("temp_windows", "s1", from_ms=T0 - 60 * S, to_ms=T0 + 120 * S, max_lag=0)
                assert [(w.start, w.value, w.final) for w in direct.windows] == expected_s1
                assert direct.watermark_ms >= T0 + 10 * S and direct.node == "n1"
                session = client.session()
                assert session.windows("temp_windows", "s2", from_ms=T0, to_ms=T0 + 20 * S).windows
                assert session.positions.of("temp_windows") is not None
                with pytest.raises(WindowedTable):
                    client.get("temp_windows", "s1")
            with Client(router=f"http://127.0.0.1:{rest_port}") as client:
                assert client.windows("temp_windows", "s1", from_ms=T0 - 60 * S, to_ms=T0 + 120 * S).windows == \
                    direct.windows

            # Bad input, each naming its field.
            def refused(path: str, **params) -> dict:
                r = http.get(path, params=params)
                assert r.status_code == 400, (path, params, r.text)
                return r.json()["error"]

            assert refused("/v1/tables/temp_windows/keys/s1")["code"] == "WINDOWED_TABLE"
            assert "/windows" in refused("/v1/tables/temp_windows/keys/s1")["message"]
            assert refused("/v1/tables/temp_windows/scan")["code"] == "WINDOWED_TABLE"
            key_windows = "/v1/tables/temp_windows/keys/s1/windows"
            assert refused(key_windows, **{"from": 10, "to": 5})["field"] == "from"
            assert refused(key_windows, **{"from": -1, "to": 5})["field"] == "from"
            assert refused(key_windows, **{"from": "1.5", "to": 5})["field"] == "from"
            assert refused(key_windows, **{"from": 0})["field"] == "to"
            assert refused(key_windows, **{"from": 0, "to": 10_001 * 10 * S})["field"] == "to"  # > 10,000 windows
            token_of_other_range = http.get("/v1/tables/temp_windows/windows", params={
                "from": T0 - 60 * S, "to": T0 + 120 * S, "limit": 1}).json()["next_page_token"]
            assert refused("/v1/tables/temp_windows/windows", **{"from": T0, "to": T0 + 120 * S,
                                                                 "page_token": token_of_other_range})["field"] == \
                "page_token"

            # Retention 20 s: event time T0+55 s moves the watermark to T0+50 s, past every window above's end + 20 s.
            send("s4", 55, 7.0)
            wait_until(lambda: served("s1") == {} and served("s4") == {T0 + 50 * S: {"count": 1, "min": 7.0,
                                                                                     "max": 7.0}},
                       60, "s1's windows to expire")
            expired = {(b"s1", T0), (b"s1", T0 + 10 * S), (b"s2", T0), (b"s2", T0 + 10 * S), (b"s3", T0 + 10 * S)}

            def changelog() -> list:
                return read_topic(broker, f"{namespace}temp_windows-changelog")

            # Tombstones of other partitions may still be on their way when s1's partition shows the new watermark.
            wait_until(lambda: expired <= {split_window_key(k) for _p, _o, _t, k, v in changelog() if v is None}, 30,
                       "the expired windows' tombstones")
            assert all(k == WATERMARK_KEY or split_window_key(k) is not None for _p, _o, _t, k, _v in changelog())

            # The node again, from an empty directory: the restore brings back neither expired windows nor lost ones.
            procs.stop("node")
            procs.start("node", "store-node", "--node-id", "n1", "--data-dir", str(tmp_path / "n1-b"))
            # Each key read below is waited for on its own: s1's partition and s4's restore at different moments.
            for sensor in ("s1", "s4"):
                wait_until(lambda sensor=sensor: served(sensor) is not None, 120,
                           f"the restored node to serve {sensor}'s partition")
            assert served("s1") == {} and served("s4") == {T0 + 50 * S: {"count": 1, "min": 7.0, "max": 7.0}}
            assert finals("s4") == {T0 + 50 * S: False}
    finally:
        procs.stop_all()
        pipeline.proc.terminate()
        pipeline.wait_exit(60)

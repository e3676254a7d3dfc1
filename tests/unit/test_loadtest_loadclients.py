"""gRPC body framing for h2load, and parsing what h2load, wrk and redis-benchmark print."""

from __future__ import annotations

import pytest

from loadtest.loadclients import (grpc_frame, grpc_unframe, h2load_command, parse_h2load, parse_h2load_log,
                                  parse_redis_benchmark, parse_wrk)
from proto import router_pb2, store_pb2


def test_grpc_frame_is_flag_length_payload():
    msg = router_pb2.GetRequest(table="sensor_stats", key="sensor-1").SerializeToString()
    body = grpc_frame(msg)
    assert body[0] == 0
    assert int.from_bytes(body[1:5], "big") == len(msg)
    assert body[5:] == msg
    assert router_pb2.GetRequest.FromString(grpc_unframe(body)[0]).key == "sensor-1"
    assert grpc_frame(b"") == b"\x00\x00\x00\x00\x00"
    assert grpc_frame(b"x", compressed=True)[0] == 1


def test_grpc_unframe_reads_several_messages_and_rejects_truncation():
    a = store_pb2.KeyRead(id=1, table="t", partition=3, key=b"k").SerializeToString()
    b = store_pb2.KeyRead(id=2, table="t", partition=4, key=b"kk").SerializeToString()
    assert grpc_unframe(grpc_frame(a) + grpc_frame(b)) == [a, b]
    with pytest.raises(ValueError):
        grpc_unframe(grpc_frame(a)[:-1])
    with pytest.raises(ValueError):
        grpc_unframe(b"\x00\x00")


H2LOAD_OUT = """starting benchmark...
Main benchmark duration is over for thread #0. Stopping all clients.

finished in 3.00s, 2095.67 req/s, 485.00KB/s
requests: 6287 total, 6303 started, 6287 done, 6287 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 6287 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 1.42MB (1489929) total, 18.57KB (19011) headers (space savings 96.27%), 1.07MB (1119086) data
                     min         max         mean         sd        +/- sd
time for request:      347us     61.72ms      7.61ms      3.96ms    81.26%
"""


def test_parse_h2load_summary():
    r = parse_h2load(H2LOAD_OUT)
    assert r.seconds == 3.0 and r.rps == 2095.67
    assert (r.total, r.done, r.succeeded, r.failed, r.errored, r.timeout) == (6287, 6287, 6287, 0, 0, 0)
    assert r.status_2xx == 6287 and r.status_4xx == 0 and r.status_5xx == 0
    assert r.data_bytes == 1119086
    with pytest.raises(ValueError):
        parse_h2load("connect failed")


def test_parse_h2load_log(tmp_path):
    log = tmp_path / "h2.log"
    log.write_text("1795306435935759\t200\t1965\n1795306435935715\t503\t2449\n\n")
    latencies, statuses = parse_h2load_log(log)
    assert latencies == [1.965, 2.449]
    assert statuses == {200: 1, 503: 1}


def test_h2load_command_for_grpc_posts_the_body_with_grpc_headers(tmp_path):
    body = tmp_path / "b.bin"
    cmd = h2load_command("http://127.0.0.1:1/freshroute.v1.Router/Get", 4, 16, 5, body_file=body,
                         headers=("content-type: application/grpc", "te: trailers"), rps_per_client=50,
                         log_file=tmp_path / "l.log")
    joined = " ".join(cmd)
    assert "-t 1 -c 4 -m 16 -D 5" in joined and f"-d {body}" in joined and "--rps 50" in joined
    assert "-H content-type: application/grpc" in joined and "-H te: trailers" in joined
    assert cmd[-1] == "http://127.0.0.1:1/freshroute.v1.Router/Get"


def test_parse_wrk_json_line():
    out = ("Running 1s test @ http://127.0.0.1:8080/\nRequests/sec: 499.53\n"
           'WRK_JSON {"requests":500,"duration_us":2000000,"bytes":1000,"connect_errors":0,"read_errors":1,'
           '"write_errors":0,"status_errors":2,"timeouts":0,"p50_us":3360,"p99_us":9000}\n')
    doc = parse_wrk(out)
    assert doc["rps"] == 250.0 and doc["errors"] == 3 and doc["p99_us"] == 9000
    with pytest.raises(ValueError):
        parse_wrk("Requests/sec: 1")


def test_parse_redis_benchmark_csv():
    out = ('"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms"\n'
           '"GET","54644.81","0.097","0.024","0.095"\n')
    assert parse_redis_benchmark(out) == 54644.81
    with pytest.raises(ValueError):
        parse_redis_benchmark("")

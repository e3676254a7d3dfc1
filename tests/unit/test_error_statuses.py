"""Each error's code travels with one HTTP status and one gRPC status; the shared errors carry no transport library."""

import subprocess
import sys

import grpc
import pytest

from freshroute import errors
from router.grpc_errors import grpc_status

EXPECTED = [
    (errors.InvalidArgument, 400, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.TableNotFound, 404, grpc.StatusCode.NOT_FOUND),
    (errors.KeyNotFound, 404, grpc.StatusCode.NOT_FOUND),
    (errors.ReplicaUnavailable, 503, grpc.StatusCode.UNAVAILABLE),
    (errors.NoReplicaWithinBound, 503, grpc.StatusCode.UNAVAILABLE),
    (errors.LookupTimeout, 504, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.StoreCorrupt, 500, grpc.StatusCode.INTERNAL),
    (errors.ConfigError, 500, grpc.StatusCode.INTERNAL),
    (errors.ClientClosed, 500, grpc.StatusCode.INTERNAL),
    (errors.FreshrouteError, 500, grpc.StatusCode.INTERNAL),
]


@pytest.mark.parametrize("cls,http,status", EXPECTED, ids=[c.__name__ for c, _, _ in EXPECTED])
def test_each_error_has_one_http_and_one_grpc_status(cls, http, status):
    err = cls("x")
    assert (err.http_status, grpc_status(err)) == (http, status)
    # A body read back (a client's, from REST or a trailer) is the same error with the same statuses.
    back = errors.from_body(err.to_body(), http)
    assert type(back) is cls and grpc_status(back) == status


def test_an_unknown_retryable_code_read_back_stays_retryable():
    back = errors.from_body({"error": {"code": "SOMETHING_NEW", "message": "m", "node": "n1"}}, 503)
    assert isinstance(back, errors.RetryableError) and back.retryable
    assert back.code == "SOMETHING_NEW" and grpc_status(back) == grpc.StatusCode.UNAVAILABLE
    assert back.to_body() == {"error": {"code": "SOMETHING_NEW", "message": "m", "node": "n1"}}


def test_an_unknown_code_keeps_its_status_and_is_not_retryable():
    back = errors.from_body({"error": {"code": "TEAPOT", "message": "m"}}, 418)
    assert not isinstance(back, errors.RetryableError) and not back.retryable
    assert (back.code, back.http_status, grpc_status(back)) == ("TEAPOT", 418, grpc.StatusCode.INTERNAL)
    # The classes themselves keep their statuses: a foreign error sets its own on the instance it makes.
    assert (errors.FreshrouteError.code, errors.FreshrouteError.http_status) == ("INTERNAL", 500)


def test_the_shared_package_and_the_pipeline_import_no_transport_library():
    code = ("import sys, freshroute.errors, freshroute.keys, freshroute.metadata.store, freshroute.metadata.progress, "
            "freshroute.bound, freshroute.lag, pipeline.job; "
            "print(sorted(m for m in ('grpc', 'fastapi', 'uvicorn', 'httpx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

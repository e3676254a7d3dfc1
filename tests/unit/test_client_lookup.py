"""The client's Lookup: rows travel as the changelog's JSON bytes and are decoded when ``value`` is read."""

import orjson
import pytest

from freshroute.client import Lookup
from freshroute.errors import FreshrouteError
from freshroute.metadata.roles import ReplicaState, Role
from freshroute.routing.selection import Candidate
from freshroute.routing.snapshot import ReplicaView
from freshroute.wire import GroupResult, ReadStatus, ReplicaStatus

ROW = {"count": 3, "avg": 1.5, "last": None}


def answer(*values: bytes) -> tuple[Candidate, GroupResult]:
    rep = ReplicaStatus("node-2", Role.STANDBY, ReplicaState.STANDBY, 40, 42, 2, 15)
    view = ReplicaView.__new__(ReplicaView)
    return Candidate(view, 0, 0, 0), GroupResult(ReadStatus.OK, list(values), rep)


def test_a_batch_keeps_each_row_as_its_json_bytes_and_decodes_it_on_read():
    cand, group = answer(orjson.dumps(ROW), b"")
    found, missing = Lookup.group("t", ["a", "b"], 5, cand, group, (7, 900))
    assert found.raw_value == orjson.dumps(ROW) and found.value == ROW and found.found
    assert (found.partition, found.node, found.role, found.lag_offsets, found.lag_ms, found.applied_offset,
            found.input_lag_records, found.input_lag_ms) == (5, "node-2", "standby", 2, 15, 40, 7, 900)
    assert not missing.found and missing.raw_value is None and missing.value is None
    # Each read decodes anew: a caller changing one decoded row changes no other.
    found.value["count"] = 99
    assert found.value == ROW


def test_a_router_answer_becomes_the_same_lookup_as_a_direct_read():
    doc = {"table": "t", "key": "a", "value": ROW, "partition": 5, "served_by": {"node": "node-2", "role": "standby"},
           "lag": {"offsets": 2, "ms": 15}}
    got = Lookup.from_json(doc)
    assert got.value == ROW and orjson.loads(got.raw_value) == ROW and got.found
    assert Lookup.from_json(doc | {"value": None}, found=False).value is None
    assert got.lag_offsets == 2
    # null: the serving replica did not know its changelog's end offset, which is not a lag of 0
    assert Lookup.from_json(doc | {"lag": {"offsets": None, "ms": 15}}).lag_offsets is None


def test_a_row_that_is_not_json_is_the_projects_error_not_a_decoder_traceback():
    cand, group = answer(b"{not json")
    (bad,) = Lookup.group("t", ["a"], 0, cand, group)
    with pytest.raises(FreshrouteError, match="not JSON") as e:
        bad.value
    assert e.value.details == {"table": "t", "key": "a"}

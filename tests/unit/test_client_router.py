"""The client's way through a router (its REST API): what it sends for a key, and what it refuses to send."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from freshroute.client.router import RouterHttp
from freshroute.errors import InvalidArgument
from freshroute.bound import NO_BOUND


def router_seeing(sent: list[httpx.Request]) -> RouterHttp:
    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"table": "t", "key": "café/1", "partition": 0, "value": {"n": 1},
                                         "served_by": {"node": "n1", "role": "active"}, "lag": {"offsets": 0, "ms": 0}})

    router = RouterHttp("http://router", 1.0)
    router._http = httpx.AsyncClient(base_url="http://router", transport=httpx.MockTransport(answer))
    return router


def test_a_key_goes_as_its_utf8_percent_encoded():
    sent: list[httpx.Request] = []
    got = asyncio.run(router_seeing(sent).get("t", "café/1", NO_BOUND))
    assert got.found and got.value == {"n": 1}
    assert sent[0].url.raw_path == b"/v1/tables/t/keys/caf%C3%A9%2F1"


@pytest.mark.parametrize("read", ["get", "get_many", "windows", "metadata", "scan"])
def test_a_key_that_is_not_unicode_text_is_refused_before_anything_is_sent(read):
    sent: list[httpx.Request] = []
    router = router_seeing(sent)
    bad = "k-\ud800"
    calls = {"get": lambda: router.get("t", bad, NO_BOUND),
             "get_many": lambda: router.get_many("t", ["k", bad], NO_BOUND),
             "windows": lambda: router.windows("t", bad, 0, 1, NO_BOUND),
             "metadata": lambda: router.key_metadata("t", bad),
             "scan": lambda: router.scan_page("t", bad, "", "", None, None, NO_BOUND)}
    with pytest.raises(InvalidArgument) as e:
        asyncio.run(calls[read]())
    # A batch's bad key is named as the REST API and a direct read name it: field keys, index in the message.
    assert e.value.details["field"] == {"get_many": "keys", "scan": "prefix"}.get(read, "key")
    assert (read != "get_many" or "keys[1]" in e.value.message) and "lone surrogate" in e.value.message
    assert sent == []

"""A caller's batch keys and scan arguments, as both clients check them."""

from __future__ import annotations

import pytest

from freshroute.client.arguments import ScanRange, batch_keys
from freshroute.errors import InvalidArgument


def test_batch_keys_are_any_iterable_of_keys_as_a_list():
    assert batch_keys(("a", "b")) == ["a", "b"]
    assert batch_keys(k for k in ["x"]) == ["x"]
    assert batch_keys([]) == []


@pytest.mark.parametrize("keys, why", [("sensor-1", "not one string"), (b"sensor-1", "not one string"),
                                       (None, "not NoneType"), (5, "not int")])
def test_one_string_or_no_iterable_is_not_a_batch(keys, why):
    with pytest.raises(InvalidArgument) as e:
        batch_keys(keys)
    assert e.value.details["field"] == "keys" and why in e.value.message


def test_a_scan_range_reads_none_as_unbounded_and_pages_up_to_its_limit():
    r = ScanRange.of(None, None, None, 25, 10, 1000)
    assert (r.prefix, r.start, r.end) == ("", "", "")
    assert [r.next_page(sent) for sent in (0, 10, 20, 25)] == [10, 10, 5, None]
    assert ScanRange.of("p", "a", "z", None, None, 1000).next_page(10**9) == 1000  # no limit, the largest page
    assert ScanRange.of("", "", "", None, 0, 1000).page_size == 1000
    assert ScanRange.of("", "", "", 0, None, 1000).next_page(0) is None  # nothing asked, nothing read


@pytest.mark.parametrize("limit, page_size, field", [(-1, None, "limit"), ("10", None, "limit"), (True, None, "limit"),
                                                     (1.5, None, "limit"), (None, -5, "page_size"),
                                                     (None, 1001, "page_size"), (None, "5", "page_size")])
def test_a_bad_limit_or_page_size_is_an_invalid_argument_naming_it(limit, page_size, field):
    with pytest.raises(InvalidArgument) as e:
        ScanRange.of(None, None, None, limit, page_size, 1000)
    assert e.value.details["field"] == field


@pytest.mark.parametrize("kw, setting", [({}, "redis_url"), ({"redis_url": "127.0.0.1:6379"}, "redis_url"),
                                         ({"redis_sentinels": "host-without-port", "redis_master_name": "m"},
                                          "redis_sentinels"),
                                         ({"redis_sentinels": "127.0.0.1:26379"}, "redis_sentinels"),  # no master
                                         ({"router": "127.0.0.1:8080"}, "router"), ({"router": "ftp://h"}, "router"),
                                         ({"router": "http://"}, "router")])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_client_that_could_never_work_fails_at_construction_naming_the_argument(kw, setting, kind):
    from freshroute.client import AsyncClient, Client
    from freshroute.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        (Client if kind == "sync" else AsyncClient)(**kw)
    assert e.value.details["setting"] == setting

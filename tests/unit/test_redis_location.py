"""Where the metadata store is: sentinel addresses, the settings that name them, and what is refused."""

from __future__ import annotations

import socket

import pytest

from freshroute.errors import ConfigError
from freshroute.redis_location import RedisLocation, parse_sentinels
from freshroute.settings import load
from store_node.settings import StoreNodeSettings


def test_sentinel_addresses_parse_with_ipv6_and_spaces():
    assert parse_sentinels("127.0.0.1:26379, [::1]:26380,sentinel-3.example:26381") == (
        ("127.0.0.1", 26379), ("::1", 26380), ("sentinel-3.example", 26381))
    assert parse_sentinels("") == ()


@pytest.mark.parametrize("bad", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "::1:26379", "h:p"])
def test_a_malformed_sentinel_address_is_named(bad):
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        parse_sentinels(f"127.0.0.1:26379,{bad}")


def test_settings_name_the_sentinel_setting_that_is_wrong_or_missing():
    with pytest.raises(ConfigError, match="redis_sentinels.*not HOST:PORT"):
        load(StoreNodeSettings, node_id="n1", redis_sentinels="nowhere", redis_master_name="m")
    with pytest.raises(ConfigError, match="redis_master_name is required"):
        load(StoreNodeSettings, node_id="n1", redis_sentinels="127.0.0.1:26379")
    with pytest.raises(ConfigError, match="redis_sentinels is required"):
        load(StoreNodeSettings, node_id="n1", redis_master_name="m")
    s = load(StoreNodeSettings, node_id="n1", redis_sentinels="127.0.0.1:26379", redis_master_name="m", redis_url="redis://:pw@x/3")
    where = s.redis()
    assert where.by_sentinel and where.sentinels == (("127.0.0.1", 26379),) and where.master_name == "m"
    assert str(where) == "master 'm' via sentinels 127.0.0.1:26379"
    assert where._db_password() == {"db": 3, "password": "pw", "username": ""}
    assert str(load(StoreNodeSettings, node_id="n1", redis_url="redis://:secret@10.0.0.5:6380/0").redis()) == "10.0.0.5:6380"


def test_a_sentinel_client_finds_the_master_by_name_without_connecting_yet():
    where = RedisLocation("redis://127.0.0.1:6379/2", (("127.0.0.1", 1),), "m")
    client = where.client(0.2)
    assert client.connection_pool.service_name == "m" and client.connection_pool.connection_kwargs["db"] == 2


def test_no_sentinel_answering_is_an_outage_not_a_config_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        RedisLocation("redis://127.0.0.1:6379/0", (("127.0.0.1", port),), "m").check_master_known(0.2)
    RedisLocation("redis://127.0.0.1:6379/0").check_master_known()  # no sentinel: nothing to check
    with pytest.raises(ValueError, match="both"):
        RedisLocation("redis://127.0.0.1:6379/0", (("127.0.0.1", 1),), "")

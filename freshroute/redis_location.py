"""Where the metadata store is: one Redis URL, or a master that Redis Sentinel names.

Every process connects through :class:`RedisLocation`, so that each of them follows a
Sentinel failover the same way: redis-py asks the sentinels for the current master on every
new connection, and drops a connection whose server has been demoted to a replica.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from freshroute.errors import ConfigError

_SENTINEL = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]\s]+)):(?P<port>\d{1,5})$")


def parse_sentinels(text: str) -> tuple[tuple[str, int], ...]:
    """``HOST:PORT,HOST:PORT,...`` (IPv6 as ``[::1]:26379``) → addresses; raises ValueError naming the bad one."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        m = _SENTINEL.match(item)
        port = int(m.group("port")) if m else 0
        if m is None or not 0 < port < 65536:
            raise ValueError(f"{item!r} is not HOST:PORT (IPv6: [ADDRESS]:PORT)")
        out.append((m.group("v6") or m.group("host"), port))
    return tuple(out)


@dataclass(frozen=True)
class RedisLocation:
    """A Redis URL, or (with ``sentinels``) the master called ``master_name``; ``url`` then gives only db and password."""

    url: str = "redis://127.0.0.1:6379/0"
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str = ""

    @classmethod
    def of(cls, settings: Any) -> "RedisLocation":
        """From any settings with ``redis_url`` and, optionally, ``redis_sentinels`` and ``redis_master_name``."""
        sentinels = getattr(settings, "redis_sentinels", "") or ""
        return cls(settings.redis_url, parse_sentinels(sentinels), getattr(settings, "redis_master_name", "") or "")

    def __post_init__(self) -> None:
        if bool(self.sentinels) != bool(self.master_name):
            raise ValueError("Redis Sentinel needs both sentinels and a master name")

    @property
    def by_sentinel(self) -> bool:
        return bool(self.sentinels)

    def __str__(self) -> str:
        """For logs: never the password."""
        if self.by_sentinel:
            return f"master {self.master_name!r} via sentinels {','.join(f'{h}:{p}' for h, p in self.sentinels)}"
        parts = urlsplit(self.url)
        return f"{parts.hostname}:{parts.port or 6379}"

    def _db_password(self) -> dict[str, Any]:
        parts = urlsplit(self.url)
        db = (parts.path or "/0").strip("/") or "0"
        return {"db": int(db) if db.isdigit() else 0, "password": parts.password, "username": parts.username}

    def client(self, timeout_s: float, **kwargs: Any) -> Any:
        """A synchronous ``redis.Redis`` for this location."""
        import redis
        from redis.sentinel import Sentinel

        return self._connect(redis.Redis, Sentinel, timeout_s, kwargs)

    def async_client(self, timeout_s: float, **kwargs: Any) -> Any:
        """A ``redis.asyncio.Redis`` for this location."""
        import redis.asyncio as aioredis
        from redis.asyncio.sentinel import Sentinel

        return self._connect(aioredis.Redis, Sentinel, timeout_s, kwargs)

    def _connect(self, redis_cls: Any, sentinel_cls: Any, timeout_s: float, kwargs: dict[str, Any]) -> Any:
        timeouts = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
        if not self.by_sentinel:
            return redis_cls.from_url(self.url, **timeouts, **kwargs)
        sentinel = sentinel_cls(list(self.sentinels), sentinel_kwargs=timeouts)
        return sentinel.master_for(self.master_name, **timeouts, **self._db_password(), **kwargs)

    def check_master_known(self, timeout_s: float = 1.0) -> None:
        """At start: fail if sentinels answer and none of them knows the master name.

        No sentinel answering is an outage, which every component rides out; a name no
        sentinel knows is a setting that will never work.
        """
        if not self.by_sentinel:
            return
        import redis

        answered = []
        for host, port in self.sentinels:
            conn = redis.Redis(host=host, port=port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
            try:
                masters = conn.sentinel_masters()
            except redis.RedisError:
                continue
            finally:
                conn.close()
            assert isinstance(masters, dict)  # by name, as every protocol's reply is parsed
            if self.master_name in masters:
                return
            answered.append((f"{host}:{port}", sorted(masters)))
        if answered:
            where, known = answered[0]
            raise ConfigError(f"redis_master_name: no sentinel knows a master called {self.master_name!r} "
                              f"(sentinel {where} knows {known or 'none'})", setting="redis_master_name")

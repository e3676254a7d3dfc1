"""Settings shared by every role: where the broker and Redis are.

Each role extends these with its own typed settings (``pipeline.settings``,
``store_node.settings``, ``router.settings``), read from flags and ``FRESHROUTE_*``
environment variables; a wrong value fails naming the key.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from freshroute.errors import ConfigError

if TYPE_CHECKING:
    from freshroute.redis_location import RedisLocation
    from freshroute.tls import ServerTLS


class CommonSettings(BaseSettings):
    """Broker and Redis coordinates, the same for every process of one deployment."""

    model_config = SettingsConfigDict(env_prefix="FRESHROUTE_", frozen=True, extra="forbid")

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis holding the metadata (soft state only)")
    redis_sentinels: str = Field("", description="Redis Sentinel addresses HOST:PORT,... (with redis_master_name): "
                                                 "the metadata store is the master they name, and failovers are "
                                                 "followed; redis_url then gives only the database and password")
    redis_master_name: str = Field("", description="the master's name in Redis Sentinel (with redis_sentinels)")
    namespace: str = Field("freshroute", description="prefix of every metadata key in Redis, one per deployment")
    # NoDecode: the environment's value is a file's path as often as JSON; the validator tells them apart.
    kafka_config: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict,
        description="librdkafka settings for every Kafka client of the process (SASL, TLS, timeouts): a "
                    "properties file (one name=value per line, # comments), or a JSON object inline")

    @field_validator("kafka_config", mode="before")
    @classmethod
    def _kafka_config(cls, v: Any) -> Any:
        if isinstance(v, Path) or (isinstance(v, str) and not v.lstrip().startswith("{")):
            v = read_kafka_properties(Path(v))
        elif isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError as e:
                raise ValueError(f"not a JSON object: {e}") from None
        if isinstance(v, dict) and "bootstrap.servers" in v:
            raise ValueError("bootstrap.servers belongs in bootstrap_servers (--bootstrap-servers), not here")
        return v

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels(cls, v: str) -> str:
        from freshroute.redis_location import parse_sentinels

        parse_sentinels(v)  # raises ValueError naming the bad address
        return v

    @model_validator(mode="after")
    def _sentinel_pair(self) -> "CommonSettings":
        if self.redis_sentinels.strip() and not self.redis_master_name:
            raise ValueError("redis_master_name is required with redis_sentinels")
        if self.redis_master_name and not self.redis_sentinels.strip():
            raise ValueError("redis_sentinels is required with redis_master_name")
        return self

    def redis(self) -> "RedisLocation":
        """Where the metadata store is (a URL, or a Sentinel master)."""
        from freshroute.redis_location import RedisLocation

        return RedisLocation.of(self)

    def kafka(self, **overrides: Any) -> dict[str, Any]:
        """A librdkafka config dict for this deployment."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka_config, **overrides}


_PROPERTY = re.compile(r"^([A-Za-z0-9._-]+)\s*[=:]\s*(.*)$")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this host's loopback."""
    import ipaddress

    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServingSettings(CommonSettings):
    """TLS and the cluster secret of a process that serves ports: a router or a store node."""

    tls_cert: Path | None = Field(default=None, description="PEM certificate (chain) of every port served (router: "
                                  "REST and gRPC, with ALPN h2; store node: gRPC and the read port); with tls_key, "
                                  "they speak only TLS; reloaded on SIGHUP")
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert")
    tls_client_ca: Path | None = Field(default=None, description="PEM CA certificate(s): with it, every port "
                                       "requires a client certificate signed by them (mTLS)")
    cluster_secret_file: Path | None = Field(default=None, description="cluster secrets, one per line: a store node "
                                             "serves only peers presenting one; a router presents the first to "
                                             "store nodes; reloaded on SIGHUP by store nodes")

    @model_validator(mode="after")
    def _tls_files_together(self) -> "ServingSettings":
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both, or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key: client certificates are checked over TLS")
        return self

    def server_tls(self, alpn: tuple[str, ...] = ()) -> "ServerTLS | None":
        """A port's TLS from these files (None without them); a bad file fails naming its setting."""
        from freshroute.tls import ServerTLS

        if self.tls_cert is None or self.tls_key is None:
            return None
        return ServerTLS(self.tls_cert, self.tls_key, self.tls_client_ca, alpn)


def read_kafka_properties(path: Path) -> dict[str, str]:
    """A librdkafka properties file (``name=value`` per line, ``#`` or ``!`` comments) → config; errors name file and line."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        m = _PROPERTY.match(line)
        if m is None:
            raise ValueError(f"{path}, line {number}: expected name=value, got {line[:60]!r}")
        out[m.group(1)] = m.group(2).strip()
    return out


def kafka_client_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """A confluent-kafka config for tools outside the components' settings (demo producer, benchmarks, tests):
    ``bootstrap`` plus ``FRESHROUTE_KAFKA_CONFIG``, the same file or JSON the components read, logging through
    the logger ``freshroute.kafka`` (:func:`kafka_logging`)."""
    raw = os.environ.get("FRESHROUTE_KAFKA_CONFIG", "")
    try:
        extra = CommonSettings._kafka_config(raw) if raw.strip() else {}
    except ValueError as e:
        raise ConfigError(f"FRESHROUTE_KAFKA_CONFIG: {e}", setting="kafka_config") from None
    return {"bootstrap.servers": bootstrap, **extra, **kafka_logging("freshroute.kafka"), **overrides}


class QuietRepeats(logging.Filter):
    """librdkafka logs the same connection failure on every reconnect attempt; pass one per interval."""

    def __init__(self, interval_s: float = 60.0) -> None:
        super().__init__()
        self._interval = interval_s
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # librdkafka's parenthesised details (timings, "N identical error(s) suppressed") vary between repeats.
        key = record.getMessage()
        while (bare := re.sub(r"\([^()]*\)", "", key)) != key:
            key = bare
        key = re.sub(r"\d+", "#", key)[:200]
        now = time.monotonic()
        last = self._seen.get(key)
        if last is not None and now - last < self._interval:
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[key] = now
        return True


def kafka_logging(name: str) -> dict[str, Any]:
    """confluent-kafka settings that send a client's librdkafka lines, warnings and worse, to the logger ``name``
    (in the process's log format, where librdkafka alone prints its own to stderr), a repeated failure once a minute.
    Python clients only: a Spark option or the bulk reader's config takes strings."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, QuietRepeats) for f in logger.filters):
        logger.addFilter(QuietRepeats())
    return {"logger": logger, "log_level": 4}


def load(cls: type[BaseSettings], **values: Any) -> Any:
    """Build settings from explicit values (flags) over the environment; fail naming the key."""
    try:
        return cls(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '?'}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"invalid {cls.__name__}: {problems}") from None


def embedded(declaration: type, *names: str) -> dict[str, Any]:
    """Settings declared once in a dataclass of :func:`freshroute.declared.setting` fields (all of them, or
    ``names``), as the field definitions of ``pydantic.create_model``: a process's settings embed them."""
    hints = typing.get_type_hints(declaration)
    embedded = {}
    for f in dataclasses.fields(declaration):
        if names and f.name not in names:
            continue
        default = ({"default": f.default} if f.default is not dataclasses.MISSING
                   else {"default_factory": f.default_factory})
        embedded[f.name] = (hints[f.name], Field(description=f.metadata["description"], **default,
                                                 **f.metadata["limits"]))
    return embedded

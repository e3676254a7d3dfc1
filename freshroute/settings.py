"""Settings shared by every role: where the broker and Redis are.

Each role extends these with its own typed settings (``pipeline.settings``,
``store_node.settings``, ``router.settings``), read from flags and ``FRESHROUTE_*``
environment variables; a wrong value fails naming the key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from freshroute.errors import ConfigError

if TYPE_CHECKING:
    from freshroute.redis_location import RedisLocation


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
    kafka_config: dict[str, Any] = Field(
        default_factory=dict,
        description="extra librdkafka settings as a JSON object, e.g. SASL/TLS for a real cluster")

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


def load(cls: type[BaseSettings], **values: Any) -> Any:
    """Build settings from explicit values (flags) over the environment; fail naming the key."""
    try:
        return cls(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '?'}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"invalid {cls.__name__}: {problems}") from None

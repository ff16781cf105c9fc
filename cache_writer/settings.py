"""Settings of the cache tiers (``FRESHKEY_REDIS_*``)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class RedisSettings(BaseSettings):
    """The Redis L2 tier. A password goes in ``FRESHKEY_REDIS_PASSWORD``, never in the URL."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_REDIS_", extra="ignore")

    url: str = "redis://127.0.0.1:6379/0"
    password: SecretStr | None = None
    key_prefix: str = Field("fk", pattern=r"^[A-Za-z0-9_.-]+$")
    tombstone_ttl_s: int = Field(
        86_400, ge=1, description="How long a delete's tombstone rejects late older writes."
    )
    entry_ttl_s: int | None = Field(None, ge=1, description="TTL of live entries; none by default.")
    broadcast: bool = Field(
        True, description="Announce every applied change on <prefix>:invalidations for in-process tiers."
    )

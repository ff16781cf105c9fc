"""Settings of the cache tiers (``FRESHKEY_REDIS_*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class RedisSettings(BaseSettings):
    """The Redis L2 tier. A password goes in ``FRESHKEY_REDIS_PASSWORD``, never in the URL."""

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_REDIS_", extra="ignore", frozen=True)

    url: str = "redis://127.0.0.1:6379/0"
    cluster: bool = Field(
        False,
        description="The URL names one node (a seed) of a Redis Cluster; the client discovers the rest.",
    )
    password: SecretStr | None = None
    key_prefix: str = Field("fk", pattern=r"^[A-Za-z0-9_.-]+$")
    tombstone_ttl_s: int = Field(
        86_400, ge=1, description="How long a delete's tombstone rejects late older writes."
    )
    entry_ttl_s: int | None = Field(None, ge=1, description="TTL of live entries; none by default.")
    socket_timeout_s: float = Field(
        5.0, gt=0, description="A Redis command that takes longer fails (the tier counts as failing)."
    )
    broadcast: bool = Field(
        True, description="Announce every applied change on <prefix>:invalidations for in-process tiers."
    )


class L3Settings(BaseSettings):
    """An optional outer tier: a second Redis with longer TTLs (``FRESHKEY_REDIS_L3_*``).

    The pipeline invalidates it before L2 and writes it after L2, so no reader can refill L2 from it
    with data the pipeline has already replaced.
    """

    model_config = SettingsConfigDict(env_prefix="FRESHKEY_REDIS_L3_", extra="ignore", frozen=True)

    url: str | None = Field(None, description="Unset: no L3.")
    password: SecretStr | None = None
    entry_ttl_s: int | None = Field(7 * 86_400, ge=1, description="TTL of live L3 entries.")
    flush: Literal["scan", "flushdb"] = Field(
        "scan",
        description="How a fenced L3 is emptied before it is trusted again: scan (UNLINK every key under "
        "the prefix) or flushdb (FLUSHDB: only when its database holds nothing but freshkey's entries).",
    )

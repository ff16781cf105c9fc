"""Settings of the cache tiers (``FRESHKEY_REDIS_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_URL = (
    "redis://[user@]host:port/db, or rediss:// for TLS; an ACL user goes in the URL, its password in "
    "{prefix}PASSWORD (never in the URL)"
)


def _check_security(
    prefix: str, url: str | None, ca: Path | None, cert: Path | None, key: Path | None
) -> None:
    """ValueError, naming the variable to change, for a password in the URL, TLS files without
    ``rediss://``, half a client certificate, or a file that cannot be read."""
    if url is None:
        return
    parts = urlsplit(url)
    if parts.password:
        raise ValueError(
            f"{prefix}URL holds a password: move it to {prefix}PASSWORD and keep only the user in the URL "
            f"({parts.scheme}://{parts.username or ''}@{parts.hostname}...)"
        )
    if (ca or cert or key) and parts.scheme != "rediss":
        raise ValueError(f"{prefix}SSL_* are set but {prefix}URL is {parts.scheme}://: use rediss:// for TLS")
    if (cert is None) != (key is None):
        raise ValueError(f"{prefix}SSL_CERT and {prefix}SSL_KEY go together: set both or neither")
    for name, path in (("SSL_CA", ca), ("SSL_CERT", cert), ("SSL_KEY", key)):
        if path is None:
            continue
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            reason = exc.strerror or exc
            raise ValueError(f"{prefix}{name}={path}: {reason}; set it to a readable PEM file") from None


class RedisSettings(BaseSettings):
    """The Redis L2 tier. An ACL user goes in the URL (``redis://user@host:6379/0``), its password in
    ``FRESHKEY_REDIS_PASSWORD``, never in the URL; ``rediss://`` for TLS, with the ``SSL_*`` files
    (``cache_writer.redis.security`` maps them for redis-py)."""

    model_config = SettingsConfigDict(
        env_prefix="FRESHKEY_REDIS_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    url: str = Field("redis://127.0.0.1:6379/0", description=_URL.format(prefix="FRESHKEY_REDIS_"))
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
    fence_on_restore: bool = Field(
        True,
        description="Fence every namespace when L2's data set was restored from another incarnation of "
        "the server (a snapshot or append-only file loaded at a restart, a replica promoted after a "
        "failover): its entries may be older than the changes applied since (an L3 is flushed instead). "
        "Turn off only for a Redis "
        "whose restarts and failovers never lose an acknowledged write.",
    )
    ssl_ca: Path | None = Field(
        None, description="With rediss://: CA certificate (PEM) of the server; the system's CAs if unset."
    )
    ssl_cert: Path | None = Field(
        None, description="With rediss://: client certificate (PEM), for servers with tls-auth-clients yes."
    )
    ssl_key: Path | None = Field(None, description="Private key (PEM) of FRESHKEY_REDIS_SSL_CERT.")
    ssl_check_hostname: bool = Field(
        True, description="With rediss://: check that the certificate names the URL's host."
    )

    @model_validator(mode="after")
    def _security(self) -> RedisSettings:
        _check_security("FRESHKEY_REDIS_", self.url, self.ssl_ca, self.ssl_cert, self.ssl_key)
        return self


class L3Settings(BaseSettings):
    """An optional outer tier: a second Redis with longer TTLs (``FRESHKEY_REDIS_L3_*``).

    The pipeline invalidates it before L2 and writes it after L2, so no reader can refill L2 from it
    with data the pipeline has already replaced.
    """

    model_config = SettingsConfigDict(
        env_prefix="FRESHKEY_REDIS_L3_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    url: str | None = Field(None, description="Unset: no L3. " + _URL.format(prefix="FRESHKEY_REDIS_L3_"))
    password: SecretStr | None = None
    entry_ttl_s: int | None = Field(7 * 86_400, ge=1, description="TTL of live L3 entries.")
    flush: Literal["scan", "flushdb"] = Field(
        "scan",
        description="How a fenced L3 is emptied before it is trusted again: scan (UNLINK every key under "
        "the prefix) or flushdb (FLUSHDB: only when its database holds nothing but freshkey's entries).",
    )
    ssl_ca: Path | None = Field(None, description="With rediss://: CA certificate (PEM) of the L3 server.")
    ssl_cert: Path | None = Field(None, description="With rediss://: client certificate (PEM).")
    ssl_key: Path | None = Field(None, description="Private key (PEM) of FRESHKEY_REDIS_L3_SSL_CERT.")
    ssl_check_hostname: bool = Field(
        True, description="With rediss://: check that the certificate names the URL's host."
    )

    @model_validator(mode="after")
    def _security(self) -> L3Settings:
        _check_security("FRESHKEY_REDIS_L3_", self.url, self.ssl_ca, self.ssl_cert, self.ssl_key)
        return self

"""Redis security settings in redis-py's terms: the one place that maps them.

An ACL user is part of the URL (``redis://user@host:6379/0``: redis-py reads it from there), its password
comes from ``FRESHKEY_REDIS_PASSWORD`` (``FRESHKEY_REDIS_L3_PASSWORD``), and ``rediss://`` means TLS with
the ``SSL_*`` files: the server's certificate is always verified (against ``SSL_CA``, else the system's
CAs) and its name checked unless ``SSL_CHECK_HOSTNAME=false``. Applications build their clients the same
way (README, "Security")::

    settings = RedisSettings()
    client = redis.asyncio.Redis.from_url(settings.url, **client_kwargs(settings))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cache_writer.settings import L3Settings, RedisSettings


def tls_kwargs(
    url: str, *, ca: Path | None, cert: Path | None, key: Path | None, check_hostname: bool
) -> dict[str, Any]:
    """redis-py's TLS keyword arguments for ``url``: none unless it is ``rediss://``."""
    if urlsplit(url).scheme != "rediss":
        return {}
    options: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": check_hostname}
    if ca is not None:
        options["ssl_ca_certs"] = str(ca)
    if cert is not None and key is not None:
        options["ssl_certfile"] = str(cert)
        options["ssl_keyfile"] = str(key)
    return options


def client_kwargs(settings: RedisSettings) -> dict[str, Any]:
    """Keyword arguments of ``from_url(settings.url, ...)`` for L2: the password and TLS."""
    return _kwargs(settings.url, settings)


def l3_client_kwargs(settings: L3Settings) -> dict[str, Any]:
    """Keyword arguments of ``from_url(settings.url, ...)`` for L3: the password and TLS."""
    if settings.url is None:
        raise ValueError("no L3 configured (FRESHKEY_REDIS_L3_URL)")
    return _kwargs(settings.url, settings)


def _kwargs(url: str, settings: RedisSettings | L3Settings) -> dict[str, Any]:
    """The password and TLS of either tier (their settings have the same names)."""
    return {
        "password": settings.password.get_secret_value() if settings.password else None,
        **tls_kwargs(
            url,
            ca=settings.ssl_ca,
            cert=settings.ssl_cert,
            key=settings.ssl_key,
            check_hostname=settings.ssl_check_hostname,
        ),
    }

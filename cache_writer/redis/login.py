"""One Redis login checked before a process starts: a refused login (wrong password, unknown or disabled
ACL user) or a certificate that does not verify is a setting to change, not an outage to wait out.

The worker retries every Redis error (:mod:`pipeline.outages`), which is right for a server that is away
and wrong for a password that will never work: it would wait forever, logging
``AuthenticationError`` without saying which setting is wrong. :func:`check_login` tells the two apart
with one ``PING``: it raises :class:`RedisLoginError` naming the setting, and returns quietly when the
server is merely out of reach (the worker then waits for it as usual). Messages carry the host, port and
user, never a password.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from cache_writer.exceptions import CacheWriterError
from cache_writer.redis.security import client_kwargs, l3_client_kwargs
from cache_writer.settings import L3Settings, RedisSettings
from schemas.errors import Misconfigured

_LOGIN_REFUSED = ("WRONGPASS", "NOAUTH", "invalid username-password pair", "invalid password")


class RedisLoginError(CacheWriterError, Misconfigured):
    """Redis refused the login, or its certificate did not verify; the message names the setting."""


def check_login(
    url: str,
    kwargs: dict[str, Any],
    *,
    prefix: str,
    ca: Path | None,
    timeout_s: float = 5.0,
) -> None:
    """One ``PING`` with the client settings a tier uses. :class:`RedisLoginError` for a refused login or
    a certificate that does not verify; nothing for success or a server that does not answer."""
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or 6379}"
    client = redis.Redis.from_url(
        url, **kwargs, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False
    )
    try:
        client.ping()
    except (AuthenticationError, ResponseError) as exc:
        if isinstance(exc, AuthenticationError) or str(exc).startswith(_LOGIN_REFUSED):
            raise RedisLoginError(_refused(where, parts.username, str(exc), prefix)) from None
        return  # LOADING, BUSY and the like: the server answers, the tiers wait for it
    except RedisConnectionError as exc:
        text = str(exc)
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text.lower():
            raise RedisLoginError(_unverified(where, text, prefix, ca)) from None
        return  # away: an outage, which the worker waits out
    except (RedisError, OSError):
        return  # a timeout, a reset: an outage too
    finally:
        client.close()


def check_tiers(settings: RedisSettings, l3: L3Settings | None = None) -> None:
    """:func:`check_login` for L2 (``FRESHKEY_REDIS_*``) and, when configured, L3
    (``FRESHKEY_REDIS_L3_*``)."""
    timeout_s = settings.socket_timeout_s
    check_login(
        settings.url,
        client_kwargs(settings),
        prefix="FRESHKEY_REDIS_",
        ca=settings.ssl_ca,
        timeout_s=timeout_s,
    )
    if l3 is not None and l3.url:
        check_login(
            l3.url, l3_client_kwargs(l3), prefix="FRESHKEY_REDIS_L3_", ca=l3.ssl_ca, timeout_s=timeout_s
        )


def _refused(where: str, user: str | None, reason: str, prefix: str) -> str:
    who = f"the ACL user {user!r}" if user else "the default user (no user in the URL)"
    return (
        f"Redis at {where} refused the login of {who}: {reason.rstrip('.')}. Check {prefix}PASSWORD and "
        f"the user in {prefix}URL (redis://user@host:port/db)"
    )


def _unverified(where: str, reason: str, prefix: str, ca: Path | None) -> str:
    if "mismatch" in reason.lower() or "not valid for" in reason.lower():
        return (
            f"the Redis server's certificate at {where} is not for the name freshkey connects to "
            f"({reason}): connect by a name the certificate carries ({prefix}URL), or set "
            f"{prefix}SSL_CHECK_HOSTNAME=false (the CA is still checked)"
        )
    trusted = f"{prefix}SSL_CA={ca}" if ca is not None else f"the system's CAs ({prefix}SSL_CA unset)"
    return (
        f"the Redis server's certificate at {where} does not verify against {trusted} ({reason}): set "
        f"{prefix}SSL_CA to the CA certificate (PEM) that signed the server's certificate"
    )

"""Redis security settings (ACL user in the URL, password apart, rediss:// with SSL_* files) and the
redis-py clients freshkey builds from them (no server: the clients connect lazily)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError
from redis.asyncio.connection import SSLConnection

from cache_writer.redis.security import client_kwargs, l3_client_kwargs, tls_kwargs
from cache_writer.redis.tier import RedisTier, connect
from cache_writer.settings import L3Settings, RedisSettings

SECRET = "redis-pa55word-never-shown"


def _pem(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    return path


def test_plain_url_maps_to_a_password_only() -> None:
    settings = RedisSettings(url="redis://freshkey@cache:6379/0", password=SECRET)
    assert client_kwargs(settings) == {"password": SECRET}
    assert tls_kwargs(settings.url, ca=None, cert=None, key=None, check_hostname=True) == {}


def test_rediss_maps_to_verified_tls(tmp_path: Path) -> None:
    ca, cert, key = _pem(tmp_path, "ca.pem"), _pem(tmp_path, "c.pem"), _pem(tmp_path, "c.key")
    settings = RedisSettings(
        url="rediss://freshkey@cache:6380/0", password=SECRET, ssl_ca=ca, ssl_cert=cert, ssl_key=key
    )
    assert client_kwargs(settings) == {
        "password": SECRET,
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_ca_certs": str(ca),
        "ssl_certfile": str(cert),
        "ssl_keyfile": str(key),
    }
    no_name = RedisSettings(url="rediss://cache:6380/0", ssl_check_hostname=False)
    assert client_kwargs(no_name)["ssl_check_hostname"] is False
    assert client_kwargs(no_name)["ssl_cert_reqs"] == "required"  # the CA is still checked


def test_the_clients_carry_user_password_and_tls(tmp_path: Path) -> None:
    ca = _pem(tmp_path, "ca.pem")
    settings = RedisSettings(url="rediss://freshkey@cache:6380/0", password=SECRET, ssl_ca=ca)
    client = connect(settings)
    kwargs = client.connection_pool.connection_kwargs  # type: ignore[union-attr]
    assert client.connection_pool.connection_class is SSLConnection  # type: ignore[union-attr]
    assert kwargs["username"] == "freshkey"
    assert kwargs["password"] == SECRET
    assert kwargs["ssl_ca_certs"] == str(ca)
    assert kwargs["ssl_check_hostname"] is True
    asyncio.run(client.aclose())

    l3 = L3Settings(url="rediss://l3user@cache-l3:6380/0", password="other", ssl_ca=ca)
    assert l3_client_kwargs(l3)["ssl_ca_certs"] == str(ca)
    tier = RedisTier.outer_from_settings(settings, l3)
    assert tier is not None
    l3_kwargs = tier.client.connection_pool.connection_kwargs  # type: ignore[union-attr]
    assert (l3_kwargs["username"], l3_kwargs["password"]) == ("l3user", "other")
    assert tier.client.connection_pool.connection_class is SSLConnection  # type: ignore[union-attr]
    asyncio.run(tier.close())


def test_a_cluster_client_takes_tls_too(tmp_path: Path) -> None:
    ca = _pem(tmp_path, "ca.pem")
    settings = RedisSettings(url="rediss://freshkey@node-1:7000/0", cluster=True, password=SECRET, ssl_ca=ca)
    client = connect(settings)
    kwargs = client.connection_kwargs  # type: ignore[union-attr]
    assert kwargs["connection_class"] is SSLConnection
    assert kwargs["username"] == "freshkey"
    assert kwargs["ssl_ca_certs"] == str(ca)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"url": f"redis://freshkey:{SECRET}@cache:6379/0"}, "move it to FRESHKEY_REDIS_PASSWORD"),
        ({"url": "redis://cache:6379/0", "ssl_ca": "/etc/hostname"}, "use rediss:// for TLS"),
        ({"url": "rediss://cache:6379/0", "ssl_cert": "/etc/hostname"}, "set both or neither"),
        (
            {"url": "rediss://cache:6379/0", "ssl_ca": "/nonexistent.pem"},
            "FRESHKEY_REDIS_SSL_CA=/nonexistent",
        ),
    ],
)
def test_inconsistent_settings_say_what_to_change(values: dict[str, str], says: str) -> None:
    with pytest.raises(ValidationError) as raised:
        RedisSettings(**values)  # type: ignore[arg-type]
    assert says in str(raised.value)
    assert SECRET not in str(raised.value)


def test_l3_names_its_own_variables() -> None:
    with pytest.raises(ValidationError, match="FRESHKEY_REDIS_L3_PASSWORD"):
        L3Settings(url=f"redis://u:{SECRET}@l3:6379/0")
    with pytest.raises(ValueError, match="FRESHKEY_REDIS_L3_URL"):
        l3_client_kwargs(L3Settings())


def test_the_password_is_never_printed() -> None:
    settings = RedisSettings(url="redis://freshkey@cache:6379/0", password=SECRET)
    assert SECRET not in repr(settings) and SECRET not in str(settings)

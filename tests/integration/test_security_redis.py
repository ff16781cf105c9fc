"""Redis with an ACL user over TLS, as the worker's tiers and the applications' clients reach it.

The server: ``redis-server --port 0 --tls-port P --tls-cert-file --tls-key-file --tls-ca-cert-file``
(TLS only) with ``--user default off --user freshkey on >PASSWORD ~* &* +@all`` (every connection must
log in as ``freshkey``), certificates made here. freshkey's settings: ``FRESHKEY_REDIS_URL=
rediss://freshkey@127.0.0.1:P/0``, ``FRESHKEY_REDIS_PASSWORD``, ``FRESHKEY_REDIS_SSL_CA``. Each negative
(a wrong password, no user, another CA, another host's certificate, plain TCP) fails, with the reason.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from cache_writer.client import CacheClient
from cache_writer.exceptions import TierUnavailableError
from cache_writer.redis.login import RedisLoginError, check_tiers
from cache_writer.redis.security import client_kwargs
from cache_writer.redis.tier import RedisTier
from cache_writer.settings import L3Settings, RedisSettings
from cache_writer.tier import CacheAction, Outcome
from pipeline.embedded import LocalRedis, free_port
from tests.support.certs import CertificateAuthority

pytestmark = pytest.mark.integration

PASSWORD = "redis-acl-pa55word-7f3e"


class _Server:
    def __init__(self, redis: LocalRedis, ca: CertificateAuthority, other_ca: CertificateAuthority) -> None:
        self.redis, self.ca, self.other_ca = redis, ca, other_ca

    def settings(self, **overrides: Any) -> RedisSettings:
        values: dict[str, Any] = {
            "url": self.redis.url_for("freshkey"),
            "password": PASSWORD,
            "ssl_ca": self.ca.cert_path,
            "key_prefix": "sec",
            "socket_timeout_s": 2.0,
            **overrides,
        }
        return RedisSettings(**values)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    certs = tmp_path_factory.mktemp("redis-certs")
    ca = CertificateAuthority.create(certs / "ca")
    other = CertificateAuthority.create(certs / "other", "another CA")
    redis = LocalRedis(tls=ca.issue("redis"), users={"freshkey": PASSWORD})
    redis.start()
    try:
        yield _Server(redis, ca, other)
    finally:
        redis.stop()


def _write_and_read(settings: RedisSettings) -> Outcome:
    async def run() -> Outcome:
        tier = RedisTier.from_settings(settings)
        try:
            await tier.load_scripts()
            action = CacheAction(kind="write", key="sec:{ns}:1", version=7, value=b"v7", commit_ts_us=1)
            [result] = await tier.apply([action])
            entries = await tier.read_entries(["sec:{ns}:1"])
            entry = entries["sec:{ns}:1"]
            assert entry is not None and entry.version == 7
            return result.outcome
        finally:
            await tier.close()

    return asyncio.run(run())


def _refused(settings: RedisSettings) -> str:
    with pytest.raises(TierUnavailableError) as raised:
        _write_and_read(settings)
    cause = raised.value.__cause__
    return f"{raised.value} {type(cause).__name__}: {cause}"


def test_the_tier_writes_over_tls_as_the_acl_user(server: _Server) -> None:
    assert _write_and_read(server.settings()) in (Outcome.APPLIED, Outcome.NOT_NEWER)

    async def whoami() -> tuple[bytes | str, str]:
        client = aioredis.Redis.from_url(server.settings().url, **client_kwargs(server.settings()))
        try:
            who = await client.acl_whoami()
            info = await client.info("server")
            return who, str(info.get("redis_version"))
        finally:
            await client.aclose()

    who, _ = asyncio.run(whoami())
    assert who in (b"freshkey", "freshkey")


def test_a_wrong_password_is_refused(server: _Server) -> None:
    reason = _refused(server.settings(password="not-the-password"))
    assert "invalid username-password pair" in reason
    assert "not-the-password" not in reason and PASSWORD not in reason


def test_without_the_user_the_default_user_is_off(server: _Server) -> None:
    reason = _refused(server.settings(url=server.redis.url))
    assert "AuthenticationError" in reason or "WRONGPASS" in reason or "NOAUTH" in reason


def test_another_ca_is_refused(server: _Server) -> None:
    reason = _refused(server.settings(ssl_ca=server.other_ca.cert_path))
    assert "CERTIFICATE_VERIFY_FAILED" in reason


def test_the_system_cas_do_not_trust_a_private_ca(server: _Server) -> None:
    reason = _refused(server.settings(ssl_ca=None))
    assert "CERTIFICATE_VERIFY_FAILED" in reason


def test_plain_tcp_to_a_tls_port_fails(server: _Server) -> None:
    plain = server.redis.url_for("freshkey").replace("rediss://", "redis://")
    _refused(server.settings(url=plain, ssl_ca=None))


def test_another_hosts_certificate(server: _Server, tmp_path: Path) -> None:
    """A server whose certificate names another host: refused by default, accepted with
    FRESHKEY_REDIS_SSL_CHECK_HOSTNAME=false (the CA is still checked)."""
    elsewhere = LocalRedis(tls=server.ca.issue("redis-elsewhere", ("cache.example.internal",)))
    elsewhere.start()
    try:
        settings = server.settings(url=elsewhere.url, password=None)
        assert "CERTIFICATE_VERIFY_FAILED" in _refused(settings)
        assert "127.0.0.1" in _refused(settings)  # the name it was asked for
        assert _write_and_read(server.settings(url=elsewhere.url, password=None, ssl_check_hostname=False))
    finally:
        elsewhere.stop()


def test_l3_and_an_application_client_over_tls(server: _Server) -> None:
    l3 = L3Settings(url=server.redis.url_for("freshkey"), password=PASSWORD, ssl_ca=server.ca.cert_path)

    async def run() -> None:
        tier = RedisTier.outer_from_settings(server.settings(), l3)
        assert tier is not None
        try:
            await tier.ping()
        finally:
            await tier.close()
        settings = server.settings()
        client = aioredis.Redis.from_url(settings.url, **client_kwargs(settings))
        try:
            cache = CacheClient(client, prefix=settings.key_prefix)
            hit = await cache.get("ns", [1])
            assert hit is not None  # a hit or a miss with a lease: the client spoke to the server
        finally:
            await client.aclose()

    asyncio.run(run())


def _login_error(settings: RedisSettings, l3: L3Settings | None = None) -> str:
    with pytest.raises(RedisLoginError) as raised:
        check_tiers(settings, l3)
    return str(raised.value)


def test_the_login_check_names_the_setting(server: _Server) -> None:
    """What the worker checks before it starts (cache_writer.redis.login): the right settings pass; a
    wrong password, no user, another CA each raise a message naming the setting, without the password; a
    server that is away is an outage (no error: the worker waits for it)."""
    check_tiers(server.settings())  # the control
    wrong = _login_error(server.settings(password="not-the-password"))
    assert "refused the login of the ACL user 'freshkey'" in wrong and "FRESHKEY_REDIS_PASSWORD" in wrong
    assert "not-the-password" not in wrong and PASSWORD not in wrong
    nobody = _login_error(server.settings(url=server.redis.url))
    assert "the default user" in nobody and "FRESHKEY_REDIS_URL" in nobody
    other = _login_error(server.settings(ssl_ca=server.other_ca.cert_path))
    assert f"FRESHKEY_REDIS_SSL_CA={server.other_ca.cert_path}" in other
    l3 = L3Settings(
        url=server.redis.url_for("freshkey"), password="wrong-l3-password", ssl_ca=server.ca.cert_path
    )
    assert "FRESHKEY_REDIS_L3_PASSWORD" in _login_error(server.settings(), l3)
    away = server.settings(url=f"rediss://freshkey@127.0.0.1:{free_port()}/0", socket_timeout_s=1.0)
    check_tiers(away)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts TCP, never answers the handshake
        port = silent.getsockname()[1]
        check_tiers(server.settings(url=f"rediss://freshkey@127.0.0.1:{port}/0", socket_timeout_s=1.0))


def test_the_worker_stops_on_a_wrong_password(server: _Server, tmp_path: Path) -> None:
    """``freshkey worker`` with a wrong FRESHKEY_REDIS_PASSWORD exits 2 at once with the message (before it
    reaches Kafka: the bootstrap here answers nothing), instead of retrying forever."""
    bindings = tmp_path / "bindings.yaml"
    bindings.write_text("bindings:\n  - table: db.t\n    namespace: ns\n    value_columns: [v]\n")
    env = {
        **os.environ,
        "FRESHKEY_REDIS_URL": server.redis.url_for("freshkey"),
        "FRESHKEY_REDIS_PASSWORD": "not-the-password",
        "FRESHKEY_REDIS_SSL_CA": str(server.ca.cert_path),
        "FRESHKEY_BINDINGS": str(bindings),
        "FRESHKEY_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "FRESHKEY_WORKER_DATA_DIR": str(tmp_path / "worker"),
        "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(free_port()),  # not the default 9464
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "worker"], env=env, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "FRESHKEY_REDIS_PASSWORD" in output and "refused the login" in output, output
    assert "not-the-password" not in output

"""MySQL TLS settings (FRESHKEY_MYSQL_SSL_*): the modes, their pymysql arguments, and certificate failures
that name the setting to change (a real TLS handshake against a local TLS listener, no database)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pymysql.connections
import pytest
from pydantic import ValidationError

from connectors.mysql import Connection
from connectors.settings import MySQLSettings
from connectors.tls import MySQLClientContext, TlsVerificationError
from pipeline.embedded.tls import TlsFiles
from tests.support.certs import CertificateAuthority


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.create(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.create(tmp_path_factory.mktemp("other"), "another CA")


def test_without_tls_settings_pymysql_keeps_its_default() -> None:
    settings = MySQLSettings()
    assert settings.effective_ssl_mode == "preferred"
    assert "ssl" not in settings.connection_kwargs()
    assert "ssl_disabled" not in settings.connection_kwargs()


def test_a_ca_means_verify_identity(ca: CertificateAuthority) -> None:
    settings = MySQLSettings(ssl_ca=ca.cert_path)
    assert settings.effective_ssl_mode == "verify-identity"
    context = settings.connection_kwargs()["ssl"]
    assert isinstance(context, MySQLClientContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True


@pytest.mark.parametrize(
    ("mode", "verify", "hostname"),
    [("verify-ca", ssl.CERT_REQUIRED, False), ("required", ssl.CERT_NONE, False)],
)
def test_weaker_modes(ca: CertificateAuthority, mode: str, verify: ssl.VerifyMode, hostname: bool) -> None:
    context = MySQLSettings(ssl_mode=mode, ssl_ca=ca.cert_path).connection_kwargs()["ssl"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == verify
    assert context.check_hostname is hostname


def test_disabled_and_spellings() -> None:
    assert MySQLSettings(ssl_mode="DISABLED").connection_kwargs()["ssl_disabled"] is True
    assert MySQLSettings(ssl_mode="VERIFY_IDENTITY").ssl_mode == "verify-identity"


def test_client_certificate(ca: CertificateAuthority) -> None:
    client = ca.issue("mysql-client", ("freshkey",), client=True)
    context = MySQLSettings(ssl_ca=ca.cert_path, ssl_cert=client.cert, ssl_key=client.key).ssl_kwargs()["ssl"]
    assert isinstance(context, ssl.SSLContext)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"ssl_cert": "/etc/hostname"}, "set both or neither"),
        ({"ssl_mode": "disabled", "ssl_ca": "/etc/hostname"}, "FRESHKEY_MYSQL_SSL_MODE=disabled"),
        ({"ssl_ca": "/nonexistent/ca.pem"}, "FRESHKEY_MYSQL_SSL_CA=/nonexistent/ca.pem"),
        ({"ssl_mode": "sometimes"}, "ssl_mode"),
    ],
)
def test_inconsistent_settings_say_what_to_change(values: dict[str, str], says: str) -> None:
    with pytest.raises(ValidationError) as raised:
        MySQLSettings(**values)  # type: ignore[arg-type]
    assert says in str(raised.value)


@contextmanager
def tls_listener(files: TlsFiles) -> Iterator[int]:
    """A TLS server on 127.0.0.1 that completes handshakes and closes; yields its port."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(files.cert), str(files.key))
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()
        thread.join(5)


def _handshake(settings: MySQLSettings, port: int) -> None:
    context = settings.ssl_kwargs()["ssl"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        context.wrap_socket(sock, server_hostname="127.0.0.1").close()


def test_the_right_ca_and_name_verify(ca: CertificateAuthority) -> None:
    with tls_listener(ca.issue("db")) as port:
        _handshake(MySQLSettings(port=port, ssl_ca=ca.cert_path), port)


def test_a_wrong_ca_names_the_ca_setting(ca: CertificateAuthority, other_ca: CertificateAuthority) -> None:
    with tls_listener(ca.issue("db")) as port, pytest.raises(TlsVerificationError) as raised:
        _handshake(MySQLSettings(port=port, ssl_ca=other_ca.cert_path), port)
    message = str(raised.value)
    assert f"127.0.0.1:{port}" in message
    assert f"FRESHKEY_MYSQL_SSL_CA={other_ca.cert_path}" in message
    assert "set FRESHKEY_MYSQL_SSL_CA to the CA certificate" in message


def test_another_hosts_certificate_names_the_host_and_mode(ca: CertificateAuthority) -> None:
    with tls_listener(ca.issue("db-elsewhere", ("db.example.internal",))) as port:
        with pytest.raises(TlsVerificationError) as raised:
            _handshake(MySQLSettings(port=port, ssl_ca=ca.cert_path), port)
        message = str(raised.value)
        assert "not for the name freshkey connects to" in message
        assert "FRESHKEY_MYSQL_HOST" in message and "FRESHKEY_MYSQL_SSL_MODE=verify-ca" in message
        # verify-ca accepts it: the CA is right, only the name differs.
        _handshake(MySQLSettings(port=port, ssl_ca=ca.cert_path, ssl_mode="verify-ca"), port)


def test_the_preferred_mode_shares_one_context_made_as_pymysql_makes_it() -> None:
    """connectors.mysql: without TLS settings pymysql asks for a context with no options for every
    connection (21-29 ms of CPU each here, the system's CAs loaded to verify nothing); freshkey's connection
    makes it once, the way pymysql does, and shares it. Any other request is pymysql's own."""
    ours = Connection.__new__(Connection)
    made = ours._create_ssl_ctx({})
    assert Connection.__new__(Connection)._create_ssl_ctx({}) is made
    plain = pymysql.connections.Connection.__new__(pymysql.connections.Connection)
    theirs = plain._create_ssl_ctx({})
    assert plain._create_ssl_ctx({}) is not theirs, "pymysql makes one per connection"
    assert (made.verify_mode, made.check_hostname, made.options, made.verify_flags, made.minimum_version) == (
        theirs.verify_mode,
        theirs.check_hostname,
        theirs.options,
        theirs.verify_flags,
        theirs.minimum_version,
    )
    assert made.verify_mode == ssl.CERT_NONE and not made.check_hostname
    verifying = {"verify_mode": True}
    assert ours._create_ssl_ctx(verifying) is not ours._create_ssl_ctx(verifying)
    assert ours._create_ssl_ctx(verifying).verify_mode == ssl.CERT_REQUIRED
    given = ssl.create_default_context()
    assert ours._create_ssl_ctx(given) is given

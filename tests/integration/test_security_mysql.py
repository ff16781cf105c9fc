"""MySQL/MariaDB over TLS: the binlog reader and the direct reads, with ``verify-identity`` by default.

The server: a private MariaDB started with ``--ssl-cert --ssl-key --ssl-ca`` (a certificate made here,
for the name ``localhost`` only) and the ``freshkey`` account ``REQUIRE SSL``. freshkey's settings:
``FRESHKEY_MYSQL_SSL_CA`` (the mode is then ``verify-identity``), ``FRESHKEY_MYSQL_SSL_MODE``. The
negatives: TLS off (the account refuses), another CA, and the certificate's name against
``127.0.0.1``: each fails, naming the setting to change.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from connectors.binlog.source import BinlogSource
from connectors.checkpoint import BinlogPosition
from connectors.database import binlog_position, column_types, read_rows
from connectors.doctor import require_ready
from connectors.exceptions import ConfigurationError
from connectors.mysql import Connection
from connectors.settings import MySQLSettings
from connectors.tls import TlsVerificationError
from pipeline.embedded import LocalMariaDB
from schemas import ChangeEvent
from tests.support.certs import CertificateAuthority

pytestmark = pytest.mark.integration


class _Server:
    def __init__(self, db: LocalMariaDB, ca: CertificateAuthority, other: CertificateAuthority) -> None:
        self.db, self.ca, self.other = db, ca, other
        self.database = f"tls_{uuid.uuid4().hex[:8]}"

    def settings(self, **overrides: Any) -> MySQLSettings:
        values: dict[str, Any] = {
            "host": "localhost",  # the name on the server's certificate
            "port": self.db.port,
            "user": self.db.user,
            "password": self.db.password,
            "ssl_ca": self.ca.cert_path,
            "server_id": 7301,
            **overrides,
        }
        return MySQLSettings(**values)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    certs = tmp_path_factory.mktemp("mysql-certs")
    ca = CertificateAuthority.create(certs / "ca")
    other = CertificateAuthority.create(certs / "other", "another CA")
    db = LocalMariaDB(tls=ca.issue("mariadb", ("localhost",)))
    db.start()
    try:
        found = _Server(db, ca, other)
        admin = db.connect(admin=True)
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {found.database}")
            cur.execute(f"CREATE TABLE {found.database}.t (id INT PRIMARY KEY, v VARCHAR(32))")
            cur.execute(f"INSERT INTO {found.database}.t VALUES (1, 'one')")
        admin.close()
        yield found
    finally:
        db.stop()


def test_direct_reads_run_over_verified_tls(server: _Server) -> None:
    settings = server.settings()
    assert settings.effective_ssl_mode == "verify-identity"
    conn = pymysql.connect(**settings.connection_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW SESSION STATUS LIKE 'Ssl_version'")
            row = cur.fetchone()
    finally:
        conn.close()
    assert row is not None and str(row[1]).startswith("TLSv1.")
    assert read_rows(settings, server.database, "t", ["id"], [[1]]) == [{"id": 1, "v": "one"}]
    assert set(column_types(settings, server.database, "t")) == {"id", "v"}
    assert binlog_position(settings) is not None
    require_ready(settings)  # the connector's checks, over TLS


def test_the_binlog_streams_over_tls(server: _Server) -> None:
    settings = server.settings()
    start = binlog_position(settings)
    assert start is not None
    admin = server.db.connect(admin=True)
    with admin.cursor() as cur:
        cur.execute(f"INSERT INTO {server.database}.t VALUES (2, 'two')")
    admin.close()
    source = BinlogSource(
        settings,
        [(server.database, "t")],
        start=BinlogPosition(start.file, start.pos),
        blocking=False,
    )
    try:
        changes = [item for item in source if isinstance(item, ChangeEvent)]
    finally:
        source.close()
    assert [(c.op, (c.after or {}).get("v")) for c in changes] == [("c", "two")]


def test_the_default_mode_negotiates_tls_with_one_shared_context(server: _Server) -> None:
    """No TLS settings: pymysql's preferred mode (TLS when the server offers it, nothing verified). The
    account is REQUIRE SSL, so every read that works went over TLS; every connection of the process
    shares one SSL context (connectors.mysql)."""
    settings = server.settings(ssl_ca=None)
    assert settings.effective_ssl_mode == "preferred"
    first, second = Connection(**settings.connection_kwargs()), Connection(**settings.connection_kwargs())
    try:
        assert first.ctx is second.ctx
        for conn in (first, second):
            with conn.cursor() as cur:
                cur.execute("SHOW SESSION STATUS LIKE 'Ssl_version'")
                row = cur.fetchone()
            assert row is not None and str(row[1]).startswith("TLSv1.")
    finally:
        first.close()
        second.close()
    assert read_rows(settings, server.database, "t", ["id"], [[1]]) == [{"id": 1, "v": "one"}]
    require_ready(settings)


def test_without_tls_the_account_refuses(server: _Server) -> None:
    with pytest.raises(ConfigurationError) as raised:
        require_ready(server.settings(ssl_mode="disabled", ssl_ca=None))
    assert "Access denied" in str(raised.value)


def test_another_ca_names_the_ca_setting(server: _Server) -> None:
    settings = server.settings(ssl_ca=server.other.cert_path)
    with pytest.raises(TlsVerificationError) as raised:
        read_rows(settings, server.database, "t", ["id"], [[1]])
    assert f"FRESHKEY_MYSQL_SSL_CA={server.other.cert_path}" in str(raised.value)
    with pytest.raises(TlsVerificationError):  # the connector's first step says the same
        require_ready(settings)
    source = BinlogSource(settings, [(server.database, "t")], start=BinlogPosition("binlog.000001", 4))
    with pytest.raises(TlsVerificationError):  # and so does the binlog reader
        list(source)
    source.close()


def test_the_certificate_names_another_host(server: _Server) -> None:
    """The certificate is for ``localhost``: ``127.0.0.1`` fails verify-identity with a message naming
    FRESHKEY_MYSQL_HOST and verify-ca; verify-ca (the CA alone) accepts it."""
    by_address = server.settings(host="127.0.0.1")
    with pytest.raises(TlsVerificationError) as raised:
        read_rows(by_address, server.database, "t", ["id"], [[1]])
    message = str(raised.value)
    assert "127.0.0.1" in message
    assert "FRESHKEY_MYSQL_HOST" in message and "FRESHKEY_MYSQL_SSL_MODE=verify-ca" in message
    rows = read_rows(
        server.settings(host="127.0.0.1", ssl_mode="verify-ca"), server.database, "t", ["id"], [[1]]
    )
    assert rows == [{"id": 1, "v": "one"}]


def test_a_wrong_password_names_the_setting(server: _Server) -> None:
    """Over verified TLS, a wrong password: the connector's first step (the account checks, before the
    binlog reader starts) stops with a configuration error that names FRESHKEY_MYSQL_PASSWORD (not an
    outage to wait out), without the password; the right one passes the same step (the control)."""
    with pytest.raises(ConfigurationError) as raised:
        require_ready(server.settings(password="not-the-password"))
    message = str(raised.value)
    assert "Access denied" in message and "FRESHKEY_MYSQL_PASSWORD" in message
    assert "not-the-password" not in message
    require_ready(server.settings())

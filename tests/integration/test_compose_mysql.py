"""deploy/mysql/init.sql's grants on a real server: what the compose stack's `freshkey` account may do.

The GRANT statements init.sql gives the `freshkey` user are run on the session's MariaDB for an account
and a database of this test (the names replaced, so nothing of the shared server is touched); then
``freshkey doctor``'s own checks judge that account: the signal table of ``freshkey snapshot``
(created, then a row written, changed and deleted in a rolled-back transaction) and the heartbeat
table (the prober's REPLACE). Negative control: the same grants without init.sql's ``GRANT UPDATE``
fail the signal table check with the GRANT to run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pymysql
import pytest
from pydantic import SecretStr

from connectors.doctor import signal_table_check
from connectors.settings import MySQLSettings
from tests.support.compose import REPO_ROOT, sql_statements
from tests.support.services import MySQLService

pytestmark = pytest.mark.integration

INIT_SQL = REPO_ROOT / "deploy" / "mysql" / "init.sql"
HOSTS = ("127.0.0.1", "localhost")


def init_grants() -> list[str]:
    """init.sql's GRANT statements for the freshkey account."""
    grants = [s for s in sql_statements(INIT_SQL.read_text()) if s.upper().startswith("GRANT ")]
    assert grants and all(g.endswith("TO 'freshkey'@'%'") for g in grants), grants
    return grants


class Account:
    """A fresh account with init.sql's grants, ``freshkey.*`` renamed to a database of the test."""

    def __init__(self, mysql: MySQLService, grants: list[str]) -> None:
        tag = uuid.uuid4().hex[:8]
        self.mysql = mysql
        self.user, self.database = f"compose_{tag}", f"freshkey_compose_{tag}"
        with mysql.connect() as conn, conn.cursor() as cur:
            for host in HOSTS:
                cur.execute(f"CREATE USER '{self.user}'@'{host}' IDENTIFIED BY 'pw'")
                for grant in grants:
                    renamed = grant.replace(" ON freshkey.* ", f" ON `{self.database}`.* ")
                    cur.execute(renamed.replace("TO 'freshkey'@'%'", f"TO '{self.user}'@'{host}'"))
        self.settings = MySQLSettings(
            host=mysql.host, port=mysql.port, user=self.user, password=SecretStr("pw")
        )

    def connect(self) -> pymysql.connections.Connection:
        return pymysql.connect(
            host=self.mysql.host, port=self.mysql.port, user=self.user, password="pw", autocommit=True
        )

    def drop(self) -> None:
        with self.mysql.connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{self.database}`")
            for host in HOSTS:
                cur.execute(f"DROP USER IF EXISTS '{self.user}'@'{host}'")


@pytest.fixture
def accounts(mysql_service: MySQLService) -> Iterator[list[Account]]:
    made: list[Account] = []
    yield made
    for account in made:
        account.drop()


def test_init_sql_grants_let_the_stack_snapshot_and_beat(
    mysql_service: MySQLService, accounts: list[Account]
) -> None:
    grants = init_grants()
    account = Account(mysql_service, grants)
    accounts.append(account)
    signal = signal_table_check(account.settings, f"{account.database}.signal")
    assert signal.ok and "created now" in signal.found, signal
    with account.connect() as conn, conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS `{account.database}`.heartbeat "
            "(id INT PRIMARY KEY, beat_at DATETIME(6) NOT NULL)"
        )
        for _ in range(2):
            cur.execute(f"REPLACE INTO `{account.database}`.heartbeat VALUES (1, UTC_TIMESTAMP(6))")
        cur.execute(f"SELECT COUNT(*) FROM `{account.database}`.heartbeat")
        assert cur.fetchone() == (1,)

    without_update = [g for g in grants if g != "GRANT UPDATE ON freshkey.* TO 'freshkey'@'%'"]
    assert len(without_update) == len(grants) - 1, "init.sql's UPDATE grant is not where this test looks"
    short = Account(mysql_service, without_update)
    accounts.append(short)
    refused = signal_table_check(short.settings, f"{short.database}.signal")
    assert not refused.ok, refused
    assert "UPDATE command denied" in refused.found, refused
    print(f"\ninit.sql grants: signal table {signal.found}; without GRANT UPDATE: {refused.found}")

"""``freshkey doctor`` and the connector's refusal on a misconfigured server (real MariaDB/MySQL)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.embedded import free_port
from tests.support.services import MySQLService

pytestmark = pytest.mark.integration


def _env(mysql: MySQLService, user: str, password: str, tmp_path: Path) -> dict[str, str]:
    bindings = tmp_path / "bindings.yaml"
    bindings.write_text("bindings:\n  - table: shop.assets\n    namespace: assets\n")
    return {
        **os.environ,
        "FRESHKEY_MYSQL_HOST": mysql.host,
        "FRESHKEY_MYSQL_PORT": str(mysql.port),
        "FRESHKEY_MYSQL_USER": user,
        "FRESHKEY_MYSQL_PASSWORD": password,
        "FRESHKEY_BINDINGS": str(bindings),
        "FRESHKEY_CONNECTOR_CHECKPOINT_PATH": str(tmp_path / "checkpoint.json"),
        "FRESHKEY_KAFKA_BOOTSTRAP": "127.0.0.1:1",
        "FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": str(free_port()),  # not the default 9465
        "COLUMNS": "200",
    }


def _freshkey(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def weak_user(mysql_service: MySQLService) -> Iterator[tuple[str, str]]:
    """An account with SELECT only: no replication privileges."""
    user, password = f"weak{uuid.uuid4().hex[:8]}", "weak-pass"
    with mysql_service.connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", (password,))
        cur.execute(f"GRANT SELECT ON *.* TO '{user}'@'%'")
    yield user, password
    with mysql_service.connect() as conn, conn.cursor() as cur:
        cur.execute(f"DROP USER '{user}'@'%'")


def test_doctor_passes_on_a_ready_server(mysql_service: MySQLService, tmp_path: Path) -> None:
    result = _freshkey(_env(mysql_service, mysql_service.user, mysql_service.password, tmp_path), "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ready" in result.stdout


def test_doctor_and_connector_name_the_missing_privilege(
    mysql_service: MySQLService, weak_user: tuple[str, str], tmp_path: Path
) -> None:
    env = _env(mysql_service, *weak_user, tmp_path)
    doctor = _freshkey(env, "doctor")
    assert doctor.returncode == 1
    assert "REPLICATION SLAVE" in doctor.stdout and "GRANT SELECT, REPLICATION SLAVE" in doctor.stdout
    connector = _freshkey(env, "connector")
    assert connector.returncode == 2
    assert "privilege REPLICATION SLAVE" in connector.stderr and "Fix: GRANT" in connector.stderr
    assert not (tmp_path / "checkpoint.json").exists(), "a refused connector must not write a checkpoint"


def test_doctor_names_the_binlog_format_to_set(mysql_service: MySQLService, tmp_path: Path) -> None:
    if os.environ.get("FRESHKEY_TEST_MYSQL_DSN"):
        pytest.skip("changes a global variable: only on the private test server")
    with mysql_service.connect() as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL binlog_format = 'STATEMENT'")
        try:
            result = _freshkey(
                _env(mysql_service, mysql_service.user, mysql_service.password, tmp_path), "doctor"
            )
        finally:
            cur.execute("SET GLOBAL binlog_format = 'ROW'")
    assert result.returncode == 1
    assert "binlog_format" in result.stdout and "STATEMENT" in result.stdout
    flat = "".join(result.stdout.split()).replace("│", "")
    assert "SETGLOBALbinlog_format='ROW'" in flat, "the fix names the statement to run"
    assert "under[mysqld]in" in flat, "square brackets survive rich's markup"


def test_wrong_password_is_a_clear_error(mysql_service: MySQLService, tmp_path: Path) -> None:
    result = _freshkey(_env(mysql_service, mysql_service.user, "wrong-password", tmp_path), "doctor")
    assert result.returncode == 2
    assert "FRESHKEY_MYSQL_PASSWORD" in result.stdout + result.stderr
    assert "wrong-password" not in result.stdout + result.stderr, "secrets are never printed"


def test_doctor_reports_a_checkpoint_whose_binlog_is_gone(
    mysql_service: MySQLService, tmp_path: Path
) -> None:
    env = _env(mysql_service, mysql_service.user, mysql_service.password, tmp_path)
    with mysql_service.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        oldest = str(cur.fetchall()[0][0])
    stem, _, number = oldest.rpartition(".")
    gone = f"{stem}.{'0' * len(number)}"  # numbered before the oldest file: purged (or never there)
    (tmp_path / "checkpoint.json").write_text(f'{{"file": "{gone}", "pos": 4, "gtid": null}}')
    result = _freshkey(env, "doctor")
    assert result.returncode == 1, result.stdout + result.stderr
    flat = " ".join(result.stdout.replace("│", " ").split())
    assert "✗ checkpoint binlog on the server" in flat
    assert f"{gone} has been purged" in flat and oldest in flat
    assert "--accept-gap" in flat


def test_doctor_passes_a_checkpoint_on_the_server(mysql_service: MySQLService, tmp_path: Path) -> None:
    env = _env(mysql_service, mysql_service.user, mysql_service.password, tmp_path)
    with mysql_service.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        newest = str(cur.fetchall()[-1][0])
    (tmp_path / "checkpoint.json").write_text(f'{{"file": "{newest}", "pos": 4, "gtid": null}}')
    result = _freshkey(env, "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "✓ checkpoint binlog on the server" in " ".join(result.stdout.replace("│", " ").split())

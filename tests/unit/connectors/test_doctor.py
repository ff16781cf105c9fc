"""connectors.doctor: privilege and compression checks from grant strings and variables (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.doctor import (
    CHECKPOINT_CHECK,
    checkpoint_check,
    checkpoint_check_from,
    compression_check,
    partial_json_check,
    privilege_checks,
)
from connectors.settings import MySQLSettings

USER = "freshkey"
GRANT_FIX = "GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'freshkey'@'%'"
NAMES = ["privilege REPLICATION SLAVE", "privilege REPLICATION CLIENT", "privilege SELECT"]


def checks(*grant_rows: str) -> dict[str, bool]:
    # _grants() joins the rows of SHOW GRANTS with spaces and upper-cases them.
    result = privilege_checks(list(grant_rows), USER)
    assert [c.name for c in result] == NAMES
    for check in result:
        assert check.fix == GRANT_FIX
    return {c.name: c.ok for c in result}


@pytest.mark.parametrize(
    "rows",
    [
        # MySQL 8
        ("GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `freshkey`@`%`",),
        # MariaDB 10.11 shows REPLICATION CLIENT as BINLOG MONITOR
        (
            "GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `freshkey`@`%` "
            "IDENTIFIED BY PASSWORD '*2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19'",
        ),
        ("GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION",),
        ("GRANT SELECT, REPLICATION SLAVE, SUPER ON *.* TO `freshkey`@`%`",),
        ("grant select, replication slave, replication client on *.* to `freshkey`@`%`",),
        (
            "GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `freshkey`@`%`",
            "GRANT INSERT ON `shop`.* TO `freshkey`@`%`",
        ),
    ],
)
def test_sufficient_grants_pass(rows: tuple[str, ...]) -> None:
    assert checks(*rows) == dict.fromkeys(NAMES, True)


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (("GRANT SELECT ON `shop`.* TO `freshkey`@`%`",), [False, False, False]),
        (
            ("GRANT USAGE ON *.* TO `freshkey`@`%`", "GRANT SELECT ON `shop`.* TO `freshkey`@`%`"),
            [False, False, False],
        ),
        (("GRANT ALL PRIVILEGES ON `shop`.* TO `freshkey`@`%`",), [False, False, False]),
        (("GRANT SELECT ON *.* TO `freshkey`@`%`",), [False, False, True]),
        (("GRANT REPLICATION SLAVE ON *.* TO `freshkey`@`%`",), [True, False, False]),
        (("GRANT SELECT, REPLICATION CLIENT ON *.* TO `freshkey`@`%`",), [False, True, True]),
        (("GRANT SELECT, BINLOG MONITOR ON *.* TO `freshkey`@`%`",), [False, True, True]),
    ],
)
def test_missing_grants_fail_with_the_grant_statement_as_fix(
    rows: tuple[str, ...], expected: list[bool]
) -> None:
    assert checks(*rows) == dict(zip(NAMES, expected, strict=True))


def test_found_text_shows_global_privileges() -> None:
    result = privilege_checks(["GRANT SELECT ON `SHOP`.* TO `FRESHKEY`@`%`"], USER)
    assert {c.found for c in result} == {"(no global privileges)"}
    result = privilege_checks(["GRANT SELECT, REPLICATION SLAVE ON *.* TO `FRESHKEY`@`%`"], USER)
    assert {c.found for c in result} == {"REPLICATION SLAVE, SELECT"}
    assert {c.want for c in result} == {"granted", "granted on *.*"}


def test_fix_names_the_user() -> None:
    result = privilege_checks("", "app_reader")
    assert all(not c.ok for c in result)
    assert all(
        c.fix == "GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'app_reader'@'%'"
        for c in result
    )


def test_db_level_grant_before_a_global_row_does_not_count_as_global() -> None:
    # e.g. MariaDB SHOW GRANTS FOR CURRENT_USER() lists the user's rows, then its default role's rows.
    result = checks(
        "GRANT USAGE ON *.* TO `freshkey`@`%`",
        "GRANT SELECT ON `shop`.* TO `freshkey`@`%`",
        "GRANT `replicator` TO `freshkey`@`%`",
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `replicator`",
    )
    assert result["privilege SELECT"] is False


def test_replication_slave_admin_is_not_replication_slave() -> None:
    result = checks("GRANT SELECT, BINLOG MONITOR, REPLICATION SLAVE ADMIN ON *.* TO `freshkey`@`%`")
    assert result["privilege REPLICATION SLAVE"] is False


@pytest.mark.parametrize(
    ("flavor", "variables", "ok", "name"),
    [
        ("mariadb", {"log_bin_compress": "OFF"}, True, "log_bin_compress"),
        ("mariadb", {"log_bin_compress": "off"}, True, "log_bin_compress"),
        ("mariadb", {"log_bin_compress": "0"}, True, "log_bin_compress"),
        ("mariadb", {}, True, "log_bin_compress"),
        ("mariadb", {"log_bin_compress": "ON"}, False, "log_bin_compress"),
        ("mariadb", {"binlog_transaction_compression": "ON"}, True, "log_bin_compress"),
        ("mysql", {"binlog_transaction_compression": "OFF"}, True, "binlog_transaction_compression"),
        ("mysql", {}, True, "binlog_transaction_compression"),
        ("mysql", {"binlog_transaction_compression": "ON"}, False, "binlog_transaction_compression"),
        ("mysql", {"binlog_transaction_compression": "1"}, False, "binlog_transaction_compression"),
        ("mysql", {"log_bin_compress": "ON"}, True, "binlog_transaction_compression"),
    ],
)
def test_compression_check(flavor: str, variables: dict[str, str], ok: bool, name: str) -> None:
    check = compression_check(flavor, variables)
    assert check.name == "binlog compression"
    assert check.ok is ok
    assert check.found == f"{name}={variables.get(name, 'OFF')}"
    assert check.want == f"{name}=OFF"
    assert check.fix.startswith(f"SET GLOBAL {name}=OFF and set {name}=OFF under [mysqld]")
    assert "restart" in check.fix


@pytest.mark.parametrize(
    ("variables", "ok"),
    [
        ({}, True),  # MariaDB: no such variable
        ({"binlog_row_value_options": ""}, True),
        ({"binlog_row_value_options": "PARTIAL_JSON"}, False),
        ({"binlog_row_value_options": "partial_json"}, False),
    ],
)
def test_partial_json_check(variables: dict[str, str], ok: bool) -> None:
    check = partial_json_check(variables)
    assert check.name == "binlog_row_value_options" and check.ok is ok
    assert check.fix.startswith("SET GLOBAL binlog_row_value_options='' and set binlog_row_value_options=''")


# --- the checkpoint's binlog file (freshkey doctor) -------------------------------------------------------

LOGS = [("binlog.000005", 1200), ("binlog.000006", 380)]


def test_checkpoint_file_on_the_server_passes() -> None:
    check = checkpoint_check_from("binlog.000006", 200, LOGS)
    assert check.ok and check.name == CHECKPOINT_CHECK
    assert check.found == "binlog.000006:200"


def test_purged_checkpoint_file_fails_naming_both_files_and_the_way_on() -> None:
    check = checkpoint_check_from("binlog.000002", 900, LOGS)
    assert not check.ok
    assert "binlog.000002" in check.found and "binlog.000005" in check.found
    assert check.want == "binlog.000002 on the server"
    assert "freshkey connector --accept-gap" in check.fix and "freshkey snapshot" in check.fix


def test_no_checkpoint_yet_passes(tmp_path: Path) -> None:
    check = checkpoint_check(MySQLSettings(port=1), tmp_path / "none.json")  # never connects
    assert check.ok and "no checkpoint" in check.found


def test_unreadable_checkpoint_fails_without_connecting(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text("{half")
    check = checkpoint_check(MySQLSettings(port=1), path)
    assert not check.ok and str(path) in check.found and "--accept-gap" in check.fix

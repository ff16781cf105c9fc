"""Checks that a MySQL/MariaDB server can feed freshkey, each with the exact change that fixes it.

``freshkey doctor`` prints them; the connector runs the same checks and refuses to start on a failure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pymysql

from connectors.binlog.positions import ACCEPT_GAP_HINT, position_problem
from connectors.checkpoint import BinlogPosition, CheckpointError, CheckpointStore
from connectors.exceptions import ConfigurationError, DatabaseUnavailableError, retry_cause
from connectors.mysql import Connection
from connectors.settings import MySQLSettings
from connectors.snapshot.signals import SignalTable


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    found: str
    want: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    version: str
    flavor: str  # "mariadb" or "mysql"
    server_id: int


def connect(settings: MySQLSettings) -> pymysql.connections.Connection:
    """A connection for the checks.

    A server that is away (refused, unreachable, restarting) raises :class:`DatabaseUnavailableError`,
    which a connector waits out; a refusal that waiting does not fix (access denied) raises
    :class:`ConfigurationError`.
    """
    try:
        return Connection(**settings.connection_kwargs(), autocommit=True)
    except pymysql.err.OperationalError as exc:
        message = (
            f"cannot connect to MySQL at {settings.host}:{settings.port} as {settings.user!r}: "
            f"{exc.args[-1]}. Check FRESHKEY_MYSQL_HOST, FRESHKEY_MYSQL_PORT, FRESHKEY_MYSQL_USER and "
            "FRESHKEY_MYSQL_PASSWORD."
        )
        if retry_cause(exc) == "database":
            raise DatabaseUnavailableError(message) from None
        raise ConfigurationError(message) from None


def _variables(cur: pymysql.cursors.Cursor, names: list[str]) -> dict[str, str]:
    cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ",".join(["%s"] * len(names)) + ")", names)
    return {str(name).lower(): str(value) for name, value in cur.fetchall()}


def _restart_fix(setting: str, value: str) -> str:
    return f"set {setting}={value} under [mysqld] in the server's config file (my.cnf) and restart it"


def run_checks(settings: MySQLSettings) -> tuple[ServerInfo, list[Check]]:
    """Connect and run every check; never raises for a failed check (only for no connection at all)."""
    conn = connect(settings)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            version = str(cur.fetchone()[0])
            flavor = "mariadb" if "mariadb" in version.lower() else "mysql"
            var = _variables(
                cur,
                [
                    "log_bin",
                    "binlog_format",
                    "binlog_row_image",
                    "binlog_row_metadata",
                    "server_id",
                    "log_bin_compress",
                    "binlog_transaction_compression",
                    "binlog_row_value_options",
                ],
            )
            grants = _grants(cur)
        info = ServerInfo(version=version, flavor=flavor, server_id=int(var.get("server_id", "0")))
        checks = [
            _equals("binlog enabled", var.get("log_bin", "OFF"), "ON", _restart_fix("log_bin", "binlog")),
            _equals(
                "binlog_format",
                var.get("binlog_format", "?"),
                "ROW",
                "SET GLOBAL binlog_format='ROW' and " + _restart_fix("binlog_format", "ROW"),
            ),
            _equals(
                "binlog_row_image",
                var.get("binlog_row_image", "?"),
                "FULL",
                "SET GLOBAL binlog_row_image='FULL' and " + _restart_fix("binlog_row_image", "FULL"),
            ),
            _equals(
                "binlog_row_metadata",
                var.get("binlog_row_metadata", "(not supported)"),
                "FULL",
                "SET GLOBAL binlog_row_metadata='FULL' and "
                + _restart_fix("binlog_row_metadata", "FULL")
                + " (needs MySQL >= 8.0.1 or MariaDB >= 10.5: without it column names are unknown)",
            ),
            Check(
                "server_id",
                info.server_id > 0 and info.server_id != settings.server_id,
                str(info.server_id),
                f"non-zero and different from the connector's FRESHKEY_MYSQL_SERVER_ID={settings.server_id}",
                _restart_fix("server_id", "1")
                if info.server_id == 0
                else "set FRESHKEY_MYSQL_SERVER_ID to an id no server or replica uses",
            ),
            compression_check(flavor, var),
            partial_json_check(var),
            *privilege_checks(grants, settings.user),
        ]
        return info, checks
    finally:
        conn.close()


def _equals(name: str, found: str, want: str, fix: str) -> Check:
    return Check(name, found.upper() == want, found, want, fix)


def compression_check(flavor: str, var: dict[str, str]) -> Check:
    """Binlog compression off (``log_bin_compress`` on MariaDB, ``binlog_transaction_compression`` on
    MySQL), from the server's global variables: the binlog reader cannot decode compressed events."""
    name = "log_bin_compress" if flavor == "mariadb" else "binlog_transaction_compression"
    found = var.get(name, "OFF")
    return Check(
        "binlog compression",
        found.upper() in ("OFF", "0"),
        f"{name}={found}",
        f"{name}=OFF",
        f"SET GLOBAL {name}=OFF and "
        + _restart_fix(name, "OFF")
        + " (compressed binlog events cannot be decoded by the binlog reader)",
    )


def partial_json_check(var: dict[str, str]) -> Check:
    """MySQL's ``binlog_row_value_options`` without ``PARTIAL_JSON`` (MariaDB has no such variable): with
    it, an update of part of a JSON document is logged as a partial update, whose after image holds only
    the changed parts, so the row cannot be cached from it."""
    found = var.get("binlog_row_value_options", "")
    return Check(
        "binlog_row_value_options",
        "PARTIAL_JSON" not in found.upper(),
        repr(found),
        "'' (no PARTIAL_JSON)",
        "SET GLOBAL binlog_row_value_options='' and "
        + _restart_fix("binlog_row_value_options", "''")
        + " (a partial JSON update holds only the changed parts of the document)",
    )


def _grants(cur: pymysql.cursors.Cursor) -> list[str]:
    cur.execute("SHOW GRANTS FOR CURRENT_USER()")
    return [str(row[0]) for row in cur.fetchall()]


_REPLICATION_CLIENT = ("REPLICATION CLIENT", "BINLOG MONITOR", "SUPER")


_GLOBAL_GRANT = re.compile(r"^GRANT (.+?) ON \*\.\* TO ", re.IGNORECASE)


def privilege_checks(grant_rows: Sequence[str], user: str) -> list[Check]:
    """Global privileges from SHOW GRANTS rows (one statement each), compared as whole names.

    Privileges reached through a role are not followed: grant them to the user directly.
    """
    privileges: set[str] = set()
    for row in grant_rows:
        match = _GLOBAL_GRANT.match(row.strip())
        if match:
            privileges.update(p.strip().upper() for p in match.group(1).split(","))
    global_grants = ", ".join(sorted(privileges - {"USAGE"}))

    def has(*names: str) -> bool:
        return "ALL PRIVILEGES" in privileges or any(n in privileges for n in names)

    grant = f"GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'@'%'"
    return [
        Check(
            "privilege REPLICATION SLAVE", has("REPLICATION SLAVE"), _found(global_grants), "granted", grant
        ),
        Check(
            "privilege REPLICATION CLIENT", has(*_REPLICATION_CLIENT), _found(global_grants), "granted", grant
        ),
        Check("privilege SELECT", has("SELECT"), _found(global_grants), "granted on *.*", grant),
    ]


def _found(global_grants: str) -> str:
    return global_grants or "(no global privileges)"


def require_ready(settings: MySQLSettings) -> ServerInfo:
    """Run the checks and raise :class:`ConfigurationError` listing every failure and its fix."""
    info, checks = run_checks(settings)
    failed = [c for c in checks if not c.ok]
    if failed:
        lines = [f"- {c.name}: found {c.found}, want {c.want}. Fix: {c.fix}" for c in failed]
        raise ConfigurationError(
            f"MySQL server {settings.host}:{settings.port} ({info.version}) cannot feed freshkey:\n"
            + "\n".join(lines)
        )
    return info


CHECKPOINT_CHECK = "checkpoint binlog on the server"


def checkpoint_check(settings: MySQLSettings, checkpoint_path: Path) -> Check:
    """Is the binlog file the connector's checkpoint needs still on the server (``SHOW BINARY LOGS``)?

    No checkpoint yet passes (the connector starts at the current position). A server that cannot be
    asked raises like :func:`run_checks`; a listing refused (a missing privilege) fails the check.
    """
    try:
        state = CheckpointStore(checkpoint_path).load_state()
    except CheckpointError as exc:
        return Check(CHECKPOINT_CHECK, False, str(exc), "a readable checkpoint", ACCEPT_GAP_HINT)
    if state is None:
        return Check(
            CHECKPOINT_CHECK, True, f"no checkpoint at {checkpoint_path}", "the checkpoint's binlog file"
        )
    conn = connect(settings)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            logs = [(str(row[0]), int(row[1])) for row in cur.fetchall()]
    except pymysql.err.MySQLError as exc:
        return Check(
            CHECKPOINT_CHECK,
            False,
            f"SHOW BINARY LOGS failed: {exc.args[-1]}",
            f"{state.position.file} listed",
            "grant the privileges above (REPLICATION CLIENT / BINLOG MONITOR)",
        )
    finally:
        conn.close()
    return checkpoint_check_from(state.position.file, state.position.pos, logs)


def checkpoint_check_from(file: str, pos: int, logs: Sequence[tuple[str, int]]) -> Check:
    """The check row for a checkpoint at ``file:pos`` on a server whose ``SHOW BINARY LOGS`` is ``logs``."""
    problem = position_problem(BinlogPosition(file, pos), logs)
    if problem is None:
        return Check(CHECKPOINT_CHECK, True, f"{file}:{pos}", f"{file} on the server")
    return Check(CHECKPOINT_CHECK, False, problem, f"{file} on the server", ACCEPT_GAP_HINT)


SIGNAL_CHECK = "signal table (snapshots)"


def signal_table_check(settings: MySQLSettings, signal_table: str) -> Check:
    """Can the connector's account use the signal table ``db.table`` that snapshots talk through
    (``connectors.snapshot.signals``)? It is created when missing (as the connector would), then a
    write, change and delete of a row are tried in a transaction that is rolled back (nothing reaches
    the binlog). A server that cannot be asked raises like :func:`run_checks`."""
    try:
        signal = SignalTable(signal_table, settings.server_id)
    except ConfigurationError as exc:
        return Check(SIGNAL_CHECK, False, signal_table, "db.table", str(exc))
    want = "created, and writable by the connector's account"
    conn = connect(settings)
    try:
        created = signal.ensure(conn, settings.user)
        signal.probe(conn, settings.user)
    except ConfigurationError as exc:
        return Check(SIGNAL_CHECK, False, str(exc).split(";")[0], want, signal.grant(settings.user))
    finally:
        conn.close()
    return Check(
        SIGNAL_CHECK, True, f"{signal.name} ({'created now' if created else 'present'}), writable", want
    )

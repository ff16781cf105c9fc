"""The signalling table: how ``freshkey snapshot`` talks to the connector, through the binlog.

One small table in the source database (``FRESHKEY_CONNECTOR_SIGNAL_TABLE``, default
``freshkey.signal``)::

    id VARCHAR(191) PRIMARY KEY, kind VARCHAR(32), body MEDIUMTEXT (JSON), updated_at DATETIME(6)

Rows are named after the connector they are for (its ``FRESHKEY_MYSQL_SERVER_ID``), so that several
connectors can read one server:

- ``snapshot/<server id>/request/<id>`` (kind ``request``): written by the command; the connector sees it
  in its binlog and takes it (:class:`~connectors.snapshot.model.SnapshotRequest` in ``body``);
- ``snapshot/<server id>/cancel/<id>`` (kind ``cancel``): the command's Ctrl-C;
- ``snapshot/<server id>/watermark`` (kind ``low`` or ``high``, ``{"chunk": ...}``): the connector's
  watermarks, one row rewritten for each (the table does not grow);
- ``snapshot/<server id>/status`` (kind ``status``): the connector's progress, which the command follows.

Only the connector's own account writes watermarks and status; it needs CREATE (once, when the table is
missing), SELECT, INSERT, UPDATE and DELETE on the table. :func:`parse_signal` is pure; the rest does
I/O with a pymysql connection the caller owns.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import pymysql

from connectors.database import quote_identifier
from connectors.exceptions import ConfigurationError
from schemas import ChangeEvent

SignalKind = Literal["request", "cancel", "low", "high", "status"]
_KINDS: frozenset[str] = frozenset({"request", "cancel", "low", "high", "status"})

# Errors that mean "this account may not do that here": waiting does not fix them.
ER_TABLEACCESS_DENIED = 1142
ER_DBACCESS_DENIED = 1044
ER_ACCESS_DENIED = 1045
ER_SPECIFIC_ACCESS_DENIED = 1227
ACCESS_DENIED = frozenset(
    {ER_TABLEACCESS_DENIED, ER_DBACCESS_DENIED, ER_ACCESS_DENIED, ER_SPECIFIC_ACCESS_DENIED}
)


@dataclass(frozen=True, slots=True)
class Signal:
    """A row of the signal table as the binlog carries it (for this connector)."""

    kind: SignalKind
    name: str
    """What follows the kind in the id (a request's id), empty for watermarks and status."""
    body: dict[str, Any]


def parse_signal(event: ChangeEvent, server_id: int) -> Signal | None:
    """The signal a change of the signal table carries for the connector ``server_id``; None for a
    delete, another connector's row, or a row that is no signal (logged by the caller, never fatal)."""
    if event.after is None:
        return None
    row_id = event.after.get("id")
    kind = event.after.get("kind")
    if not isinstance(row_id, str) or kind not in _KINDS:
        return None
    prefix = f"snapshot/{server_id}/"
    if not row_id.startswith(prefix):
        return None
    rest = row_id[len(prefix) :]
    name = rest.split("/", 1)[1] if "/" in rest else ""
    try:
        body = json.loads(event.after.get("body") or "{}")
    except (TypeError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    return Signal(kind, name, body)


class SignalTable:
    """The signal table ``db.table`` of the connector ``server_id`` (see the module docstring)."""

    def __init__(self, qualified: str, server_id: int) -> None:
        db, _, table = qualified.partition(".")
        if not db or not table:
            raise ConfigurationError(f"FRESHKEY_CONNECTOR_SIGNAL_TABLE must be db.table, got {qualified!r}")
        self.db, self.table, self.server_id = db, table, server_id
        self.sql_name = f"{quote_identifier(db)}.{quote_identifier(table)}"

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    @property
    def key(self) -> tuple[str, str]:
        return self.db, self.table

    def row_id(self, kind: str, name: str = "") -> str:
        return f"snapshot/{self.server_id}/{kind}" + (f"/{name}" if name else "")

    def grant(self, user: str) -> str:
        """The statement that gives ``user`` what the signal table needs."""
        return (
            f"GRANT CREATE, SELECT, INSERT, UPDATE, DELETE ON {quote_identifier(self.db)}.* TO '{user}'@'%' "
            f"(or create {self.name} yourself: {self.ddl()}, then GRANT SELECT, INSERT, UPDATE, DELETE "
            "on it)"
        )

    def ddl(self) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {self.sql_name} (id VARCHAR(191) NOT NULL PRIMARY KEY, "
            "kind VARCHAR(32) NOT NULL, body MEDIUMTEXT NOT NULL, updated_at DATETIME(6) NOT NULL) "
            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        )

    # -- I/O ----------------------------------------------------------------------------------------------
    def exists(self, conn: pymysql.connections.Connection) -> bool:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s",
                (self.db, self.table),
            )
            return cur.fetchone() is not None

    def ensure(self, conn: pymysql.connections.Connection, user: str) -> bool:
        """Create the table when missing (its CREATE is a DDL statement in the binlog, so it is done only
        when the table is missing); True when it was created. ConfigurationError, naming the grant,
        when the account may not."""
        if self.exists(conn):
            return False
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(self.db)}")
                cur.execute(self.ddl())
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] in ACCESS_DENIED:
                raise ConfigurationError(
                    f"cannot create the signal table {self.name} as {user!r} ({exc.args[-1]}); "
                    f"{self.grant(user)}"
                ) from None
            raise
        return True

    def probe(self, conn: pymysql.connections.Connection, user: str) -> None:
        """Write, change and delete a row inside a transaction that is rolled back (so it never reaches
        the binlog): ConfigurationError, naming the grant, when the account may not."""
        probe_id = f"probe/{self.server_id}/{time.time_ns()}"
        try:
            conn.begin()
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        f"INSERT INTO {self.sql_name} (id, kind, body, updated_at) "
                        "VALUES (%s, 'probe', '{}', UTC_TIMESTAMP(6))",
                        (probe_id,),
                    )
                    cur.execute(f"UPDATE {self.sql_name} SET body = '{{}}' WHERE id = %s", (probe_id,))
                    cur.execute(f"SELECT kind FROM {self.sql_name} WHERE id = %s", (probe_id,))
                    cur.execute(f"DELETE FROM {self.sql_name} WHERE id = %s", (probe_id,))
            finally:
                conn.rollback()
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] in ACCESS_DENIED:
                raise ConfigurationError(
                    f"the signal table {self.name} is not writable as {user!r} ({exc.args[-1]}); "
                    f"{self.grant(user)}"
                ) from None
            raise

    def write(
        self, conn: pymysql.connections.Connection, kind: SignalKind, name: str, body: dict[str, Any]
    ) -> None:
        """Insert or replace the row ``kind/name`` (one autocommitted statement: one binlog transaction)."""
        text = json.dumps(body, separators=(",", ":"), default=str)
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {self.sql_name} (id, kind, body, updated_at) "
                "VALUES (%s, %s, %s, UTC_TIMESTAMP(6)) "
                "ON DUPLICATE KEY UPDATE kind = %s, body = %s, updated_at = UTC_TIMESTAMP(6)",
                (
                    self.row_id(kind if kind not in ("low", "high") else "watermark", name),
                    kind,
                    text,
                    kind,
                    text,
                ),
            )

    def watermark(
        self, conn: pymysql.connections.Connection, kind: Literal["low", "high"], chunk: str, **extra: Any
    ) -> None:
        """Rewrite this connector's watermark row: the low or high watermark of ``chunk``."""
        self.write(conn, kind, "", {"chunk": chunk, **extra})

    def read(
        self, conn: pymysql.connections.Connection, kind: SignalKind, name: str = ""
    ) -> dict[str, Any] | None:
        """The body of the row ``kind/name``; None when there is none (or it is no JSON object)."""
        with conn.cursor() as cur:
            cur.execute(f"SELECT body FROM {self.sql_name} WHERE id = %s", (self.row_id(kind, name),))
            row = cur.fetchone()
        if row is None:
            return None
        try:
            body = json.loads(row[0])
        except (TypeError, ValueError):
            return None
        return body if isinstance(body, dict) else None

"""Plain reads of the source database (for the verifier and loaders), in the same JSON form as events."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors

from connectors.settings import MySQLSettings
from schemas import row_to_json


def quote_identifier(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def read_table(settings: MySQLSettings, database: str, table: str) -> Iterator[dict[str, Any]]:
    """Stream every row of a table (server-side cursor), converted like binlog rows."""
    conn = pymysql.connect(
        **settings.connection_kwargs(),
        cursorclass=pymysql.cursors.SSDictCursor,
    )
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {quote_identifier(database)}.{quote_identifier(table)}")
            for row in cur:
                yield row_to_json(row)
    finally:
        conn.close()


def _names(settings: MySQLSettings, query: str, database: str, table: str) -> tuple[str, ...]:
    conn = pymysql.connect(**settings.connection_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(query, (database, table))
            return tuple(str(row[0]) for row in cur.fetchall())
    finally:
        conn.close()


def table_columns(settings: MySQLSettings, database: str, table: str) -> tuple[str, ...]:
    """The table's columns in their order (information_schema); empty when the table does not exist."""
    return _names(
        settings,
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s "
        "ORDER BY ORDINAL_POSITION",
        database,
        table,
    )


def primary_key(settings: MySQLSettings, database: str, table: str) -> tuple[str, ...]:
    """The table's primary key columns in order; empty when it has none."""
    return _names(
        settings,
        "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA=%s "
        "AND TABLE_NAME=%s AND CONSTRAINT_NAME='PRIMARY' ORDER BY ORDINAL_POSITION",
        database,
        table,
    )


# Server errors that mean "a key value cannot be compared with its column": the value holds characters
# the column's character set cannot (an emoji against a latin1 column: "Illegal mix of collations").
# ER_CANT_AGGREGATE_2COLLATIONS, ER_CANT_AGGREGATE_3COLLATIONS, ER_CANT_AGGREGATE_NCOLLATIONS.
_COLLATION_MIX_ERRORS = frozenset({1267, 1270, 1271})
# Column types whose JSON form is base64 (schemas.values): a key value is decoded before it is compared.
_BASE64_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "bit"})


def is_collation_mix(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing to compare a value with a column of another charset."""
    return isinstance(exc, pymysql.err.MySQLError) and bool(exc.args) and exc.args[0] in _COLLATION_MIX_ERRORS


def _sql_key(value: Any, data_type: str) -> Any:
    """A key value in its JSON form (``schemas.values``) as a query parameter; None: no row can hold it."""
    if data_type in _BASE64_TYPES:
        try:
            return base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            return None
    return value


def read_rows(
    settings: MySQLSettings,
    database: str,
    table: str,
    key_columns: Sequence[str],
    keys: Sequence[Sequence[Any]],
    *,
    chunk: int = 500,
) -> list[dict[str, Any]]:
    """The rows whose key columns hold one of ``keys`` (any order), converted like binlog rows.

    Keys are given in their JSON form (as in events and cache keys; numbers may come as strings):
    binary key columns take the base64 form. One ``SELECT ... WHERE (k1, k2) IN ((...), ...)`` per
    ``chunk`` keys; missing rows are left out. A key that its column cannot hold (a value its
    character set has no code for, an invalid base64 for a binary column) is not a row of the table and
    is left out as well: a chunk the server refuses to compare is split in halves until each such key
    stands alone, so one odd key costs a few more queries, never the whole read. Equality is the
    column's collation: a case-insensitive column returns ``'café'`` for ``'CAFÉ'``; callers that need
    the exact key compare it themselves.
    """
    if not keys:
        return []
    if not key_columns:
        raise ValueError("read_rows needs the key columns")
    if any(len(key) != len(key_columns) for key in keys):
        raise ValueError(f"every key needs {len(key_columns)} values ({', '.join(key_columns)})")
    conn = pymysql.connect(**settings.connection_kwargs(), cursorclass=pymysql.cursors.DictCursor)
    columns = ", ".join(quote_identifier(c) for c in key_columns)
    source = f"{quote_identifier(database)}.{quote_identifier(table)}"
    one = "(" + ", ".join(["%s"] * len(key_columns)) + ")"
    rows: list[dict[str, Any]] = []
    try:
        with conn.cursor() as cur:
            types = _data_types(cur, database, table)
            params: list[tuple[Any, ...]] = []
            for key in keys:
                values = tuple(_sql_key(v, types.get(c, "")) for c, v in zip(key_columns, key, strict=True))
                if all(v is not None for v in values):
                    params.append(values)

            def select(part: Sequence[tuple[Any, ...]]) -> None:
                try:
                    cur.execute(
                        f"SELECT * FROM {source} WHERE ({columns}) IN ({', '.join([one] * len(part))})",
                        tuple(value for key in part for value in key),
                    )
                except pymysql.err.MySQLError as exc:
                    if not is_collation_mix(exc):
                        raise
                    if len(part) > 1:
                        half = len(part) // 2
                        select(part[:half])
                        select(part[half:])
                    # One key the server cannot compare with its column: no row holds it.
                    return
                rows.extend(row_to_json(row) for row in cur.fetchall())

            for start in range(0, len(params), chunk):
                select(params[start : start + chunk])
    finally:
        conn.close()
    return rows


def _data_types(cur: Any, database: str, table: str) -> dict[str, str]:
    cur.execute(
        "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s",
        (database, table),
    )
    return {str(row["COLUMN_NAME"]): str(row["DATA_TYPE"]).lower() for row in cur.fetchall()}


@dataclass(frozen=True, slots=True)
class BinlogPosition:
    """Where the server's binlog ends now (``SHOW MASTER STATUS``) and its executed GTIDs, if any."""

    file: str
    pos: int
    gtid: str
    """MariaDB ``@@gtid_current_pos`` or MySQL ``@@gtid_executed``; empty when the server has none."""


def binlog_position(settings: MySQLSettings) -> BinlogPosition | None:
    """The server's binlog position now; None when it writes no binlog.

    Every change committed before this call ends at or before ``pos`` of ``file``, and every later one
    after it. ``SHOW MASTER STATUS`` on MariaDB and MySQL before 8.4, ``SHOW BINARY LOG STATUS`` after.
    """
    conn = pymysql.connect(**settings.connection_kwargs())
    try:
        with conn.cursor() as cur:
            status: tuple[Any, ...] | None = None
            for statement in ("SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"):
                try:
                    cur.execute(statement)
                except pymysql.err.ProgrammingError:
                    continue  # the other server's spelling
                status = cur.fetchone()
                break
            if not status:
                return None
            gtid = ""
            for variable in ("@@gtid_current_pos", "@@gtid_executed"):  # MariaDB, MySQL
                try:
                    cur.execute(f"SELECT {variable}")
                except pymysql.err.MySQLError:
                    continue
                found = cur.fetchone()
                gtid = str(found[0] or "") if found else ""
                break
            return BinlogPosition(file=str(status[0]), pos=int(status[1]), gtid=gtid)
    finally:
        conn.close()

"""Plain reads of the source database (for the verifier and loaders), in the same JSON form as events."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors

from connectors.mysql import Connection
from connectors.settings import MySQLSettings
from schemas import row_to_json
from schemas.values import (
    ColumnType,
    column_type_from_information_schema,
    json_checked_columns,
    json_to_sql,
)

# Reads see TIMESTAMP values in UTC, as the binlog carries them (schemas.values).
_UTC_SESSION = "SET time_zone = '+00:00'"


def quote_identifier(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def read_table(settings: MySQLSettings, database: str, table: str) -> Iterator[dict[str, Any]]:
    """Stream every row of a table (server-side cursor), converted like binlog rows (one mapping per
    column type, ``schemas.values``)."""
    conn = Connection(
        **settings.connection_kwargs(),
        cursorclass=pymysql.cursors.SSDictCursor,
        init_command=_UTC_SESSION,
    )
    try:
        with conn.cursor() as cur:
            types = _column_types(cur, database, table)
            source = f"{quote_identifier(database)}.{quote_identifier(table)}"
            cur.execute(f"SELECT {select_list(types)} FROM {source}")
            for row in cur:
                yield row_to_json(row, types)
    finally:
        conn.close()


def select_list(types: Mapping[str, ColumnType]) -> str:
    """The columns of a read, in their order: FLOAT as ``CAST(col AS DOUBLE)``, because the text protocol
    prints a FLOAT with six significant digits (16777217 reads as 16777200) while the binlog carries its
    float32 value; the cast sends that value exactly. ``*`` when the types are not known."""
    if not types:
        return "*"
    return ", ".join(
        f"CAST({quote_identifier(name)} AS DOUBLE) AS {quote_identifier(name)}"
        if column.kind == "float"
        else quote_identifier(name)
        for name, column in types.items()
    )


def column_types(settings: MySQLSettings, database: str, table: str) -> dict[str, ColumnType]:
    """The table's columns and their types, in order (information_schema; MariaDB's JSON columns found
    by their ``JSON_VALID`` check); empty when the table does not exist."""
    conn = Connection(**settings.connection_kwargs(), cursorclass=pymysql.cursors.DictCursor)
    try:
        with conn.cursor() as cur:
            return _column_types(cur, database, table)
    finally:
        conn.close()


def _names(settings: MySQLSettings, query: str, database: str, table: str) -> tuple[str, ...]:
    conn = Connection(**settings.connection_kwargs())
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


def is_collation_mix(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing to compare a value with a column of another charset."""
    return isinstance(exc, pymysql.err.MySQLError) and bool(exc.args) and exc.args[0] in _COLLATION_MIX_ERRORS


def _sql_key(value: Any, column: ColumnType | None) -> Any:
    """A key value in its JSON form (``schemas.values``) as a query parameter; None: no row can hold it."""
    try:
        return json_to_sql(value, column)
    except ValueError:
        return None


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
    conn = Connection(
        **settings.connection_kwargs(), cursorclass=pymysql.cursors.DictCursor, init_command=_UTC_SESSION
    )
    columns = ", ".join(quote_identifier(c) for c in key_columns)
    source = f"{quote_identifier(database)}.{quote_identifier(table)}"
    one = "(" + ", ".join(["%s"] * len(key_columns)) + ")"
    rows: list[dict[str, Any]] = []
    try:
        with conn.cursor() as cur:
            types = _column_types(cur, database, table)
            selected = select_list(types)
            params: list[tuple[Any, ...]] = []
            for key in keys:
                values = tuple(_sql_key(v, types.get(c)) for c, v in zip(key_columns, key, strict=True))
                if all(v is not None for v in values):
                    params.append(values)

            def select(part: Sequence[tuple[Any, ...]]) -> None:
                try:
                    matches = ", ".join([one] * len(part))
                    cur.execute(
                        f"SELECT {selected} FROM {source} WHERE ({columns}) IN ({matches})",
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
                rows.extend(row_to_json(row, types) for row in cur.fetchall())

            for start in range(0, len(params), chunk):
                select(params[start : start + chunk])
    finally:
        conn.close()
    return rows


def _column_types(cur: Any, database: str, table: str) -> dict[str, ColumnType]:
    """Column types of a table through a DictCursor (see :func:`column_types`)."""
    cur.execute(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_SCALE, DATETIME_PRECISION "
        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s ORDER BY ORDINAL_POSITION",
        (database, table),
    )
    rows = cur.fetchall()
    checked: set[str] = set()
    try:  # MariaDB's JSON is a LONGTEXT with a JSON_VALID check (MySQL 8.0.16+ has the view too)
        cur.execute(
            "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
            "WHERE CONSTRAINT_SCHEMA=%s AND TABLE_NAME=%s",
            (database, table),
        )
        checked = json_checked_columns(str(row["CHECK_CLAUSE"]) for row in cur.fetchall())
    except pymysql.err.MySQLError:  # a server without the view has no such checks
        pass
    return {
        str(row["COLUMN_NAME"]): column_type_from_information_schema(
            row, json_checked=str(row["COLUMN_NAME"]) in checked
        )
        for row in rows
    }


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
    conn = Connection(**settings.connection_kwargs())
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

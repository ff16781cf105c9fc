"""Plain reads of the source database (for the verifier and loaders), in the same JSON form as events."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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

    One ``SELECT ... WHERE (k1, k2) IN ((...), ...)`` per ``chunk`` keys; missing rows are left out.
    """
    if not keys:
        return []
    if not key_columns:
        raise ValueError("read_rows needs the key columns")
    conn = pymysql.connect(**settings.connection_kwargs(), cursorclass=pymysql.cursors.DictCursor)
    columns = ", ".join(quote_identifier(c) for c in key_columns)
    source = f"{quote_identifier(database)}.{quote_identifier(table)}"
    one = "(" + ", ".join(["%s"] * len(key_columns)) + ")"
    rows: list[dict[str, Any]] = []
    try:
        with conn.cursor() as cur:
            for start in range(0, len(keys), chunk):
                part = keys[start : start + chunk]
                cur.execute(
                    f"SELECT * FROM {source} WHERE ({columns}) IN ({', '.join([one] * len(part))})",
                    tuple(value for key in part for value in key),
                )
                rows.extend(row_to_json(row) for row in cur.fetchall())
    finally:
        conn.close()
    return rows

"""Reading a table in primary-key chunks, each row in the JSON form a binlog event of it has.

Keyset pagination: ``SELECT <columns> FROM t WHERE <key> > <last key> ORDER BY <key> LIMIT n`` on the
primary key's index (a composite key as ``a > x OR (a = x AND b > y) ...``, which both MySQL and MariaDB
read as a range). Values go through the one mapping per column type (:mod:`schemas.values`), with the
reads of :mod:`connectors.database` (UTC session, FLOAT sent as its float32 value), so a snapshot row
and a binlog image of the same row are equal byte for byte.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pymysql

from connectors.database import column_types, primary_key, quote_identifier, select_list
from connectors.mysql import Connection
from connectors.settings import MySQLSettings
from schemas import row_to_json
from schemas.values import ColumnType, json_to_sql

_UTC_SESSION = "SET time_zone = '+00:00'"


@dataclass(frozen=True, slots=True)
class TableShape:
    """What reading a table in chunks needs: its column types and its primary key."""

    types: dict[str, ColumnType]
    key_columns: tuple[str, ...]
    """The primary key in index order (the order of the chunks)."""
    event_key_columns: tuple[str, ...]
    """The same columns in the table's column order (the binlog reader's order)."""
    estimate: int | None


class ShapeError(ValueError):
    """The table cannot be read in chunks (missing, no primary key); the message says why."""


def keyset_condition(key_columns: Sequence[str]) -> str:
    """``WHERE`` text for "key after the given one" in index order, with ``%s`` placeholders taking
    :func:`keyset_params`: ``(a > %s) OR (a = %s AND b > %s) ...``."""
    quoted = [quote_identifier(c) for c in key_columns]
    terms = []
    for i in range(len(quoted)):
        equal = [f"{q} = %s" for q in quoted[:i]]
        terms.append("(" + " AND ".join([*equal, f"{quoted[i]} > %s"]) + ")")
    return " OR ".join(terms)


def keyset_params(last_key: Sequence[Any]) -> list[Any]:
    """The parameters of :func:`keyset_condition` for ``last_key`` (SQL values, key-column order)."""
    params: list[Any] = []
    for i in range(len(last_key)):
        params.extend(last_key[: i + 1])
    return params


class ChunkReader:
    """One connection to the source for reading chunks (autocommit: each SELECT sees every transaction
    committed before it started, the low watermark's included)."""

    def __init__(self, settings: MySQLSettings) -> None:
        self.settings = settings
        self._conn: pymysql.connections.Connection | None = None

    @property
    def conn(self) -> pymysql.connections.Connection:
        if self._conn is None:
            self._conn = Connection(
                **self.settings.connection_kwargs(), autocommit=True, init_command=_UTC_SESSION
            )
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def shape(self, db: str, table: str) -> TableShape:
        """The table's shape; :class:`ShapeError` when it cannot be read in chunks."""
        types = column_types(self.settings, db, table)
        if not types:
            raise ShapeError(f"table {db}.{table} does not exist")
        key = primary_key(self.settings, db, table)
        if not key:
            raise ShapeError(f"table {db}.{table} has no primary key (freshkey addresses rows by it)")
        with self.conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(
                "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s",
                (db, table),
            )
            found = cur.fetchone()
        estimate = int(found["TABLE_ROWS"]) if found and found["TABLE_ROWS"] is not None else None
        in_table_order = tuple(c for c in types if c in key)
        return TableShape(types, key, in_table_order, estimate)

    def read(
        self, db: str, table: str, shape: TableShape, after: Sequence[Any] | None, limit: int
    ) -> tuple[list[dict[str, Any]], list[Any] | None]:
        """Up to ``limit`` rows after the key ``after`` (JSON form; None: from the first row), in key
        order, in JSON form; and the key of the last one (None when there is none)."""
        columns = ", ".join(quote_identifier(c) for c in shape.key_columns)
        sql = f"SELECT {select_list(shape.types)} FROM {quote_identifier(db)}.{quote_identifier(table)}"
        params: list[Any] = []
        if after is not None:
            values = [
                json_to_sql(v, shape.types.get(c)) for c, v in zip(shape.key_columns, after, strict=True)
            ]
            sql += f" WHERE {keyset_condition(shape.key_columns)}"
            params = keyset_params(values)
        sql += f" ORDER BY {columns} LIMIT {int(limit)}"
        with self.conn.cursor() as cur:
            cur.execute(sql, params or None)
            names = [str(d[0]) for d in cur.description or ()]
            raw = cur.fetchall()
        rows = [row_to_json(dict(zip(names, values, strict=True)), shape.types) for values in raw]
        last = [rows[-1][c] for c in shape.key_columns] if rows else None
        return rows, last

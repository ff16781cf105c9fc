"""Plain reads of the source database (for the verifier and loaders), in the same JSON form as events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymysql
import pymysql.cursors

from connectors.settings import MySQLSettings
from schemas import row_to_json


def _quote(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def read_table(settings: MySQLSettings, database: str, table: str) -> Iterator[dict[str, Any]]:
    """Stream every row of a table (server-side cursor), converted like binlog rows."""
    conn = pymysql.connect(
        **settings.connection_kwargs(),
        cursorclass=pymysql.cursors.SSDictCursor,
    )
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {_quote(database)}.{_quote(table)}")
            for row in cur:
                yield row_to_json(row)
    finally:
        conn.close()

"""Table maps parsed once per table (connectors.binlog.tablemaps) never decode a row with another table's
columns.

The binlog source runs pymysqlreplication with ``freeze_schema=True``, which trusts that a table id always
describes the same table. A real server breaks that trust: after a restart it hands the same ids out
again, to other tables (measured on MariaDB 10.11: the id of ``a`` before the restart is ``b``'s after
it, and ``a``'s id after it was ``a``'s before its last two ALTERs). A backlog that spans the restart is
read here through :class:`~connectors.binlog.source.BinlogSource`, with the guard that re-parses a table
map whose bytes changed, and without it (the same scenario fails).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.binlog.source import BinlogSource
from connectors.binlog.tablemaps import TableMapGuard
from connectors.checkpoint import BinlogPosition
from connectors.settings import MySQLSettings
from pipeline.embedded import LocalMariaDB
from schemas import ChangeEvent

pytestmark = pytest.mark.integration

EXPECTED = [
    ("a", {"id": 1, "x": 1}),
    ("a", {"id": 2, "x": 2, "w": 2}),
    ("a", {"id": 3, "x": 3, "w": 3, "v": "three"}),
    ("a", {"id": 4, "x": 4, "w": 4, "v": "four"}),
    ("b", {"id": 1, "z": 7}),
    ("a", {"id": 5, "x": 5, "w": 5, "v": "five"}),
]


@pytest.fixture(scope="module")
def backlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MySQLSettings, BinlogPosition]]:
    """A private MariaDB (it is restarted) with a backlog: rows of ``d.a`` between ALTERs, a restart,
    then rows of ``d.b`` and ``d.a`` under the reused table ids."""
    db = LocalMariaDB(workdir=Path(tmp_path_factory.mktemp("tablemaps")) / "mariadb")
    db.start()
    try:

        def run(*statements: str) -> None:
            conn = db.connect(admin=True)
            try:
                with conn.cursor() as cur:
                    for statement in statements:
                        cur.execute(statement)
            finally:
                conn.close()

        conn = db.connect(admin=True)
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row: Any = cur.fetchone()
        conn.close()
        start = BinlogPosition(str(row[0]), int(row[1]))
        run(
            "CREATE DATABASE d",
            "CREATE TABLE d.a (id INT PRIMARY KEY, x INT)",
            "CREATE TABLE d.b (id INT PRIMARY KEY, z INT)",  # laid out like a before its ALTERs
            "INSERT INTO d.a VALUES (1, 1)",
            "ALTER TABLE d.a ADD COLUMN w INT, ALGORITHM=INSTANT",
            "INSERT INTO d.a VALUES (2, 2, 2)",
            "ALTER TABLE d.a ADD COLUMN v VARCHAR(10)",
            "INSERT INTO d.a VALUES (3, 3, 3, 'three')",
            "TRUNCATE d.a",
            "INSERT INTO d.a VALUES (4, 4, 4, 'four')",
        )
        db.halt()
        db.resume()
        # First tables opened after the restart: they get the ids the first ones got before it.
        run("INSERT INTO d.b VALUES (1, 7)", "INSERT INTO d.a VALUES (5, 5, 5, 'five')")
        settings = MySQLSettings(host=db.host, port=db.port, user=db.user, password=db.password, server_id=77)
        yield settings, start
    finally:
        db.stop()


def read(settings: MySQLSettings, start: BinlogPosition) -> list[tuple[str, dict[str, Any]]]:
    """(table, after image) of every change; ("error", ...) where the source raised."""
    source = BinlogSource(settings, [("d", "a"), ("d", "b")], start=start, blocking=False)
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        for item in source:
            if isinstance(item, ChangeEvent):
                rows.append((item.source.table, dict(item.after or {})))
    except Exception as exc:  # a row decoded with another table's columns may not decode at all
        rows.append(("error", {"error": repr(exc)}))
    finally:
        source.close()
    return rows


def test_rows_across_a_restart_and_ddl_decode_with_their_own_table(
    backlog: tuple[MySQLSettings, BinlogPosition],
) -> None:
    assert read(*backlog) == EXPECTED


def test_without_the_guard_a_reused_table_id_decodes_rows_as_another_table(
    backlog: tuple[MySQLSettings, BinlogPosition], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The protection is needed: ``freeze_schema`` alone takes ``b``'s row for a row of ``a`` (``b``'s
    table map reused ``a``'s id; same layout, so it decodes without complaint), then fails on ``a``'s
    next row, decoded with ``a``'s columns of two ALTERs ago."""
    monkeypatch.setattr(TableMapGuard, "table_map_event", lambda self, body: None)
    rows = read(*backlog)
    assert rows != EXPECTED
    assert rows[:4] == EXPECTED[:4]
    assert rows[4] == ("a", {"id": 1, "x": 7}), rows

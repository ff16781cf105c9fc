"""The binlog source reads the same items with the lean reader (connectors.binlog.lean) as without it.

:class:`~connectors.binlog.lean.LeanReader` reads the events of plain transactions (rows, XID, MariaDB's
GTID, table maps it holds) from their bytes instead of through pymysqlreplication's event objects. Here a
real server's binlog with what the short way must leave to pymysqlreplication or get exactly right
(rotations, DDL, unbound tables and schemas, a table the row decoder does not cover, partial row
images, a table without a primary key, statement-logged DML, multi-row and multi-event statements, key
changes) is read by :class:`~connectors.binlog.source.BinlogSource` both ways, and every item (changes,
boundaries with their positions, fences, dead letters, DDL) must be the same. A reader that does not
move its position on the events it reads itself is shown to be caught.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from pydantic import BaseModel
from pymysqlreplication import BinLogStreamReader

import connectors.binlog.source as source_module
from connectors.binlog.lean import _SKIPPED, LeanReader
from connectors.binlog.source import BinlogSource
from connectors.checkpoint import BinlogPosition
from tests.support.services import MySQLService
from tests.support.type_matrix import admin_settings, connection_settings

pytestmark = pytest.mark.integration

READ_MS = 1_750_000_000_000
"""The connector's read time, fixed: the two reads happen at different times."""


@pytest.fixture
def backlog(mysql_service: MySQLService) -> Iterator[tuple[MySQLService, str, BinlogPosition, bool]]:
    """Two private databases and a binlog of everything the lean reader must read alike."""
    db = f"freshkey_lean_{uuid.uuid4().hex[:8]}"
    other = f"{db}_o"
    conn = pymysql.connect(**connection_settings(mysql_service), autocommit=True, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
            for statement in (
                f"CREATE DATABASE {db}",
                f"CREATE DATABASE {other}",
                f"CREATE TABLE {db}.a (id INT PRIMARY KEY, v VARCHAR(40), n BIGINT, at DATETIME(6))",
                f"CREATE TABLE {db}.b (id INT PRIMARY KEY, t TEXT)",  # unbound (its name is bound)
                f"CREATE TABLE {db}.u (id INT PRIMARY KEY, v INT)",  # unbound
                f"CREATE TABLE {db}.g (id INT PRIMARY KEY, spot POINT)",  # rows the decoder hands back
                f"CREATE TABLE {db}.nopk (v INT)",  # no primary key: dead letters
                f"CREATE TABLE {other}.a (id INT PRIMARY KEY, v INT)",  # unbound (its name is bound)
                f"CREATE TABLE {other}.b (id INT PRIMARY KEY, t TEXT)",
            ):
                cur.execute(statement)
            cur.execute("SHOW MASTER STATUS")
            row: Any = cur.fetchone()
            start = BinlogPosition(str(row[0]), int(row[1]))
            for i in range(1, 21):
                cur.execute(
                    f"INSERT INTO {db}.a VALUES ({i}, 'v{i}', {i * 7}, '2024-01-0{i % 9 + 1} 10:00:00.5')"
                )
            for i in range(1, 11):
                cur.execute(f"UPDATE {db}.a SET v = 'w{i}', n = n + 1 WHERE id = {i}")
            cur.execute(f"DELETE FROM {db}.a WHERE id = 20")
            cur.execute("BEGIN")
            cur.execute(f"INSERT INTO {db}.a VALUES (21, 'x', 1, NULL)")
            cur.execute(f"INSERT INTO {db}.u VALUES (1, 1)")
            cur.execute(f"INSERT INTO {other}.a VALUES (1, 1)")
            cur.execute(f"INSERT INTO {db}.b VALUES (1, 'b')")
            cur.execute(f"INSERT INTO {other}.b VALUES (1, 'b')")
            cur.execute("COMMIT")
            many = ", ".join(f"({i}, '{'t' * 200}{i}')" for i in range(2, 302))
            cur.execute(f"INSERT INTO {other}.b VALUES {many}")  # several rows events, one statement
            # Twice each: the event right after a table map pymysqlreplication parses is its own to read.
            for i in (1, 3):
                cur.execute(
                    f"INSERT INTO {db}.g VALUES ({i}, ST_GeomFromText('POINT(1 2)')), ({i + 1}, NULL)"
                )
                cur.execute(f"INSERT INTO {db}.nopk VALUES ({i}), ({i + 1})")
            cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
            cur.execute(f"UPDATE {db}.a SET v = 'minimal' WHERE id = 5")
            cur.execute("SET SESSION binlog_row_image = 'FULL'")
            cur.execute("FLUSH BINARY LOGS")  # a rotation: pymysqlreplication forgets its table maps
            cur.execute(f"UPDATE {db}.a SET n = 0 WHERE id = 6")
            cur.execute(f"UPDATE {other}.b SET t = 'again' WHERE id <= 3")
            cur.execute(f"ALTER TABLE {db}.a ADD COLUMN w INT")
            cur.execute(f"INSERT INTO {db}.a VALUES (22, 'y', 2, NULL, 22)")
            cur.execute(f"UPDATE {db}.a SET id = id + 100 WHERE id <= 3")  # key changes, one event
            cur.execute("SET SESSION binlog_format = 'STATEMENT'")
            cur.execute(f"UPDATE {db}.a SET n = 5 WHERE id = 104")  # its rows are not in the binlog
            cur.execute("SET SESSION binlog_format = 'ROW'")
            rows = ", ".join(f"({i}, 'bulk', {i}, '2024-02-01 00:00:00', {i})" for i in range(1000, 1500))
            cur.execute(f"INSERT INTO {db}.a VALUES {rows}")
            cur.execute(f"DELETE FROM {db}.a WHERE id >= 1000")
        yield mysql_service, db, start, mariadb
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {db}")
            cur.execute(f"DROP DATABASE IF EXISTS {other}")
        conn.close()


def read(mysql: MySQLService, db: str, start: BinlogPosition) -> list[Any]:
    """Every item of the source from ``start`` to the binlog's end, in comparable form."""
    tables = [(db, "a"), (db, "g"), (db, "nopk"), (f"{db}_o", "b")]
    source = BinlogSource(admin_settings(mysql), tables, start=start, blocking=False)
    items: list[Any] = []
    try:
        for item in source:
            if isinstance(item, BaseModel):
                dumped = item.model_dump(mode="json")
                if item.kind == "dead-letter":  # stamped when made, by the wall clock
                    dumped["ts_ms"] = None
                items.append((type(item).__name__, dumped))
            else:
                items.append((type(item).__name__, item))
    finally:
        source.close()
    return items


def test_the_lean_reader_gives_the_source_the_same_items(
    backlog: tuple[MySQLService, str, BinlogPosition, bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    mysql, db, start, mariadb = backlog
    monkeypatch.setattr(source_module, "_now_ms", lambda: READ_MS)
    seen: Counter[str] = Counter()
    lean, full = LeanReader._lean, LeanReader.full

    def counted_lean(self: LeanReader, packet: Any) -> Any:
        event = lean(self, packet)
        seen["handed on" if event is None else "skipped" if event is _SKIPPED else type(event).__name__] += 1
        return event

    def counted_full(self: LeanReader, event: Any) -> Any:
        seen["full"] += 1
        return full(self, event)

    monkeypatch.setattr(LeanReader, "_lean", counted_lean)
    monkeypatch.setattr(LeanReader, "full", counted_full)
    with_lean = read(mysql, db, start)
    monkeypatch.setattr(source_module, "LeanReader", BinLogStreamReader)
    without = read(mysql, db, start)

    kinds = Counter(kind for kind, _ in with_lean)
    assert kinds["ChangeEvent"] >= 20 + 10 + 1 + 1 + 300 + 2 + 1 + 3 + 1 + 6 + 500 + 500, kinds
    assert kinds["DeadLetter"] >= 1 and kinds["FenceEvent"] >= 1 and kinds["DdlEvent"] >= 1, kinds
    # The short way read most events, and handed pymysqlreplication the rest, as the docstring says.
    assert seen["LeanRows"] >= 40 and seen["LeanXid"] >= 40 and seen["skipped"] >= 20, seen
    assert seen["handed on"] >= 5 and seen["full"] >= 2, seen  # rotation, DDL...; GEOMETRY, MINIMAL
    if mariadb:
        assert seen["LeanGtid"] >= 40, seen
    assert len(with_lean) == len(without)
    for mine, theirs in zip(with_lean, without, strict=True):
        assert mine == theirs


def test_a_lean_reader_that_does_not_move_its_position_is_caught(
    backlog: tuple[MySQLService, str, BinlogPosition, bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above sees positions: without ``fetchone``'s position update on the events it
    reads itself, the boundaries the checkpoint rests on differ."""
    mysql, db, start, _ = backlog
    monkeypatch.setattr(source_module, "_now_ms", lambda: READ_MS)
    monkeypatch.setattr(LeanReader, "_moved", lambda self, data: None)
    broken = read(mysql, db, start)
    monkeypatch.setattr(source_module, "LeanReader", BinLogStreamReader)
    assert broken != read(mysql, db, start)
    assert any(kind == "ChangeEvent" for kind, _ in broken), "nothing read: the control proves nothing"

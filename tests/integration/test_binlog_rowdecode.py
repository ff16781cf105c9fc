"""Rows decoded straight from the binlog's bytes (connectors.binlog.rowdecode) equal pymysqlreplication's
rows mapped by column type, image by image, on a real server's binlog.

Every column type the decoder covers gets the type matrix's edge values (tests.support.type_matrix:
minimum, maximum, zero, NULL, fractions, utf8mb4, latin1, large TEXT/BLOB), zero and invalid temporal
values, and random values; the rows are inserted, updated and deleted. For each rows event the decoder's
rows must equal ``binlog_row_converter(types)`` over pymysqlreplication's rows of the same event, and
the decoder must have decoded it (not handed it back). Events it must hand back (a type it does not
cover, a partial row image) come back as None, and the source still gives the same changes.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysqlreplication.row_event import UpdateRowsEvent

from connectors.binlog.rowdecode import decode_rows, row_decoder
from connectors.binlog.source import BinlogSource
from connectors.checkpoint import BinlogPosition
from connectors.database import column_types, read_table
from schemas import ChangeEvent
from schemas.values import binlog_column_types, binlog_row_converter
from tests.support.services import MySQLService
from tests.support.type_matrix import (
    MARIADB_ONLY,
    MATRIX,
    TIME_MAX,
    admin_settings,
    binlog_stream,
    connection_settings,
    time_text,
)

pytestmark = pytest.mark.integration

COVERED = (
    "TINYINT",
    "BOOL",
    "SMALLINT",
    "MEDIUMINT",
    "INT",
    "BIGINT",
    "DECIMAL",
    "FLOAT",
    "DOUBLE",
    "DATE",
    "DATETIME",
    "TIMESTAMP",
    "YEAR",
    "CHAR",
    "VARCHAR",
    "BINARY",
    "VARBINARY",
    "TINYTEXT",
    "TEXT",
    "MEDIUMTEXT",
    "LONGTEXT",
    "TINYBLOB",
    "BLOB",
    "MEDIUMBLOB",
    "LONGBLOB",
    "ENUM",
    "SET",
    "BIT",
    "TIME",
    "UUID",
    "INET4",
    "INET6",
)
# Temporal values a server in a lenient sql_mode stores, which pymysqlreplication reads as None.
EXTRA: list[tuple[str, str, list[str]]] = [
    ("zd", "DATE", ["'0000-00-00'", "'2024-00-10'", "'2024-01-00'", "NULL", "'0001-01-01'"]),
    (
        "zdt",
        "DATETIME(2)",
        [
            "'0000-00-00 00:00:00'",
            "'2024-02-30 10:00:00.5'",
            "'2024-00-01 00:00:00'",
            "NULL",
            "'0001-01-01 0:0:0.01'",
        ],
    ),
    (
        "zts",
        "TIMESTAMP(4) NULL",
        ["'0000-00-00 00:00:00'", "'1970-01-01 00:00:01.0001'", "NULL", "NULL", "NULL"],
    ),
    (
        "dt1",
        "DATETIME(1)",
        ["'2024-01-01 00:00:00.1'", "'2024-01-01 00:00:00.9'", "'2024-01-01'", "NULL", "NULL"],
    ),
    (
        "dt5",
        "DATETIME(5)",
        ["'2024-01-01 00:00:00.00001'", "'2024-01-01 23:59:59.99999'", "NULL", "NULL", "NULL"],
    ),
    ("en2", "ENUM('é','b')", ["'é'", "'b'", "''", "NULL", "'b'"]),
]


def covered(sql_type: str) -> bool:
    base = sql_type.split("(")[0].split()[0].upper()
    return base in COVERED


def columns_of(mariadb: bool) -> list[tuple[str, str, list[str]]]:
    matrix = MATRIX + (MARIADB_ONLY if mariadb else [])
    return [c for c in matrix if covered(c[1])] + EXTRA


@pytest.fixture
def database(mysql_service: MySQLService) -> Iterator[tuple[MySQLService, str, bool]]:
    name = f"freshkey_rowdecode_{uuid.uuid4().hex[:10]}"
    with mysql_service.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
        cur.execute(f"CREATE DATABASE {name}")
    try:
        yield mysql_service, name, mariadb
    finally:
        with mysql_service.connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")


def run(mysql: MySQLService, *statements: str, args: list[tuple[Any, ...]] | None = None) -> tuple[str, int]:
    """Run ``statements`` in a lenient sql_mode (zero dates are stored); the binlog position before."""
    conn = pymysql.connect(
        **connection_settings(mysql),
        autocommit=True,
        charset="utf8mb4",
        init_command="SET sql_mode = 'ALLOW_INVALID_DATES', time_zone = '+00:00'",
    )
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            file, pos = cur.fetchone()[:2]
            for index, statement in enumerate(statements):
                cur.execute(statement, args[index] if args else None)
    finally:
        conn.close()
    return str(file), int(pos)


def compare(mysql: MySQLService, database: str, table: str, start: tuple[str, int]) -> dict[str, int]:
    """Decode every rows event of ``database.table`` from ``start`` both ways and compare; counts."""
    refine = column_types(admin_settings(mysql), database, table)
    counts = {"decoded": 0, "handed back": 0, "rows": 0}
    stream = binlog_stream(mysql, start, database, table)
    try:
        for event in stream:
            types = binlog_column_types(event.columns, refine)
            update = isinstance(event, UpdateRowsEvent)
            fast = decode_rows(row_decoder(event.columns, types), event, update)
            convert = binlog_row_converter(types)
            slow = [
                {
                    name: convert(row[name], row.get(name.replace("values", "none_sources")))
                    for name in (("before_values", "after_values") if update else ("values",))
                }
                for row in event.rows
            ]
            if fast is None:
                counts["handed back"] += 1
                continue
            counts["decoded"] += 1
            counts["rows"] += len(fast)
            assert len(fast) == len(slow)
            for mine, theirs in zip(fast, slow, strict=True):
                assert mine == theirs
                for image in mine:  # same JSON types too (1 == 1.0 == True in Python)
                    assert [type(v) for v in mine[image].values()] == [
                        type(v) for v in theirs[image].values()
                    ]
    finally:
        stream.close()
    return counts


def test_every_covered_type_decodes_as_pymysqlreplication_maps_it(
    database: tuple[MySQLService, str, bool],
) -> None:
    mysql, name, mariadb = database
    columns = columns_of(mariadb)
    definition = ", ".join(f"`{c}` {t}" for c, t, _ in columns)
    run(mysql, f"CREATE TABLE {name}.t (id INT PRIMARY KEY, {definition}) DEFAULT CHARSET=utf8mb4")
    rows = len(columns[0][2])
    inserts = [
        f"INSERT INTO {name}.t VALUES ({r + 1}, {', '.join(v[r] for _, _, v in columns)})"
        for r in range(rows)
    ]
    many = ", ".join(f"({r + 100}, {', '.join(v[r % rows] for _, _, v in columns)})" for r in range(300))
    updates = [
        f"UPDATE {name}.t SET {', '.join(f'`{c}` = {v[(r + 1) % rows]}' for c, _, v in columns)} "
        f"WHERE id = {r + 1}"
        for r in range(rows)
    ]
    start = run(
        mysql,
        *inserts,
        f"INSERT INTO {name}.t VALUES {many}",  # one event of many rows
        *updates,
        f"UPDATE {name}.t SET id = id + 1000 WHERE id >= 100",  # a key change in a multi-row update
        f"DELETE FROM {name}.t",
    )
    counts = compare(mysql, name, "t", start)
    assert counts["handed back"] == 0, counts
    assert counts["rows"] >= 2 * rows + 300 + 300 + 305, counts


@st.composite
def random_row(draw: st.DrawFn) -> tuple[Any, ...]:
    text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=300)
    return (
        draw(st.integers(-(2**63), 2**63 - 1)),
        draw(st.integers(-(2**23), 2**23 - 1)),
        draw(st.integers(0, 2**24 - 1)),
        draw(st.floats(allow_nan=False, allow_infinity=False)),
        draw(st.floats(width=32, allow_nan=False, allow_infinity=False)),
        str(draw(st.datetimes(dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31)))),
        str(draw(st.datetimes(dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31)))),
        str(draw(st.datetimes(dt.datetime(1970, 1, 2), dt.datetime(2038, 1, 18)))),
        str(draw(st.dates(dt.date(1000, 1, 1), dt.date(9999, 12, 31)))),
        draw(text),
        draw(text),
        draw(st.binary(max_size=300)),
        draw(st.one_of(st.none(), st.sampled_from(["x", "y", "zz"]))),
        draw(st.integers(1901, 2155)),
        str(Decimal(draw(st.integers(-(10**30) + 1, 10**30 - 1))).scaleb(-10)),
        str(Decimal(draw(st.integers(-9999, 9999))).scaleb(-4)),
        time_text(draw(st.integers(-TIME_MAX, TIME_MAX)), 6),
        time_text(draw(st.integers(-TIME_MAX, TIME_MAX)), 1),
        draw(st.integers(0, 2**10 - 1)),
        draw(st.integers(0, 2**64 - 1)),
        ",".join(draw(st.sets(st.sampled_from(["a", "b", "c", "é"])))),
    )


RANDOM_COLUMNS = (
    "bi BIGINT, mi MEDIUMINT, miu MEDIUMINT UNSIGNED, d DOUBLE, f FLOAT, dt6 DATETIME(6), dt3 DATETIME(3), "
    "ts TIMESTAMP(6) NULL, da DATE, vc VARCHAR(300), tx TEXT, bl BLOB, en ENUM('x','y','zz'), yr YEAR, "
    "de DECIMAL(30,10), df DECIMAL(4,4), t6 TIME(6), t1 TIME(1), b10 BIT(10), b64 BIT(64), "
    "st SET('a','b','c','é')"
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(random_row(), min_size=1, max_size=20))
def test_random_rows_decode_alike(
    database: tuple[MySQLService, str, bool], rows: list[tuple[Any, ...]]
) -> None:
    mysql, name, _ = database
    table = f"r{uuid.uuid4().hex[:8]}"
    run(mysql, f"CREATE TABLE {name}.{table} (id INT PRIMARY KEY, {RANDOM_COLUMNS}) DEFAULT CHARSET=utf8mb4")
    marks = ", ".join(["%s"] * 22)
    start = run(
        mysql,
        *[f"INSERT INTO {name}.{table} VALUES ({marks})" for _ in rows],
        f"DELETE FROM {name}.{table}",
        args=[(index, *row) for index, row in enumerate(rows)] + [()],
    )
    counts = compare(mysql, name, table, start)
    assert counts["handed back"] == 0 and counts["rows"] == 2 * len(rows), counts


def test_what_it_does_not_cover_is_handed_back_and_the_source_reads_it_alike(
    database: tuple[MySQLService, str, bool],
) -> None:
    """A GEOMETRY column, or a partial row image, is pymysqlreplication's to read: the decoder hands the
    event back (None), and the source's changes are the same with and without the decoder."""
    mysql, name, _ = database
    run(
        mysql,
        f"CREATE TABLE {name}.dec (id INT PRIMARY KEY, spot POINT, at DATETIME(6))",
        f"CREATE TABLE {name}.fast (id INT PRIMARY KEY, v VARCHAR(20), at DATETIME(6), n BIGINT)",
    )
    start = run(
        mysql,
        f"INSERT INTO {name}.dec VALUES (1, ST_GeomFromText('POINT(1 2)'), '2024-01-01 00:00:00.5'), "
        "(2, NULL, NULL)",
        f"INSERT INTO {name}.fast VALUES (1, 'é', '2024-01-01 00:00:00.5', -1), (2, NULL, NULL, NULL)",
        "SET SESSION binlog_row_image = 'MINIMAL'",
        f"UPDATE {name}.fast SET v = 'x' WHERE id = 1",
        "SET SESSION binlog_row_image = 'FULL'",
        f"UPDATE {name}.fast SET v = 'y' WHERE id = 2",
    )
    assert compare(mysql, name, "dec", start) == {"decoded": 0, "handed back": 1, "rows": 0}
    counts = compare(mysql, name, "fast", start)
    assert counts == {"decoded": 2, "handed back": 1, "rows": 3}, counts

    def changes(fast_rows: bool) -> list[tuple[Any, ...]]:
        source = BinlogSource(
            admin_settings(mysql),
            [(name, "dec"), (name, "fast")],
            start=BinlogPosition(*start),
            blocking=False,
            fast_rows=fast_rows,
        )
        try:
            return [
                (e.source.table, e.op, e.key, e.before, e.after, e.version)
                for e in source
                if isinstance(e, ChangeEvent)
            ]
        finally:
            source.close()

    assert changes(True) == changes(False)
    assert len(changes(True)) == 6


def test_a_date_that_is_no_calendar_day_is_none_as_a_direct_read_maps_it(
    database: tuple[MySQLService, str, bool],
) -> None:
    """``2024-02-30`` (stored under ALLOW_INVALID_DATES): pymysqlreplication raises on the whole event,
    which stopped the connector there; the decoder gives None, as a direct read of the row maps it."""
    mysql, name, _ = database
    run(mysql, f"CREATE TABLE {name}.d (id INT PRIMARY KEY, da DATE, n INT)")
    start = run(mysql, f"INSERT INTO {name}.d VALUES (1, '2024-02-30', 1), (2, '2024-02-28', 2)")
    stream = binlog_stream(mysql, start, name, "d")
    try:
        (event,) = list(stream)
        types = binlog_column_types(event.columns, column_types(admin_settings(mysql), name, "d"))
        fast = decode_rows(row_decoder(event.columns, types), event, False)
        with pytest.raises(ValueError, match="day is out of range"):
            event.rows  # noqa: B018 - pymysqlreplication decodes on access
    finally:
        stream.close()
    read = {row["id"]: row for row in read_table(admin_settings(mysql), name, "d")}
    assert fast == [{"values": read[1]}, {"values": read[2]}]
    assert read[1]["da"] is None and read[2]["da"] == "2024-02-28"

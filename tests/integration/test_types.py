"""Every MySQL/MariaDB column type, cached exactly as a direct read of the row maps it (issue 10, part 2).

A table with a column of every type gets rows of edge values (min, max, zero, negative fractional TIME,
zero bytes, empty SET, NULL, utf8mb4 and 4-byte emoji, a large BLOB), which are written, updated and
deleted through the real connector and worker; after each step every cached ``d`` must equal the
direct-read mapping of its row byte for byte, and ``freshkey verify`` must find nothing stale. A
hypothesis test round-trips random values per type through the real server (binlog vs read), and a
last test shows that the same rows mapped by Python type (the mapping before issue 10) differ, i.e.
that the check can fail.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from connectors.database import column_types, read_table
from connectors.settings import MySQLSettings
from schemas.codec import encode_value
from schemas.values import binlog_column_types, binlog_row_to_json, row_to_json
from tests.conftest import MySQLService
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

ONES_64 = "b'" + "1" * 64 + "'"
TOP_BIT_64 = "b'1" + "0" * 63 + "'"

# (column, type, values of rows 1..5): 1 minimum / negative edges, 2 maximum, 3 zero / empty, 4 NULL,
# 5 fractions, utf8mb4 and large values. SQL literals or expressions.
MATRIX: list[tuple[str, str, list[str]]] = [
    ("ti", "TINYINT", ["-128", "127", "0", "NULL", "-1"]),
    ("tiu", "TINYINT UNSIGNED", ["0", "255", "0", "NULL", "1"]),
    ("bo", "BOOL", ["0", "1", "0", "NULL", "1"]),
    ("si", "SMALLINT", ["-32768", "32767", "0", "NULL", "-2"]),
    ("siu", "SMALLINT UNSIGNED", ["0", "65535", "0", "NULL", "2"]),
    ("mi", "MEDIUMINT", ["-8388608", "8388607", "0", "NULL", "-3"]),
    ("miu", "MEDIUMINT UNSIGNED", ["0", "16777215", "0", "NULL", "3"]),
    ("i", "INT", ["-2147483648", "2147483647", "0", "NULL", "-4"]),
    ("iu", "INT UNSIGNED", ["0", "4294967295", "0", "NULL", "4"]),
    ("bi", "BIGINT", ["-9223372036854775808", "9223372036854775807", "0", "NULL", "-5"]),
    ("biu", "BIGINT UNSIGNED", ["0", "18446744073709551615", "0", "NULL", "5"]),
    ("de", "DECIMAL(10,2)", ["-99999999.99", "99999999.99", "0", "NULL", "0.01"]),
    ("dz", "DECIMAL(5,0)", ["-99999", "99999", "0", "NULL", "-1"]),
    (
        "dw",
        "DECIMAL(65,30)",
        ["-" + "9" * 35 + "." + "9" * 30, "9" * 35 + "." + "9" * 30, "0", "NULL", "1e-30"],
    ),
    ("f", "FLOAT", ["-3.4e38", "3.4e38", "0", "NULL", "16777217"]),
    ("ft", "FLOAT", ["-1.17549435e-38", "1.4e-45", "-0.0", "NULL", "0.1"]),
    ("fm", "FLOAT(7,2)", ["-99999.99", "99999.99", "0", "NULL", "3.14"]),
    (
        "d",
        "DOUBLE",
        ["-1.7976931348623157e308", "1.7976931348623157e308", "0", "NULL", "0.30000000000000004"],
    ),
    ("dm", "DOUBLE", ["-5e-324", "2.2250738585072014e-308", "0", "NULL", "123456789.12345679"]),
    ("b1", "BIT(1)", ["b'0'", "b'1'", "b'0'", "NULL", "b'1'"]),
    ("b10", "BIT(10)", ["b'0'", "b'1111111111'", "b'0'", "NULL", "b'0000000101'"]),
    ("b64", "BIT(64)", ["b'0'", ONES_64, "b'0'", "NULL", TOP_BIT_64]),
    ("dt", "DATE", ["'1000-01-01'", "'9999-12-31'", "'2024-02-29'", "NULL", "'1970-01-01'"]),
    (
        "dtm",
        "DATETIME",
        [
            "'1000-01-01 00:00:00'",
            "'9999-12-31 23:59:59'",
            "'2024-02-29 12:00:00'",
            "NULL",
            "'1970-01-01 00:00:00'",
        ],
    ),
    (
        "dtm3",
        "DATETIME(3)",
        [
            "'1000-01-01 00:00:00.000'",
            "'9999-12-31 23:59:59.999'",
            "'2024-01-01 00:00:00.001'",
            "NULL",
            "'2024-01-01 00:00:00.5'",
        ],
    ),
    (
        "dtm6",
        "DATETIME(6)",
        [
            "'1000-01-01 00:00:00.000000'",
            "'9999-12-31 23:59:59.999999'",
            "'2024-01-01 00:00:00.000001'",
            "NULL",
            "'1999-12-31 23:59:59.5'",
        ],
    ),
    (
        "ts",
        "TIMESTAMP NULL",
        [
            "'1970-01-01 00:00:01'",
            "'2038-01-19 03:14:07'",
            "'2024-06-01 12:00:00'",
            "NULL",
            "'2000-02-29 00:00:00'",
        ],
    ),
    (
        "ts6",
        "TIMESTAMP(6) NULL",
        [
            "'1970-01-01 00:00:01.000000'",
            "'2038-01-19 03:14:07.999999'",
            "'2024-06-01 12:00:00.123456'",
            "NULL",
            "'2000-02-29 00:00:00.5'",
        ],
    ),
    ("tm", "TIME", ["'-838:59:59'", "'838:59:59'", "'00:00:00'", "NULL", "'-00:00:01'"]),
    ("tm1", "TIME(1)", ["'-838:59:59.9'", "'838:59:59.9'", "'-00:00:00.1'", "NULL", "'12:00:00.5'"]),
    ("tm3", "TIME(3)", ["'-00:00:01.001'", "'838:59:59.999'", "'00:00:00.000'", "NULL", "'-12:00:00.5'"]),
    (
        "tm6",
        "TIME(6)",
        ["'-838:59:59.000000'", "'838:59:59.000000'", "'-00:00:00.000001'", "NULL", "'-01:59:59.999999'"],
    ),
    ("yr", "YEAR", ["0", "2155", "1901", "NULL", "1999"]),
    ("ch", "CHAR(10)", ["''", "'abcdefghij'", "'x  '", "NULL", "'é😀'"]),
    ("vc", "VARCHAR(255)", ["''", "REPEAT('z', 255)", "'trailing  '", "NULL", "'😀 utf8mb4 é 中文'"]),
    ("l1", "VARCHAR(10) CHARACTER SET latin1", ["''", "'café'", "' '", "NULL", "'ÿ'"]),
    ("bn", "BINARY(4)", ["x'00000000'", "x'ffffffff'", "x''", "NULL", "x'01'"]),
    ("vb", "VARBINARY(16)", ["x''", "x'ffffffffffffffffffffffffffffffff'", "x'0000'", "NULL", "x'00ff'"]),
    ("tt", "TINYTEXT", ["''", "REPEAT('t', 255)", "''", "NULL", "'😀'"]),
    ("tx", "TEXT", ["''", "'text'", "''", "NULL", "'\\n\\t\"quoted\"'"]),
    ("mt", "MEDIUMTEXT", ["''", "'medium'", "''", "NULL", "'x'"]),
    ("lt", "LONGTEXT", ["''", "'long'", "''", "NULL", "REPEAT('😀', 40000)"]),
    ("tb", "TINYBLOB", ["x''", "x'00'", "x''", "NULL", "x'ff00'"]),
    ("bl", "BLOB", ["x''", "x'0001'", "x''", "NULL", "x'7f'"]),
    ("mb", "MEDIUMBLOB", ["x''", "x'ff'", "x''", "NULL", "x'00'"]),
    ("lb", "LONGBLOB", ["x''", "x'00'", "x''", "NULL", "REPEAT(x'00ff', 60000)"]),
    ("en", "ENUM('a','b','c')", ["'a'", "'c'", "'b'", "NULL", "'a'"]),
    ("st", "SET('x','y','z')", ["''", "'x,y,z'", "'z,x'", "NULL", "'y'"]),
    (
        "js",
        "JSON",
        [
            "'{}'",
            "'[1, -2.5, 1e300, \"s\", null, true, false]'",
            "'\"\"'",
            "NULL",
            '\'{"a": {"😀": [0]}, "b": 12345678901234567890}\'',
        ],
    ),
    (
        "g",
        "POINT",
        [
            "ST_GeomFromText('POINT(0 0)')",
            "ST_GeomFromText('POINT(-180 90)')",
            "ST_GeomFromText('POINT(1.5 2.5)')",
            "NULL",
            "ST_GeomFromText('POINT(1 2)')",
        ],
    ),
]
MARIADB_ONLY: list[tuple[str, str, list[str]]] = [
    (
        "u",
        "UUID",
        [
            "'00000000-0000-0000-0000-000000000000'",
            "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
            "'123e4567-e89b-12d3-a456-426655440000'",
            "NULL",
            "'aabbccdd-eeff-4011-8233-445566778899'",
        ],
    ),
    (
        "i6",
        "INET6",
        [
            "'::'",
            "'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'",
            "'::ffff:1.2.3.4'",
            "NULL",
            "'2001:db8::ff00:42:8329'",
        ],
    ),
    ("i4", "INET4", ["'0.0.0.0'", "'255.255.255.255'", "'192.168.0.1'", "NULL", "'10.0.0.1'"]),
]
ROWS = 5


def _is_mariadb(p: Pipeline) -> bool:
    return "mariadb" in str(p.sql("SELECT VERSION()")[0][0]).lower()


def _matrix(p: Pipeline) -> list[tuple[str, str, list[str]]]:
    return MATRIX + (MARIADB_ONLY if _is_mariadb(p) else [])


def _settings(mysql: MySQLService) -> MySQLSettings:
    return MySQLSettings(
        host=mysql.host,
        port=mysql.port,
        user=mysql.admin_user,
        password=mysql.admin_password,
    )


def _create(p: Pipeline, matrix: list[tuple[str, str, list[str]]]) -> None:
    columns = ",\n  ".join(f"`{name}` {sql_type}" for name, sql_type, _ in matrix)
    p.sql(f"DROP TABLE {p.database}.assets")
    p.sql(
        f"CREATE TABLE {p.database}.assets (\n  id INT PRIMARY KEY,\n  {columns}\n) DEFAULT CHARSET=utf8mb4"
    )


def _row_sql(matrix: list[tuple[str, str, list[str]]], row: int) -> str:
    return ", ".join(values[row] for _, _, values in matrix)


def _read(p: Pipeline) -> dict[int, dict[str, Any]]:
    return {int(row["id"]): row for row in read_table(_settings(p.mysql), p.database, "assets")}


def _mismatches(p: Pipeline, deleted: set[int]) -> list[str]:
    """Every way the cache differs from the direct-read mapping (empty when equal byte for byte)."""
    problems: list[str] = []
    for row_id, row in _read(p).items():
        entry = p.entry(row_id)
        expected = encode_value(row)
        if entry is None or entry.value is None:
            problems.append(f"row {row_id}: no entry")
        elif entry.value != expected:
            cached = json.loads(entry.value)
            differing = {c: (cached.get(c), row[c]) for c in row if cached.get(c) != row[c]}
            problems.append(f"row {row_id}: cached != read for {differing or 'bytes'}")
    for row_id in deleted:
        entry = p.entry(row_id)
        if entry is None or not entry.tombstone:
            problems.append(f"row {row_id}: deleted but not a tombstone ({entry})")
    return problems


def _wait_equal(p: Pipeline, deleted: set[int], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    problems = _mismatches(p, deleted)
    while problems:
        p.check_alive()
        if time.monotonic() > deadline:
            raise AssertionError("cache differs from the direct read:\n" + "\n".join(problems) + p.logs())
        time.sleep(0.2)
        problems = _mismatches(p, deleted)


def test_every_type_is_cached_exactly_as_a_direct_read_maps_it(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline(value_columns=False)
    matrix = _matrix(p)
    _create(p, matrix)
    p.start("connector")
    p.start("worker")

    for row in range(ROWS):
        p.sql(f"INSERT INTO {p.database}.assets VALUES ({row + 1}, {_row_sql(matrix, row)})")
    _wait_equal(p, set())
    written = _read(p)

    # Each row takes the next row's values (row 5 takes row 1's): every column changes in every row.
    for row in range(ROWS):
        source = (row + 1) % ROWS
        assignments = ", ".join(f"`{name}` = {values[source]}" for name, _, values in matrix)
        p.sql(f"UPDATE {p.database}.assets SET {assignments} WHERE id = {row + 1}")
    p.sql(f"DELETE FROM {p.database}.assets WHERE id = 3")
    _wait_equal(p, {3})
    report = p.verify()
    assert report.stale == 0 and report.missing == 0, report

    # The examples, as the cache holds them now (row 1 holds row 2's values, row 2 row 3's...).
    first, second = written[1], written[2]
    assert first["b64"] == 0 and second["b64"] == 2**64 - 1
    assert first["st"] == [] and written[3]["st"] == ["x", "z"]
    assert first["yr"] == 0
    assert written[3]["tm6"] == "-00:00:00.000001" and first["tm3"] == "-00:00:01.001000"
    assert first["bn"] == "AAAAAA==" and written[3]["bn"] == "AAAAAA=="
    assert first["f"] == -3.4e38 and written[5]["f"] == 16777216.0
    assert written[5]["js"] == {"a": {"😀": [0]}, "b": 12345678901234567890}
    assert all(value is None for column, value in written[4].items() if column != "id")
    _print_matrix(matrix, written)


def _print_matrix(matrix: list[tuple[str, str, list[str]]], rows: dict[int, dict[str, Any]]) -> None:
    """The type matrix for the record (pytest -s): column type and its cached form in each row."""
    print("\ntype | row 1 (min) | row 2 (max) | row 3 (zero/empty) | row 4 | row 5")
    for name, sql_type, _ in matrix:
        forms = [json.dumps(rows[i][name], ensure_ascii=False)[:48] for i in range(1, ROWS + 1)]
        print(f"{sql_type} | " + " | ".join(forms))


# -- random values per type, through the real server -------------------------------------------------------

ROUND_TRIP = [
    ("b64", "BIT(64)"),
    ("b5", "BIT(5)"),
    ("st", "SET('a','b','é','😀')"),
    ("en", "ENUM('a','b','é')"),
    ("yr", "YEAR"),
    ("tm", "TIME(6)"),
    ("tm2", "TIME(2)"),
    ("bn", "BINARY(8)"),
    ("vb", "VARBINARY(64)"),
    ("f", "FLOAT"),
    ("d", "DOUBLE"),
    ("de", "DECIMAL(30,10)"),
    ("dtm", "DATETIME(6)"),
    ("ts", "TIMESTAMP(6) NULL"),
    ("dt", "DATE"),
    ("vc", "VARCHAR(100)"),
    ("js", "JSON"),
    ("bi", "BIGINT UNSIGNED"),
]
_EXACT = decimal.Context(prec=100)
_TIME_MAX = (838 * 3600 + 59 * 60 + 59) * 1_000_000 + 999_999
_TEXT = st.text(st.characters(blacklist_categories=["Cs", "Cc"], blacklist_characters="\x00"), max_size=40)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_TEXT, children, max_size=3),
    max_leaves=8,
)


def _time_text(micros: int, fsp: int) -> str:
    step = 10 ** (6 - fsp)
    magnitude = abs(micros) // step * step
    seconds, frac = divmod(magnitude, 1_000_000)
    sign = "-" if micros < 0 else ""
    return f"{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{frac:06d}"


@st.composite
def _random_row(draw: st.DrawFn) -> dict[str, Any]:
    single = draw(st.floats(width=32, allow_nan=False, allow_infinity=False))
    return {
        "b64": draw(st.integers(0, 2**64 - 1)),
        "b5": draw(st.integers(0, 31)),
        "st": ",".join(sorted(draw(st.sets(st.sampled_from(["a", "b", "é", "😀"]))))),
        "en": draw(st.sampled_from(["a", "b", "é"])),
        "yr": draw(st.sampled_from([0, 1901, 2000, 2155, *range(1950, 1960)])),
        "tm": _time_text(draw(st.integers(-_TIME_MAX, _TIME_MAX)), 6),
        "tm2": _time_text(draw(st.integers(-_TIME_MAX, _TIME_MAX)), 2),
        "bn": draw(st.binary(max_size=8)),
        "vb": draw(st.binary(max_size=64)),
        "f": repr(struct.unpack("<f", struct.pack("<f", single))[0]),
        "d": repr(draw(st.floats(allow_nan=False, allow_infinity=False))),
        "de": str(Decimal(draw(st.integers(-(10**30) + 1, 10**30 - 1))).scaleb(-10, _EXACT)),
        "dtm": str(draw(st.datetimes(dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31)))),
        "ts": str(draw(st.datetimes(dt.datetime(1970, 1, 1, 0, 0, 1), dt.datetime(2038, 1, 19)))),
        "dt": str(draw(st.dates(dt.date(1000, 1, 1), dt.date(9999, 12, 31)))),
        "vc": draw(_TEXT),
        "js": json.dumps(draw(_JSON)),
        "bi": draw(st.integers(0, 2**64 - 1)),
    }


@pytest.fixture
def round_trip_table(mysql_service: MySQLService) -> Iterator[tuple[MySQLService, str]]:
    database = f"freshkey_types_{uuid.uuid4().hex[:10]}"
    with mysql_service.connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {database}")
        columns = ", ".join(f"`{name}` {sql_type}" for name, sql_type in ROUND_TRIP)
        cur.execute(f"CREATE TABLE {database}.rt (id INT PRIMARY KEY, {columns}) DEFAULT CHARSET=utf8mb4")
    try:
        yield mysql_service, database
    finally:
        with mysql_service.connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {database}")


def _connection(mysql: MySQLService) -> dict[str, Any]:
    return {
        "host": mysql.host,
        "port": mysql.port,
        "user": mysql.admin_user,
        "password": mysql.admin_password,
    }


def _binlog_rows(mysql: MySQLService, database: str, start: tuple[str, int]) -> list[dict[str, Any]]:
    """The after images of the rows events on ``database.rt`` from ``start`` to the binlog's end."""
    stream = BinLogStreamReader(
        connection_settings=_connection(mysql),
        server_id=20_000 + uuid.uuid4().int % 10_000,
        log_file=start[0],
        log_pos=start[1],
        resume_stream=True,
        blocking=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        only_schemas=[database],
        only_tables=["rt"],
    )
    refine = column_types(_settings(mysql), database, "rt")
    rows: list[dict[str, Any]] = []
    try:
        for event in stream:
            types = binlog_column_types(event.columns, refine)
            rows.extend(binlog_row_to_json(r["values"], types, r.get("none_sources")) for r in event.rows)
    finally:
        stream.close()
    return rows


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_random_row(), min_size=1, max_size=8))
def test_random_values_read_back_alike_from_the_binlog_and_a_select(
    round_trip_table: tuple[MySQLService, str], rows: list[dict[str, Any]]
) -> None:
    mysql, database = round_trip_table
    conn = pymysql.connect(
        **_connection(mysql),
        autocommit=True,
        charset="utf8mb4",
        init_command="SET time_zone = '+00:00'",
    )
    try:
        with conn.cursor() as cur:
            cur.execute(f"DELETE FROM {database}.rt")
            cur.execute("SHOW MASTER STATUS")
            file, pos = cur.fetchone()[:2]
            names = [name for name, _ in ROUND_TRIP]
            placeholders = ", ".join(["%s"] * (len(names) + 1))
            for index, row in enumerate(rows):
                cur.execute(
                    f"INSERT INTO {database}.rt (id, {', '.join(names)}) VALUES ({placeholders})",
                    (index, *[row[n] for n in names]),
                )
    finally:
        conn.close()
    from_binlog = {r["id"]: r for r in _binlog_rows(mysql, database, (str(file), int(pos)))}
    from_read = {r["id"]: r for r in read_table(_settings(mysql), database, "rt")}
    assert from_binlog.keys() == from_read.keys() == set(range(len(rows)))
    for row_id, read in from_read.items():
        binlog = from_binlog[row_id]
        assert encode_value(binlog) == encode_value(read), (rows[row_id], binlog, read)


def test_mapped_by_python_type_the_same_rows_differ(
    round_trip_table: tuple[MySQLService, str],
) -> None:
    """Without column types (the mapping before issue 10) the binlog and a read disagree: the check above
    can fail."""
    mysql, database = round_trip_table
    with mysql.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
        cur.execute(
            f"INSERT INTO {database}.rt (id, b64, st, yr, tm, bn, f) VALUES "
            "(1, b'1', '', 0, '-00:00:00.000001', x'00', -3.4e38)"
        )
    stream = BinLogStreamReader(
        connection_settings=_connection(mysql),
        server_id=30_000 + uuid.uuid4().int % 10_000,
        log_file=str(file),
        log_pos=int(pos),
        resume_stream=True,
        blocking=False,
        only_events=[WriteRowsEvent],
        only_schemas=[database],
    )
    try:
        (binlog,) = [row_to_json(r["values"]) for event in stream for r in event.rows]
    finally:
        stream.close()
    conn = pymysql.connect(**_connection(mysql), charset="utf8mb4")
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(f"SELECT * FROM {database}.rt WHERE id = 1")
            read = row_to_json(cur.fetchone())
    finally:
        conn.close()
    differing = sorted(c for c in ("b64", "st", "yr", "tm", "bn", "f") if binlog[c] != read[c])
    assert differing == ["b64", "bn", "f", "st", "tm", "yr"], (binlog, read)

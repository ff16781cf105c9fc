"""A column of every MySQL/MariaDB type with rows of edge values, and the check that the cache holds each row
exactly as a direct read maps it. Shared by the type matrix test (tests/integration/test_types.py) and the
Debezium test that feeds the same rows through Debezium's encoding (tests/integration/test_debezium.py).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from connectors.database import read_table
from connectors.settings import MySQLSettings
from schemas.codec import encode_value
from tests.support.pipeline import Pipeline
from tests.support.services import MySQLService

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
TIME_MAX = (838 * 3600 + 59 * 60 + 59) * 1_000_000 + 999_999
"""The largest TIME magnitude, in microseconds (838:59:59.999999)."""


def time_text(micros: int, fsp: int) -> str:
    """A TIME literal of ``micros`` microseconds, truncated to ``fsp`` fractional digits."""
    step = 10 ** (6 - fsp)
    magnitude = abs(micros) // step * step
    seconds, fraction = divmod(magnitude, 1_000_000)
    sign = "-" if micros < 0 else ""
    return f"{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{fraction:06d}"


def is_mariadb(p: Pipeline) -> bool:
    """Whether the pipeline's database server is MariaDB (it has more types)."""
    return "mariadb" in str(p.sql("SELECT VERSION()")[0][0]).lower()


def matrix_of(p: Pipeline) -> list[tuple[str, str, list[str]]]:
    """:data:`MATRIX`, with :data:`MARIADB_ONLY` on MariaDB."""
    return MATRIX + (MARIADB_ONLY if is_mariadb(p) else [])


def admin_settings(mysql: MySQLService) -> MySQLSettings:
    """freshkey's settings for the admin account of the test database."""
    return MySQLSettings(
        host=mysql.host,
        port=mysql.port,
        user=mysql.admin_user,
        password=mysql.admin_password,
    )


def create_table(p: Pipeline, matrix: list[tuple[str, str, list[str]]]) -> None:
    """Replace the pipeline's ``assets`` table by one with a column of every type of ``matrix``."""
    columns = ",\n  ".join(f"`{name}` {sql_type}" for name, sql_type, _ in matrix)
    p.sql(f"DROP TABLE {p.database}.assets")
    p.sql(
        f"CREATE TABLE {p.database}.assets (\n  id INT PRIMARY KEY,\n  {columns}\n) DEFAULT CHARSET=utf8mb4"
    )


def row_sql(matrix: list[tuple[str, str, list[str]]], row: int) -> str:
    """The SQL values of row ``row`` (0-based) of ``matrix``, comma-separated."""
    return ", ".join(values[row] for _, _, values in matrix)


def insert_rows(p: Pipeline, matrix: list[tuple[str, str, list[str]]]) -> None:
    """Insert rows 1..ROWS of ``matrix`` into ``assets``, one statement each."""
    for row in range(ROWS):
        p.sql(f"INSERT INTO {p.database}.assets VALUES ({row + 1}, {row_sql(matrix, row)})")


def rotate_rows(p: Pipeline, matrix: list[tuple[str, str, list[str]]]) -> None:
    """Each row takes the next row's values (row ROWS takes row 1's): every column changes in every row."""
    for row in range(ROWS):
        source = (row + 1) % ROWS
        assignments = ", ".join(f"`{name}` = {values[source]}" for name, _, values in matrix)
        p.sql(f"UPDATE {p.database}.assets SET {assignments} WHERE id = {row + 1}")


def read_rows(p: Pipeline) -> dict[int, dict[str, Any]]:
    """Every row of ``assets`` by id, mapped as a direct read maps it."""
    return {int(row["id"]): row for row in read_table(admin_settings(p.mysql), p.database, "assets")}


def mismatches(p: Pipeline, deleted: set[int]) -> list[str]:
    """Every way the cache differs from the direct-read mapping (empty when equal byte for byte)."""
    problems: list[str] = []
    for row_id, row in read_rows(p).items():
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


def wait_equal(p: Pipeline, deleted: set[int], timeout: float = 60) -> None:
    """Poll until the cache equals the direct read (``deleted`` rows tombstones); else fail with the
    differences and the logs."""
    deadline = time.monotonic() + timeout
    problems = mismatches(p, deleted)
    while problems:
        p.check_alive()
        if time.monotonic() > deadline:
            raise AssertionError("cache differs from the direct read:\n" + "\n".join(problems) + p.logs())
        time.sleep(0.2)
        problems = mismatches(p, deleted)


def connection_settings(mysql: MySQLService) -> dict[str, Any]:
    """pymysql (and BinLogStreamReader) connection arguments of the admin account."""
    return {
        "host": mysql.host,
        "port": mysql.port,
        "user": mysql.admin_user,
        "password": mysql.admin_password,
    }


def binlog_stream(
    mysql: MySQLService,
    start: tuple[str, int],
    database: str,
    table: str | None = None,
    *,
    writes_only: bool = False,
) -> BinLogStreamReader:
    """The rows events of ``database`` (``table`` only, when given) from ``start`` to the binlog's end, read
    by a replica of a random server id (never blocking; the caller closes it)."""
    return BinLogStreamReader(
        connection_settings=connection_settings(mysql),
        server_id=20_000 + uuid.uuid4().int % 40_000,
        log_file=start[0],
        log_pos=start[1],
        resume_stream=True,
        blocking=False,
        only_events=[WriteRowsEvent] if writes_only else [WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        only_schemas=[database],
        only_tables=[table] if table is not None else None,
    )

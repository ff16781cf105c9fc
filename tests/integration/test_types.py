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
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.database import column_types, read_table
from schemas.codec import encode_value
from schemas.values import binlog_column_types, binlog_row_to_json, row_to_json
from tests.support.pipeline import Pipeline
from tests.support.services import MySQLService
from tests.support.type_matrix import (
    ROWS,
    TIME_MAX,
    admin_settings,
    binlog_stream,
    connection_settings,
    create_table,
    insert_rows,
    matrix_of,
    read_rows,
    rotate_rows,
    time_text,
    wait_equal,
)

pytestmark = pytest.mark.integration


def test_every_type_is_cached_exactly_as_a_direct_read_maps_it(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline(value_columns=False)
    matrix = matrix_of(p)
    create_table(p, matrix)
    p.start("connector")
    p.start("worker")

    insert_rows(p, matrix)
    wait_equal(p, set())
    written = read_rows(p)

    rotate_rows(p, matrix)
    p.sql(f"DELETE FROM {p.database}.assets WHERE id = 3")
    wait_equal(p, {3})
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


@st.composite
def _random_row(draw: st.DrawFn) -> dict[str, Any]:
    single = draw(st.floats(width=32, allow_nan=False, allow_infinity=False))
    return {
        "b64": draw(st.integers(0, 2**64 - 1)),
        "b5": draw(st.integers(0, 31)),
        "st": ",".join(sorted(draw(st.sets(st.sampled_from(["a", "b", "é", "😀"]))))),
        "en": draw(st.sampled_from(["a", "b", "é"])),
        "yr": draw(st.sampled_from([0, 1901, 2000, 2155, *range(1950, 1960)])),
        "tm": time_text(draw(st.integers(-TIME_MAX, TIME_MAX)), 6),
        "tm2": time_text(draw(st.integers(-TIME_MAX, TIME_MAX)), 2),
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


def _binlog_rows(mysql: MySQLService, database: str, start: tuple[str, int]) -> list[dict[str, Any]]:
    """The after images of the rows events on ``database.rt`` from ``start`` to the binlog's end."""
    stream = binlog_stream(mysql, start, database, "rt")
    refine = column_types(admin_settings(mysql), database, "rt")
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
        **connection_settings(mysql),
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
    from_read = {r["id"]: r for r in read_table(admin_settings(mysql), database, "rt")}
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
    stream = binlog_stream(mysql, (str(file), int(pos)), database, writes_only=True)
    try:
        (binlog,) = [row_to_json(r["values"]) for event in stream for r in event.rows]
    finally:
        stream.close()
    conn = pymysql.connect(**connection_settings(mysql), charset="utf8mb4")
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(f"SELECT * FROM {database}.rt WHERE id = 1")
            read = row_to_json(cur.fetchone())
    finally:
        conn.close()
    differing = sorted(c for c in ("b64", "st", "yr", "tm", "bn", "f") if binlog[c] != read[c])
    assert differing == ["b64", "bn", "f", "st", "tm", "yr"], (binlog, read)

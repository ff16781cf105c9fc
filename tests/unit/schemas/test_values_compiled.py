"""schemas.values.compiled and binlog_row_converter: converters chosen once give what the per-value
mapping gives, for every column type and any value (right form, odd form or wrong type).

The reference is the per-value mapping itself (:func:`to_json_value`, :func:`binlog_row_to_json`), whose
rules test_values.py checks against the servers' forms; here every result must be identical to it,
type included (``1`` is not ``True`` nor ``1.0``), and a value it refuses must be refused with the same
error.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.values import (
    EMPTY_SET,
    ColumnType,
    binlog_row_converter,
    binlog_row_to_json,
    to_json_value,
    value_converter,
)

COLUMNS = [
    None,
    ColumnType("tinyint"),
    ColumnType("bigint", unsigned=True),
    ColumnType("decimal", scale=2),
    ColumnType("float"),
    ColumnType("double"),
    ColumnType("bit", length=5),
    ColumnType("date"),
    ColumnType("datetime", scale=6),
    ColumnType("datetime", scale=0),
    ColumnType("timestamp", scale=3),
    ColumnType("time", scale=6),
    ColumnType("year"),
    ColumnType("varchar"),
    ColumnType("longtext"),
    ColumnType("binary", length=4),
    ColumnType("varbinary"),
    ColumnType("blob"),
    ColumnType("string"),
    ColumnType("enum", members=("a", "b")),
    ColumnType("set", members=("a", "b", "c")),
    ColumnType("json"),
    ColumnType("geometry"),
    ColumnType("uuid"),
    ColumnType("inet4"),
    ColumnType("inet6"),
    ColumnType("no such type"),
]

_SCALARS = (
    st.integers(-(2**70), 2**70)
    | st.booleans()
    | st.floats()
    | st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)
    | st.sampled_from(["0", "1", "101", "-12", "12.5", "a,b", "", "{}", "[1, 2]", "2024-02-29", "12:30:00"])
    | st.binary(max_size=20)
    | st.datetimes(dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59))
    | st.datetimes(timezones=st.just(dt.UTC))
    | st.just(dt.datetime(1970, 1, 1))
    | st.dates()
    | st.timedeltas(dt.timedelta(hours=-838), dt.timedelta(hours=838))
    | st.decimals(allow_nan=False, allow_infinity=False, places=3)
    | st.frozensets(st.sampled_from(["a", "b", "c"]))
)
VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3), max_leaves=6)


def outcome(function: Any, *args: Any) -> str:
    """The result's repr (exact: types and float digits), or the error it raised (any: a DECIMAL of a
    float too large for its scale raises decimal.InvalidOperation in both)."""
    try:
        return repr(function(*args))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@given(st.sampled_from(COLUMNS), VALUES)
@settings(max_examples=3000)
def test_value_converter_is_to_json_value(column: ColumnType | None, value: Any) -> None:
    assert outcome(value_converter(column), value) == outcome(to_json_value, value, column)


@given(
    st.lists(st.sampled_from(COLUMNS[1:]), min_size=1, max_size=6),
    st.data(),
)
@settings(max_examples=1500)
def test_binlog_row_converter_is_binlog_row_to_json(columns: list[ColumnType], data: st.DataObject) -> None:
    types = {f"c{i}": column for i, column in enumerate(columns)}
    values = {name: data.draw(st.none() | VALUES, label=name) for name in types}
    values["extra"] = data.draw(st.none() | VALUES, label="extra")  # no type: maps untyped
    reasons = {
        name: data.draw(st.sampled_from([EMPTY_SET, "null", "cols bitmap"]), label=f"reason {name}")
        for name, value in values.items()
        if value is None
    }
    convert = binlog_row_converter(types)
    for none_sources in (reasons, None, {}):
        assert outcome(convert, values, none_sources) == outcome(
            binlog_row_to_json, values, types, none_sources
        )


def test_the_short_paths_are_the_documented_forms() -> None:
    """A few spelled out, so that a change of both paths at once still shows."""
    row = {
        "id": 7,
        "name": "lamp",
        "at": dt.datetime(2024, 1, 2, 3, 4, 5),
        "ts": dt.datetime(1970, 1, 1),
        "day": dt.date(2024, 2, 29),
        "blob": b"\x00\xff",
        "bin": b"\x01",
        "ratio": 0.1,
        "nan": math.nan,
        "price": Decimal("5"),
        "tags": None,
        "negative": dt.timedelta(microseconds=-999_999),
    }
    types = {
        "id": ColumnType("int"),
        "name": ColumnType("varchar"),
        "at": ColumnType("datetime", scale=6),
        "ts": ColumnType("timestamp"),
        "day": ColumnType("date"),
        "blob": ColumnType("blob"),
        "bin": ColumnType("binary", length=3),
        "ratio": ColumnType("double"),
        "nan": ColumnType("double"),
        "price": ColumnType("decimal", scale=2),
        "tags": ColumnType("set", members=("a",)),
        "negative": ColumnType("time", scale=6),
    }
    assert binlog_row_converter(types)(row, {"tags": EMPTY_SET}) == {
        "id": 7,
        "name": "lamp",
        "at": "2024-01-02T03:04:05.000000",
        "ts": None,
        "day": "2024-02-29",
        "blob": "AP8=",
        "bin": "AQAA",
        "ratio": 0.1,
        "nan": "NaN",
        "price": "5.00",
        "tags": [],
        "negative": "-00:00:00.000001",
    }

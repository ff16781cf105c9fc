"""schemas.values: the one conversion from database values to JSON (the README "Values" table)."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import orjson
import pytest

from schemas.values import row_to_json, to_json_value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, True),
        (False, False),
        (0, 0),
        (-42, -42),
        (2**64 - 1, 2**64 - 1),
        (1.5, 1.5),
        (-0.25, -0.25),
        ("text \u00e9", "text \u00e9"),
        ("", ""),
    ],
)
def test_plain_values_are_themselves(value: object, expected: object) -> None:
    result = to_json_value(value)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Decimal("12.50"), "12.50"),
        (Decimal("-0.001"), "-0.001"),
        (Decimal("12345678901234567890.123456789"), "12345678901234567890.123456789"),
        (Decimal("0"), "0"),
    ],
)
def test_decimal_is_an_exact_string(value: Decimal, expected: str) -> None:
    assert to_json_value(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (dt.datetime(2024, 1, 2, 3, 4, 5, 6), "2024-01-02T03:04:05.000006"),
        (dt.datetime(2024, 1, 2, 3, 4, 5), "2024-01-02T03:04:05.000000"),
        (dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC), "2024-01-02T03:04:05.123456+00:00"),
        (dt.datetime(1000, 1, 1), "1000-01-01T00:00:00.000000"),
    ],
)
def test_datetime_is_iso_with_microseconds(value: dt.datetime, expected: str) -> None:
    assert to_json_value(value) == expected


def test_date_is_iso_date() -> None:
    assert to_json_value(dt.date(2024, 2, 29)) == "2024-02-29"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (dt.timedelta(0), "00:00:00.000000"),
        (dt.timedelta(hours=1, minutes=2, seconds=3, microseconds=4), "01:02:03.000004"),
        (dt.timedelta(hours=838, minutes=59, seconds=59), "838:59:59.000000"),
        (dt.timedelta(hours=-1), "-01:00:00.000000"),
        (dt.timedelta(hours=-1, seconds=1), "-00:59:59.000000"),
        (dt.timedelta(microseconds=-1), "-00:00:00.000001"),
        (-dt.timedelta(hours=838, minutes=59, seconds=59), "-838:59:59.000000"),
        (dt.timedelta(days=1, seconds=1), "24:00:01.000000"),
    ],
)
def test_time_is_signed_hh_mm_ss_micro(value: dt.timedelta, expected: str) -> None:
    assert to_json_value(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"", ""),
        (b"\x00\xff", "AP8="),
        (b"hello", "aGVsbG8="),
        (bytearray(b"hello"), "aGVsbG8="),
        (memoryview(b"hello"), "aGVsbG8="),
        (bytes([0xFB, 0xFF]), "+/8="),  # standard alphabet, not URL-safe
    ],
)
def test_bytes_are_standard_base64(value: object, expected: str) -> None:
    assert to_json_value(value) == expected


def test_set_is_a_sorted_list_of_strings() -> None:
    assert to_json_value({"video", "audio", "image"}) == ["audio", "image", "video"]
    assert to_json_value(frozenset({"b", "a"})) == ["a", "b"]
    assert to_json_value(set()) == []


def test_json_column_nested_with_bytes_keys() -> None:
    value = {
        b"name": b"cat",
        b"dims": [224, 224, 3],
        "nested": {b"k": {1: None, "f": 0.5, "t": True}},
        "list": [b"\x01", ("a", Decimal("1.0"))],
    }
    assert to_json_value(value) == {
        "name": "Y2F0",
        "dims": [224, 224, 3],
        "nested": {"k": {"1": None, "f": 0.5, "t": True}},
        "list": ["AQ==", ["a", "1.0"]],
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")],
)
def test_non_finite_float_becomes_string(value: float, expected: str) -> None:
    assert to_json_value(value) == expected


@pytest.mark.parametrize(
    "value", [object(), 1 + 2j, dt.time(12, 0), Exception("x"), [object()], {"k": object()}]
)
def test_unknown_type_raises_type_error(value: object) -> None:
    with pytest.raises(TypeError, match="no JSON form"):
        to_json_value(value)


def test_row_to_json_is_serialisable_and_stable() -> None:
    row = {
        "id": 7,
        "price": Decimal("9.99"),
        "at": dt.datetime(2024, 1, 1, 0, 0, 0, 1),
        "day": dt.date(2024, 1, 1),
        "dur": dt.timedelta(seconds=-90),
        "blob": b"\x00",
        "tags": {"b", "a"},
        "doc": {b"a": [1, 2]},
        "score": math.nan,
        "none": None,
    }
    converted = row_to_json(row)
    assert converted == {
        "id": 7,
        "price": "9.99",
        "at": "2024-01-01T00:00:00.000001",
        "day": "2024-01-01",
        "dur": "-00:01:30.000000",
        "blob": "AA==",
        "tags": ["a", "b"],
        "doc": {"a": [1, 2]},
        "score": "nan",
        "none": None,
    }
    # Valid JSON and a fixed point: converting the JSON form again changes nothing.
    assert orjson.loads(orjson.dumps(converted)) == converted
    assert row_to_json(converted) == converted

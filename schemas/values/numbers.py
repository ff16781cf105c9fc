"""Numeric column types: integers, DECIMAL, FLOAT (as its float32), DOUBLE, BIT and YEAR."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
import struct
from decimal import Decimal

from schemas.values.base import _finite, _wrong
from schemas.values.columns import ColumnType, JsonValue


def _integer(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d+", value.strip()):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _wrong(value, column)


_DECIMAL_CONTEXT = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_UP)


def _decimal(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, Decimal):
        number = value
    elif isinstance(value, bool):
        raise _wrong(value, column)
    elif isinstance(value, int | str):
        try:
            number = Decimal(value)
        except decimal.InvalidOperation:
            raise _wrong(value, column) from None
    elif isinstance(value, float):
        if not math.isfinite(value):
            return _finite(value)
        number = Decimal(repr(value))  # a DECIMAL sent as a double (Debezium decimal.handling.mode=double)
    else:
        raise _wrong(value, column)
    if not number.is_finite():
        raise _wrong(value, column)
    if column.scale is not None:
        # The column's scale, as the server prints it (DECIMAL(10,2) 5 -> "5.00").
        number = number.quantize(Decimal(1).scaleb(-column.scale), context=_DECIMAL_CONTEXT)
    return format(number, "f")


def _as_float(value: object, column: ColumnType) -> float:
    if isinstance(value, bool):
        raise _wrong(value, column)
    if isinstance(value, float | int | Decimal):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise _wrong(value, column) from None
    raise _wrong(value, column)


def float32_json(value: float) -> float | str:
    """The JSON number of a FLOAT value: the shortest decimal that reads back as the same float32.

    ``value`` is the float32 as a double (the binlog) or any double that rounds to it (a printed
    FLOAT); both give the same number, e.g. ``-3.3999999521443642e+38`` and ``-3.4e38`` -> ``-3.4e+38``.
    A value beyond the float32 range is returned as the double it is.
    """
    if not math.isfinite(value):
        return _finite(value)
    try:
        packed = struct.pack("<f", value)
    except OverflowError:  # not a float32 at all: keep what was given
        return value
    single: float = struct.unpack("<f", packed)[0]
    if not math.isfinite(single):
        return value
    # The fewest significant digits that read back as the same float32: 9 always do, and if some count
    # does, every larger one does too (a closer decimal), so a binary search finds it.
    low, high = 1, 9
    while low < high:
        middle = (low + high) // 2
        if _reads_back(f"{single:.{middle}g}", packed):
            high = middle
        else:
            low = middle + 1
    return float(f"{single:.{low}g}")


def _reads_back(text: str, packed: bytes) -> bool:
    try:
        return struct.pack("<f", float(text)) == packed
    except OverflowError:  # rounded up past the largest float32: needs more digits
        return False


def _float(value: object, column: ColumnType) -> JsonValue:
    return float32_json(_as_float(value, column))


def _double(value: object, column: ColumnType) -> JsonValue:
    return _finite(_as_float(value, column))


def _bit(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return int.from_bytes(bytes(value), "big")
    if isinstance(value, str) and set(value) <= {"0", "1"}:  # the binlog reader's bit string
        return int(value, 2) if value else 0
    raise _wrong(value, column)


def _year(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, dt.date):
        year = value.year
    elif isinstance(value, bool):
        raise _wrong(value, column)
    elif isinstance(value, int):
        year = value
    elif isinstance(value, str) and value.strip().isdigit():
        year = int(value)
    else:
        raise _wrong(value, column)
    # YEAR holds 1901..2155 and 0000; the binlog reader (and Debezium) add 1900 to the stored byte, so
    # 0000 arrives as 1900, a year no YEAR column can hold.
    return 0 if year == 1900 else year

"""Converters chosen once per column, for values converted by the thousand (the connector's rows).

:func:`value_converter` returns, for one column type, a function of the value alone whose result is
:func:`~schemas.values.mapping.to_json_value`'s for every value but None (which the caller handles): the
kind's converter is looked up once instead of per value, and the form the binlog reader gives for the
common kinds (an ``int`` for integers, a ``str`` for text, a naive ``datetime``, ``bytes``...) takes a
short path that computes exactly what that converter computes for it. Any other value goes to the
kind's converter itself, so odd forms and wrong values (``TypeError``) behave as they always did.
"""

from __future__ import annotations

import datetime as dt
import math
from binascii import b2a_base64
from collections.abc import Callable

from schemas.values.base import _untyped
from schemas.values.columns import ColumnType, JsonValue
from schemas.values.mapping import _CONVERTERS
from schemas.values.temporal import _EPOCH

ValueConverter = Callable[[object], JsonValue]
"""A column's mapping of a value that is not None."""

_DATETIME, _DATE = dt.datetime, dt.date


def value_converter(column: ColumnType | None) -> ValueConverter:
    """``lambda value: to_json_value(value, column)`` for values that are not None, with the column's
    converter chosen now and a short path for the usual Python type of its kind."""
    if column is None or column.kind == "unknown":
        return _untyped
    convert = _CONVERTERS[column.kind]
    make = _SHORT_PATHS.get(column.kind)
    if make is not None:
        return make(column, convert)

    def converted(value: object) -> JsonValue:
        return convert(value, column)

    return converted


_Convert = Callable[[object, ColumnType], JsonValue]


def _integer(column: ColumnType, convert: _Convert) -> ValueConverter:
    def integer(value: object) -> JsonValue:
        return value if type(value) is int else convert(value, column)

    return integer


def _string(column: ColumnType, convert: _Convert) -> ValueConverter:
    # text, enum, string: a str is its own JSON form.
    def string(value: object) -> JsonValue:
        return value if type(value) is str else convert(value, column)

    return string


def _double(column: ColumnType, convert: _Convert) -> ValueConverter:
    def double(value: object) -> JsonValue:
        if type(value) is float and math.isfinite(value):
            return value
        return convert(value, column)

    return double


def _datetime(column: ColumnType, convert: _Convert) -> ValueConverter:
    def datetime(value: object) -> JsonValue:
        if type(value) is _DATETIME and value.tzinfo is None:
            # isoformat(timespec="microseconds"), which costs more: isoformat() omits a zero fraction.
            return value.isoformat() if value.microsecond else value.isoformat() + ".000000"
        return convert(value, column)

    return datetime


def _timestamp(column: ColumnType, convert: _Convert) -> ValueConverter:
    def timestamp(value: object) -> JsonValue:
        if type(value) is _DATETIME and value.tzinfo is None:
            # The epoch is the zero TIMESTAMP (schemas.values.temporal).
            if value == _EPOCH:
                return None
            return value.isoformat() if value.microsecond else value.isoformat() + ".000000"
        return convert(value, column)

    return timestamp


def _date(column: ColumnType, convert: _Convert) -> ValueConverter:
    def date(value: object) -> JsonValue:
        if type(value) is _DATE:
            return value.isoformat()
        return convert(value, column)

    return date


def _binary(column: ColumnType, convert: _Convert) -> ValueConverter:
    # BINARY(n) values shorter than n are padded by the converter; any other bytes are base64 as they are.
    padded = column.length if column.data_type == "binary" and column.length is not None else 0

    def binary(value: object) -> JsonValue:
        if type(value) is bytes and len(value) >= padded:
            return b2a_base64(value, newline=False).decode("ascii")
        return convert(value, column)

    return binary


_SHORT_PATHS: dict[str, Callable[[ColumnType, _Convert], ValueConverter]] = {
    "integer": _integer,
    "text": _string,
    "enum": _string,
    "string": _string,
    "double": _double,
    "datetime": _datetime,
    "timestamp": _timestamp,
    "date": _date,
    "binary": _binary,
    "geometry": _binary,
}

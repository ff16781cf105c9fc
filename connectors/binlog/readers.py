"""Readers of one binlog row value each, by column type, for :mod:`connectors.binlog.rowdecode`.

Each reader takes the event's bytes and an offset and returns ``(value, offset after it)``, reading the
value exactly as pymysqlreplication's ``RowsEvent`` reads it (its ``__read_*`` methods, ported one by one
and named in each docstring), so that the column's converter (:mod:`schemas.values`) sees the same
value; the common kinds give their JSON form directly. A value it cannot read as pymysqlreplication would
raises (:class:`Refused` or the error pymysqlreplication would raise), and the whole event is read by
pymysqlreplication instead.
"""

from __future__ import annotations

import codecs
import datetime as dt
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pymysql.charset import charset_by_name

from schemas.values import ColumnType, binlog_value_converter

Reader = Callable[[bytes, int], tuple[Any, int]]
"""Reads one value at an offset of the event's bytes: ``(value, offset after it)``."""

# MySQL protocol field types (include/field_types.h), as pymysqlreplication's table map leaves them.
_TINY, _SHORT, _LONG, _FLOAT, _DOUBLE, _LONGLONG, _INT24 = 1, 2, 3, 4, 5, 8, 9
_DATE, _YEAR, _VARCHAR, _BIT, _TIMESTAMP2, _DATETIME2, _TIME2 = 10, 13, 15, 16, 17, 18, 19
_SET = 248
_NEWDECIMAL, _ENUM, _BLOB, _STRING = 246, 247, 252, 254
_DECIMAL_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
"""Bytes of a DECIMAL group of 0-8 leftover digits (9 digits take 4 bytes)."""

_INTEGERS = {
    _TINY: (struct.Struct("<b"), struct.Struct("<B")),
    _SHORT: (struct.Struct("<h"), struct.Struct("<H")),
    _LONG: (struct.Struct("<i"), struct.Struct("<I")),
    _LONGLONG: (struct.Struct("<q"), struct.Struct("<Q")),
}
_FLOAT_S, _DOUBLE_S = struct.Struct("<f"), struct.Struct("<d")
_FSP_BYTES = {0: 0, 1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3}
_DATETIME, _DATE_T = dt.datetime, dt.date
_utcfromtimestamp = dt.datetime.utcfromtimestamp


class Refused(Exception):
    """This event is not decoded here: the caller reads it with pymysqlreplication."""


def _fraction(data: bytes, pos: int, fsp: int) -> tuple[int, int]:
    """pymysqlreplication's ``__read_fsp``: the microseconds of a fractional-second part."""
    size = _FSP_BYTES[fsp]
    if not size:
        return 0, pos
    value = int.from_bytes(data[pos : pos + size], "big", signed=True)
    if fsp % 2:
        value = int(value / 10)
    return value * 10 ** (6 - fsp), pos + size


def _integer_reader(code: int, unsigned: bool) -> Reader:
    if code == _INT24:
        signed = not unsigned

        def int24(data: bytes, pos: int) -> tuple[object, int]:
            return int.from_bytes(data[pos : pos + 3], "little", signed=signed), pos + 3

        return int24
    unpack = _INTEGERS[code][1 if unsigned else 0].unpack_from
    size = _INTEGERS[code][0].size

    def integer(data: bytes, pos: int) -> tuple[object, int]:
        return unpack(data, pos)[0], pos + size

    return integer


def _string_reader(length_size: int, encoding: str | None) -> Reader:
    """pymysqlreplication's ``__read_string``: a length-prefixed byte string, decoded strictly in the
    column's character set (bytes where Python has no codec for it, UTF-8 where the table map names
    none)."""

    def string(data: bytes, pos: int) -> tuple[object, int]:
        start = pos + length_size
        end = start + int.from_bytes(data[pos:start], "little")
        if end > len(data):
            raise Refused("a string runs past the event")
        raw = data[start:end]
        return (raw if encoding is None else raw.decode(encoding)), end

    return string


def _datetime2_reader(fsp: int) -> Reader:
    """DATETIME(fsp) in JSON form: ``YYYY-MM-DDTHH:MM:SS.ffffff``; None where pymysqlreplication
    gives None (no valid date: the zero DATETIME and its kin)."""

    def datetime2(data: bytes, pos: int) -> tuple[object, int]:
        packed = int.from_bytes(data[pos : pos + 5], "big")
        micro, end = _fraction(data, pos + 5, fsp)
        if micro > 999_999:
            raise Refused("a fraction out of range")  # pymysqlreplication raises there
        year_month = (packed >> 22) & 0x1FFFF
        try:
            value = _DATETIME(
                year_month // 13,
                year_month % 13,
                (packed >> 17) & 0x1F,
                (packed >> 12) & 0x1F,
                (packed >> 6) & 0x3F,
                packed & 0x3F,
                micro if micro > 0 else 0,
            )
        except ValueError:  # no such date or time: pymysqlreplication's None
            return None, end
        return (value.isoformat() if value.microsecond else value.isoformat() + ".000000"), end

    return datetime2


def _timestamp2_reader(fsp: int) -> Reader:
    """TIMESTAMP(fsp) as pymysqlreplication reads it (a naive UTC ``datetime``), for the converter."""

    def timestamp2(data: bytes, pos: int) -> tuple[object, int]:
        seconds = int.from_bytes(data[pos : pos + 4], "big", signed=True)
        micro, end = _fraction(data, pos + 4, fsp)
        value = _utcfromtimestamp(seconds)
        return (value.replace(microsecond=micro) if micro > 0 else value), end

    return timestamp2


def _date(data: bytes, pos: int) -> tuple[object, int]:
    """DATE as pymysqlreplication reads it (None for the zero date and zero parts), except a day the
    month does not have (``2024-02-30``, stored under ``ALLOW_INVALID_DATES``): None, as a direct read
    maps it (schemas.values), where pymysqlreplication raises and no row of the event could be read."""
    packed = int.from_bytes(data[pos : pos + 3], "little")
    year, month, day = (packed >> 9) & 0x7FFF, (packed >> 5) & 0xF, packed & 0x1F
    if not (year and month and day):
        return None, pos + 3
    try:
        return _DATE_T(year, month, day), pos + 3
    except ValueError:
        return None, pos + 3


def _decimal_reader(precision: int, scale: int) -> Reader:
    """pymysqlreplication's ``__read_new_decimal``: the ``Decimal`` of MySQL's packed DECIMAL(p, s), its
    sign in the first byte's high bit, each group of 9 digits in 4 big-endian bytes, the digits left
    over in fewer; a negative number stores every byte inverted."""
    whole_groups, whole_rest = divmod(precision - scale, 9)
    fraction_groups, fraction_rest = divmod(scale, 9)
    parts = (
        [(_DECIMAL_BYTES[whole_rest], 0)] * bool(whole_rest)
        + [(4, 9)] * whole_groups
        + [(0, -1)]  # the decimal point
        + [(4, 9)] * fraction_groups
        + [(_DECIMAL_BYTES[fraction_rest], fraction_rest)] * bool(fraction_rest)
    )
    size = sum(n for n, _ in parts)

    def decimal(data: bytes, pos: int) -> tuple[object, int]:
        raw = bytearray(data[pos : pos + size])
        if len(raw) != size:
            raise Refused("a DECIMAL runs past the event")
        negative = not raw[0] & 0x80
        raw[0] ^= 0x80
        mask = -1 if negative else 0
        text = ["-"] if negative else []
        at = 0
        for width, digits in parts:
            if digits < 0:
                text.append(".")
                continue
            group = int.from_bytes(raw[at : at + width], "big", signed=True) ^ mask
            text.append(f"{group:0{digits}d}" if digits else str(group))
            at += width
        return Decimal("".join(text)), pos + size

    return decimal


def _time2_reader(fsp: int) -> Reader:
    """pymysqlreplication's ``__read_time2``, bit for bit (its ``timedelta``, including the wrong sign
    of the fraction of a negative TIME, which the column's converter undoes: ``binlog_value``)."""

    def time2(data: bytes, pos: int) -> tuple[object, int]:
        packed = int.from_bytes(data[pos : pos + 3], "big", signed=True)
        sign = 1 if (packed >> 23) & 1 else -1
        if sign == -1:
            packed = ~packed + 1
        micro, end = _fraction(data, pos + 3, fsp)
        value = (
            dt.timedelta(
                hours=(packed >> 12) & 0x3FF,
                minutes=(packed >> 6) & 0x3F,
                seconds=packed & 0x3F,
                microseconds=micro,
            )
            * sign
        )
        return value, end

    return time2


def _bit_reader(bits: int, size: int) -> Reader:
    """pymysqlreplication's ``__read_bit``: the bits as a string of 0s and 1s, most significant first
    (the first byte holds ``bits % 8`` of them, or 8)."""
    widths = [(bits if size == 1 else bits % 8 or 8)] + [8] * (size - 1)

    def bit(data: bytes, pos: int) -> tuple[object, int]:
        if pos + size > len(data):
            raise Refused("a BIT runs past the event")
        text = "".join(
            format(data[pos + i] & ((1 << width) - 1), f"0{width}b") for i, width in enumerate(widths)
        )
        return text, pos + size

    return bit


def _set_reader(members: tuple[str, ...], size: int, convert: Any) -> Reader:
    """A SET in JSON form: pymysqlreplication's set of members through the column's converter, and
    ``[]`` for the empty set (which it returns as None, ``none_sources`` "empty set")."""

    def set_(data: bytes, pos: int) -> tuple[object, int]:
        mask = int.from_bytes(data[pos : pos + size], "little")
        chosen = {member for index, member in enumerate(members) if mask & (1 << index)}
        return (convert(chosen) if chosen else []), pos + size

    return set_


def _year(data: bytes, pos: int) -> tuple[object, int]:
    return data[pos] + 1900, pos + 1


def _encoding(column: Any) -> str | None:
    """The codec pymysqlreplication decodes a string column with; None where it returns bytes."""
    name = column.character_set_name
    if name is None:
        return "utf-8"
    charset = charset_by_name(name)
    encoding = charset.encoding if charset else name
    try:
        codecs.lookup(encoding)
    except LookupError:
        return None
    return str(encoding)


def column_reader(column: Any, type_: ColumnType) -> tuple[Reader, bool] | None:
    """The reader of one table-map column, and whether its value is in JSON form already (else the
    column's converter maps it); None for a type this module leaves to pymysqlreplication."""
    code, kind = column.type, type_.kind
    if code in _INTEGERS or code == _INT24:
        return _integer_reader(code, bool(column.unsigned)), kind == "integer"
    if code == _FLOAT:
        return (lambda data, pos: (_FLOAT_S.unpack_from(data, pos)[0], pos + 4)), False
    if code == _DOUBLE:
        return (lambda data, pos: (_DOUBLE_S.unpack_from(data, pos)[0], pos + 8)), False
    if code in (_VARCHAR, _STRING):
        encoding = _encoding(column)
        reader = _string_reader(2 if column.max_length > 255 else 1, encoding)
        return reader, encoding is not None and kind in ("text", "string")
    if code == _BLOB:
        encoding = _encoding(column)
        as_json = encoding is not None and kind in ("text", "string")
        return _string_reader(column.length_size, encoding), as_json
    if code == _DATETIME2 and column.fsp in _FSP_BYTES:
        if kind != "datetime":
            return None
        return _datetime2_reader(column.fsp), True
    if code == _TIMESTAMP2 and column.fsp in _FSP_BYTES:
        return _timestamp2_reader(column.fsp), False
    if code == _DATE:
        return _date, False
    if code == _YEAR:
        return _year, False
    if code == _TIME2 and column.fsp in _FSP_BYTES:
        return _time2_reader(column.fsp), False
    if code == _BIT and 0 < column.bits <= 64 and column.bytes == (column.bits + 7) // 8:
        return _bit_reader(column.bits, column.bytes), False
    if code == _SET and column.set_values and 1 <= column.size <= 8 and kind == "set":
        return _set_reader(tuple(column.set_values), column.size, binlog_value_converter(type_)), True
    if code == _NEWDECIMAL and 0 < column.precision <= 65 and 0 <= column.decimals <= column.precision:
        return _decimal_reader(column.precision, column.decimals), False
    if code == _ENUM and column.enum_values and column.size in (1, 2):
        members, size = tuple(column.enum_values), column.size

        def enum(data: bytes, pos: int) -> tuple[object, int]:
            return members[int.from_bytes(data[pos : pos + size], "little")], pos + size

        return enum, kind in ("enum", "text", "string")
    return None

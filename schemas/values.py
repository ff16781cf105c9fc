"""How database values become JSON values: one mapping per MySQL column type, whatever the source.

A cached value (``d``) must equal a fresh read of the row byte for byte, or ``freshkey verify`` reports
stale entries that are not. The drivers disagree on almost every type that is not a plain number or
string (the binlog reader returns BIT as a bit string and a read as bytes, SET as a Python set or a comma
string, YEAR 0000 as 1900, a negative fractional TIME off by almost a second, a BINARY(n) without its
trailing zero bytes, a FLOAT as its float32 value or as six printed digits...). So the mapping is defined
per **column type** (:class:`ColumnType`, from the binlog's table map or from ``information_schema``),
and every source goes through it:

- binlog images: :func:`binlog_row_to_json` (after :func:`binlog_value` undoes the binlog reader's
  quirks), with types from :func:`binlog_column_types`;
- direct reads: :func:`row_to_json` with types from :func:`column_type_from_information_schema` (FLOAT
  columns selected as ``CAST(col AS DOUBLE)``, the session in UTC: see ``connectors.database``);
- Debezium change events: ``schemas.debezium`` decodes Debezium's encodings into the same Python values.

The JSON form of each type (docs/values.md has the same table with an example each):

===================================  ==========================================================
column type                          JSON value
===================================  ==========================================================
TINYINT ... BIGINT [UNSIGNED], BOOL  integer (BOOL is TINYINT(1): 0/1, never true/false)
DECIMAL(M,D)                         string of the exact digits with D decimals: ``"-12.50"``
FLOAT                                number: the shortest decimal that reads back as the same
                                     float32 (``-3.4e+38``, not ``-3.3999999521443642e+38``)
DOUBLE                               number (shortest round trip)
BIT(n)                               unsigned integer: ``b'101'`` -> ``5``
DATE                                 ``"YYYY-MM-DD"``
DATETIME(fsp)                        ``"YYYY-MM-DDTHH:MM:SS.ffffff"`` (always 6 digits)
TIMESTAMP(fsp)                       the same, in UTC
TIME(fsp)                            ``"[-]HH:MM:SS.ffffff"`` (hours may exceed 24)
YEAR                                 integer (``0`` for 0000)
CHAR, VARCHAR, *TEXT                 string
ENUM                                 string (the member; ``""`` for the invalid value)
SET                                  list of members, sorted; ``[]`` when empty
BINARY(n), VARBINARY, *BLOB          standard base64; BINARY(n) always n bytes
JSON (MySQL; MariaDB LONGTEXT        the JSON document itself
 with a JSON_VALID check)
GEOMETRY and its subtypes            base64 of MySQL's internal form (SRID, 4 bytes LE, + WKB)
UUID, INET4, INET6 (MariaDB)         the server's text form
NULL                                 ``null``
===================================  ==========================================================

Zero dates (``'0000-00-00'``, a zero month or day, the zero TIMESTAMP) have no calendar value and the
binlog reader cannot tell which one it saw: they are ``null`` from every source. A float that is not
finite cannot be stored in MySQL; should a driver ever give one, it becomes ``"NaN"``, ``"Infinity"`` or
``"-Infinity"``. Without a column type (:func:`to_json_value` with ``column=None``), values map by their
Python type, as before.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import ipaddress
import json
import math
import re
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

JsonValue = None | bool | int | float | str | list[Any] | dict[str, Any]

# -- column types ------------------------------------------------------------------------------------------

_KINDS: dict[str, tuple[str, ...]] = {
    "integer": ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "bool", "boolean"),
    "decimal": ("decimal", "numeric", "dec", "fixed"),
    "float": ("float",),
    "double": ("double", "double precision", "real"),
    "bit": ("bit",),
    "date": ("date",),
    "datetime": ("datetime",),
    "timestamp": ("timestamp",),
    "time": ("time",),
    "year": ("year",),
    "text": ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "long varchar"),
    "binary": ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "long varbinary"),
    "enum": ("enum",),
    "set": ("set",),
    "json": ("json",),
    "geometry": (
        "geometry",
        "point",
        "linestring",
        "polygon",
        "multipoint",
        "multilinestring",
        "multipolygon",
        "geometrycollection",
        "geomcollection",
    ),
    "uuid": ("uuid",),
    "inet4": ("inet4",),
    "inet6": ("inet6",),
    # The binlog without character-set metadata cannot tell a text column from a binary one: the value's
    # Python type decides (str: text, bytes: base64).
    "string": ("string",),
}
_KIND_OF = {name: kind for kind, names in _KINDS.items() for name in names}
_INTEGER_BITS = {"tinyint": 8, "bool": 8, "boolean": 8, "smallint": 16, "mediumint": 24, "int": 32}


@dataclass(frozen=True, slots=True)
class ColumnType:
    """What the value mapping needs to know about a column: its type as MySQL names it.

    ``data_type`` is the lower-case name ``information_schema.COLUMNS.DATA_TYPE`` uses (``int``,
    ``varbinary``, ``datetime``...), ``json`` for a MariaDB LONGTEXT with a ``JSON_VALID`` check;
    ``length`` the bytes of a BINARY(n) or the bits of a BIT(n); ``scale`` the decimals of a DECIMAL or
    the fractional-second digits of a temporal type; ``members`` the values of an ENUM or SET, in their
    defined order. An unknown ``data_type`` maps values by their Python type.
    """

    data_type: str
    unsigned: bool = False
    length: int | None = None
    scale: int | None = None
    members: tuple[str, ...] = ()
    kind: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_type", self.data_type.lower())
        object.__setattr__(self, "kind", _KIND_OF.get(self.data_type, "unknown"))

    @property
    def integer_bits(self) -> int:
        """Width of an integer column (64 for BIGINT)."""
        return _INTEGER_BITS.get(self.data_type, 64)


# -- the mapping ---------------------------------------------------------------------------------------------


def to_json_value(value: object, column: ColumnType | None = None) -> JsonValue:
    """Convert one database value to its JSON form (see the module table).

    ``value`` may be in any form a driver gives for that column type (the binlog reader after
    :func:`binlog_value`, pymysql, or ``schemas.debezium``'s decoding); raises :class:`TypeError` for a
    value that is no form of that type.
    """
    if value is None:
        return None
    if column is None or column.kind == "unknown":
        return _untyped(value)
    convert = _CONVERTERS[column.kind]
    return convert(value, column)


def row_to_json(
    row: Mapping[str, object], columns: Mapping[str, ColumnType] | None = None
) -> dict[str, JsonValue]:
    """Convert a whole row (column name -> value); columns missing from ``columns`` map untyped."""
    types = columns or {}
    return {str(k): to_json_value(v, types.get(str(k))) for k, v in row.items()}


def _untyped(value: object) -> JsonValue:
    """The mapping by Python type, for values whose column type is not known."""
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return _format_time(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, set | frozenset):
        return sorted(str(v) for v in value)
    if isinstance(value, Mapping):
        return {_key(k): _untyped(v) if v is not None else None for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_untyped(v) if v is not None else None for v in value]
    raise TypeError(f"no JSON form for a database value of type {type(value).__name__}")


def _key(key: object) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
"""The JSON forms of floats that MySQL cannot store but a driver might give (the spelling of JSON5 and
of Jackson, which Debezium's JSON converter uses)."""


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else NON_FINITE[repr(value)]


def _wrong(value: object, column: ColumnType) -> TypeError:
    return TypeError(
        f"no JSON form for a {type(value).__name__} ({value!r:.60}) in a {column.data_type.upper()} column"
    )


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


def _date(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, dt.datetime):
        return value.date().isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, str):  # pymysql returns what it cannot parse: zero dates
        try:
            return dt.date.fromisoformat(value.strip()).isoformat()
        except ValueError:
            return None
    raise _wrong(value, column)


_EPOCH = dt.datetime(1970, 1, 1)


def _naive_utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def _datetime_of(value: object, column: ColumnType) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return _naive_utc(value)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day)
    if isinstance(value, str):
        text = value.strip()
        try:
            return _naive_utc(dt.datetime.fromisoformat(text.replace("Z", "+00:00")))
        except ValueError:
            return None  # zero dates ("0000-00-00 00:00:00") and zero parts
    raise _wrong(value, column)


def _datetime(value: object, column: ColumnType) -> JsonValue:
    moment = _datetime_of(value, column)
    return None if moment is None else moment.isoformat(timespec="microseconds")


def _timestamp(value: object, column: ColumnType) -> JsonValue:
    moment = _datetime_of(value, column)
    # TIMESTAMP starts at 1970-01-01 00:00:01 UTC: the epoch itself is the zero TIMESTAMP, which the
    # binlog carries as 0 and Debezium as the epoch (NOT NULL columns).
    if moment is None or moment == _EPOCH:
        return None
    return moment.isoformat(timespec="microseconds")


_TIME_TEXT = re.compile(r"(-)?(\d+):(\d{1,2}):(\d{1,2})(?:\.(\d{1,6}))?")


def _time(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, dt.timedelta):
        return _format_time(value)
    if isinstance(value, str):
        match = _TIME_TEXT.fullmatch(value.strip())
        if match is None:
            raise _wrong(value, column)
        sign, hours, minutes, seconds, fraction = match.groups()
        micros = int((fraction or "0").ljust(6, "0"))
        total = ((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * 1_000_000 + micros
        return _format_time(dt.timedelta(microseconds=-total if sign else total))
    raise _wrong(value, column)


def _format_time(value: dt.timedelta) -> str:
    total_us = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    seconds, micros = divmod(total_us, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}:{secs:02d}.{micros:06d}"


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


def _text(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        # A driver that could not decode the column's character set: keep what decodes, mark the rest.
        return bytes(value).decode("utf-8", errors="replace")
    raise _wrong(value, column)


def _bytes_of(value: object, column: ColumnType) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    elif isinstance(value, str):  # the binlog reader returns "" for an empty binary value
        data = value.encode("utf-8")
    else:
        raise _wrong(value, column)
    if column.data_type == "binary" and column.length is not None and len(data) < column.length:
        # BINARY(n) always holds n bytes; the binlog leaves out trailing zero bytes.
        data = data.ljust(column.length, b"\x00")
    return data


def _binary(value: object, column: ColumnType) -> JsonValue:
    return base64.b64encode(_bytes_of(value, column)).decode("ascii")


def _string(value: object, column: ColumnType) -> JsonValue:
    return value if isinstance(value, str) else _binary(value, column)


def _enum(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= len(column.members):
        return ("", *column.members)[value]  # the index as stored (0: the invalid value "")
    return _text(value, column)


def _set(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, str):
        return sorted(part for part in value.split(",") if part) if value else []
    if isinstance(value, set | frozenset | list | tuple):
        return sorted(str(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool) and column.members:
        return sorted(m for i, m in enumerate(column.members) if value >> i & 1)
    raise _wrong(value, column)


_MIN_I64, _MAX_U64 = -(2**63), 2**64 - 1


def _json_int(text: str) -> int | float:
    number = int(text)
    # Cache values are encoded with orjson, whose integers stop at 64 bits: keep larger ones as doubles.
    return number if _MIN_I64 <= number <= _MAX_U64 else float(number)


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def _json(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, bytes | bytearray | memoryview):
        value = bytes(value).decode("utf-8")
    if isinstance(value, str):
        try:
            parsed: Any = orjson.loads(value)  # fast path: integers within 64 bits, finite numbers
        except orjson.JSONDecodeError:
            try:
                parsed = json.loads(value, parse_int=_json_int, parse_constant=_no_constant)
            except ValueError:
                return value  # not JSON after all (a MariaDB column whose check was off): keep the text
        return _json_tree(parsed)
    return _json_tree(value)


def _json_tree(value: object) -> JsonValue:
    """A parsed JSON document (MySQL's binary JSON from the binlog holds bytes for strings and keys)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value if _MIN_I64 <= value <= _MAX_U64 else float(value)
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, Decimal):
        return float(value) if value != value.to_integral_value() else int(value)
    if isinstance(value, Mapping):
        return {_key(k): _json_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_tree(v) for v in value]
    if isinstance(value, dt.datetime | dt.date | dt.timedelta):  # MySQL JSON's opaque temporal values
        return _untyped(value)
    raise TypeError(f"no JSON form for a {type(value).__name__} inside a JSON document")


def _uuid(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, str) and value:  # the text form; "" is the binlog's all-zero value
        return value
    data = _bytes_of(value, ColumnType("binary", length=16))
    hexed = data.hex()
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"


def _inet4(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, str) and value:  # the text form; "" is the binlog's all-zero value
        return value
    return str(ipaddress.IPv4Address(_bytes_of(value, ColumnType("binary", length=4))))


def _inet6(value: object, column: ColumnType) -> JsonValue:
    if isinstance(value, str) and value:  # the text form; "" is the binlog's all-zero value
        return value
    data = _bytes_of(value, ColumnType("binary", length=16))
    # MariaDB writes IPv4-mapped and IPv4-compatible addresses with a dotted tail (inet_ntop).
    tail = str(ipaddress.IPv4Address(data[12:]))
    if data[:12] == b"\x00" * 10 + b"\xff\xff":
        return f"::ffff:{tail}"
    if data[:12] == b"\x00" * 12 and int.from_bytes(data[12:], "big") > 1:
        return f"::{tail}"
    return ipaddress.IPv6Address(data).compressed


_Converter = Callable[[object, ColumnType], JsonValue]
_CONVERTERS: dict[str, _Converter] = {
    "integer": _integer,
    "decimal": _decimal,
    "float": _float,
    "double": _double,
    "bit": _bit,
    "date": _date,
    "datetime": _datetime,
    "timestamp": _timestamp,
    "time": _time,
    "year": _year,
    "text": _text,
    "binary": _binary,
    "string": _string,
    "enum": _enum,
    "set": _set,
    "json": _json,
    "geometry": _binary,
    "uuid": _uuid,
    "inet4": _inet4,
    "inet6": _inet6,
}


# -- the binlog reader (mysql-replication 1.0.x) -------------------------------------------------------------

# MySQL protocol field types (include/field_types.h) as the table map event carries them.
_BINLOG_TYPES = {
    0: "decimal",
    1: "tinyint",
    2: "smallint",
    3: "int",
    4: "float",
    5: "double",
    7: "timestamp",
    8: "bigint",
    9: "mediumint",
    10: "date",
    11: "time",
    12: "datetime",
    13: "year",
    14: "date",
    15: "varchar",
    16: "bit",
    17: "timestamp",
    18: "datetime",
    19: "time",
    245: "json",
    246: "decimal",
    247: "enum",
    248: "set",
    249: "tinyblob",
    250: "mediumblob",
    251: "longblob",
    252: "blob",
    253: "varchar",
    254: "char",
    255: "geometry",
}
_BINARY_OF = {"varchar": "varbinary", "char": "binary"}
_TEXT_OF = {"tinyblob": "tinytext", "mediumblob": "mediumtext", "longblob": "longtext", "blob": "text"}
EMPTY_SET = "empty set"
"""pymysqlreplication's ``none_sources`` reason for an empty SET it returns as None."""


def column_type_from_binlog(column: Any) -> ColumnType:
    """The :class:`ColumnType` of a column of the binlog's table map (a pymysqlreplication ``Column``:
    ``type``, ``unsigned``, ``character_set_name``, ``max_length``, ``bits``, ``decimals``, ``fsp``,
    ``enum_values``, ``set_values``; read by attribute, so this module imports no driver)."""
    code = int(column.type)
    data_type = _BINLOG_TYPES.get(code, "unknown")
    charset = getattr(column, "character_set_name", None)
    length: int | None = None
    scale: int | None = None
    members: tuple[str, ...] = ()
    if data_type in ("varchar", "char", "tinyblob", "mediumblob", "longblob", "blob"):
        if charset is None:
            data_type = "string" if data_type in ("varchar", "char") else data_type
        elif charset == "binary":
            data_type = _BINARY_OF.get(data_type, data_type)
            if data_type == "binary":
                length = getattr(column, "max_length", None)
        else:
            data_type = _TEXT_OF.get(data_type, data_type)
    elif data_type == "bit":
        length = getattr(column, "bits", None)
    elif data_type == "decimal":
        scale = getattr(column, "decimals", None)
    elif data_type in ("time", "datetime", "timestamp"):
        scale = getattr(column, "fsp", None)
    elif data_type == "enum":
        members = tuple(v for v in (getattr(column, "enum_values", None) or ())[1:])
    elif data_type == "set":
        members = tuple(getattr(column, "set_values", None) or ())
    return ColumnType(
        data_type,
        unsigned=bool(getattr(column, "unsigned", False)),
        length=length,
        scale=scale,
        members=members,
    )


# Types the binlog's table map cannot name, which information_schema can: MariaDB's JSON is a LONGTEXT
# with a JSON_VALID check, its UUID/INET4/INET6 travel as BINARY(16)/BINARY(4).
_REFINES = {"json": ("text", "string"), "uuid": ("binary",), "inet4": ("binary",), "inet6": ("binary",)}


def binlog_column_types(
    columns: Sequence[Any], refine: Mapping[str, ColumnType] | None = None
) -> dict[str, ColumnType]:
    """Column name -> type for a table map's columns.

    The table map describes the row as it was written (a later ALTER does not change it), so it decides;
    ``refine`` (the table's types from information_schema, see :func:`column_type_from_information_schema`)
    only names what the table map cannot: MariaDB's JSON, UUID, INET4 and INET6 columns.
    """
    types: dict[str, ColumnType] = {}
    for column in columns:
        name = str(column.name)
        binlog = column_type_from_binlog(column)
        known = refine.get(name) if refine else None
        if known is not None and binlog.kind in _REFINES.get(known.kind, ()):
            binlog = known
        types[name] = binlog
    return types


def binlog_value(value: object, column: ColumnType, none_source: str | None = None) -> object:
    """Undo what mysql-replication 1.0.x gets wrong, so that :func:`to_json_value` sees MySQL's value.

    - an empty SET comes back as None (``none_sources``: ``"empty set"``): it is the empty set;
    - a negative TIME with a fractional part comes back as ``-(|t| rounded up to a second, minus the
      fraction)``: ``-00:00:00.000001`` as ``-00:00:00.999999``. The reader takes the 2's complement of
      the integer part only (+1 s) and adds the fraction (stored negated) back with the wrong sign; the
      map is one to one, so the true value is ``-(floor(L) + 1 - frac(L))`` where ``L`` is the magnitude
      it returned. Fractionless values are right.
    """
    if value is None:
        return frozenset() if none_source == EMPTY_SET and column.kind == "set" else None
    if column.kind == "time" and isinstance(value, dt.timedelta) and value < dt.timedelta(0):
        magnitude = -((value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds)
        whole, fraction = divmod(magnitude, 1_000_000)
        if fraction:
            return -dt.timedelta(seconds=whole, microseconds=1_000_000 - fraction)
    return value


def binlog_row_to_json(
    values: Mapping[str, object],
    columns: Mapping[str, ColumnType],
    none_sources: Mapping[str, str] | None = None,
) -> dict[str, JsonValue]:
    """One row image of a rows event (``row["values"]``, ``row["before_values"]``...) in JSON form.

    ``none_sources`` is the reader's reason for each None (``row["none_sources"]`` and the like)."""
    reasons = none_sources or {}
    result: dict[str, JsonValue] = {}
    for name, value in values.items():
        column = columns.get(name)
        if column is None:
            result[name] = to_json_value(value)
            continue
        result[name] = to_json_value(binlog_value(value, column, reasons.get(name)), column)
    return result


# -- information_schema --------------------------------------------------------------------------------------

_QUOTED = re.compile(r"'((?:[^']|'')*)'")
_PARENS = re.compile(r"\(([^)]*)\)")
_JSON_CHECK = re.compile(r"^\s*json_valid\s*\(\s*`?(?P<name>(?:[^`]|``)+?)`?\s*\)\s*$", re.IGNORECASE)


def json_checked_columns(check_clauses: Iterable[str]) -> set[str]:
    """The columns that a ``JSON_VALID(col)`` check makes JSON (MariaDB's JSON type), from the
    ``CHECK_CLAUSE`` values of ``information_schema.CHECK_CONSTRAINTS`` for one table."""
    found: set[str] = set()
    for clause in check_clauses:
        match = _JSON_CHECK.match(clause or "")
        if match is not None:
            found.add(match.group("name").replace("``", "`"))
    return found


def column_type_from_information_schema(row: Mapping[str, Any], *, json_checked: bool = False) -> ColumnType:
    """The :class:`ColumnType` of one ``information_schema.COLUMNS`` row (``DATA_TYPE``,
    ``COLUMN_TYPE``, ``NUMERIC_SCALE``, ``DATETIME_PRECISION``; keys in any case). ``json_checked``:
    the column has a ``JSON_VALID`` check (:func:`json_checked_columns`)."""
    get = {str(k).upper(): v for k, v in row.items()}.get
    data_type = str(get("DATA_TYPE") or "").lower()
    column_type = str(get("COLUMN_TYPE") or data_type)
    if json_checked and _KIND_OF.get(data_type) == "text":
        data_type = "json"
    kind = _KIND_OF.get(data_type, "unknown")
    length: int | None = None
    scale: int | None = None
    members: tuple[str, ...] = ()
    if kind in ("enum", "set"):
        members = tuple(m.replace("''", "'") for m in _QUOTED.findall(column_type))
    elif data_type in ("binary", "bit"):
        size = _PARENS.search(column_type)
        length = int(size.group(1)) if size and size.group(1).strip().isdigit() else 1
    elif kind == "decimal":
        scale = _int_or_none(get("NUMERIC_SCALE"))
    elif kind in ("time", "datetime", "timestamp"):
        scale = _int_or_none(get("DATETIME_PRECISION"))
    return ColumnType(
        data_type,
        unsigned="unsigned" in column_type.lower(),
        length=length,
        scale=scale,
        members=members,
    )


def _int_or_none(value: object) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(str(value))
    except ValueError:
        return None


def json_to_sql(value: object, column: ColumnType | None) -> object:
    """A value in its JSON form as a query parameter for its column (the reverse of the mapping, for
    key lookups): base64 back to bytes for binary columns; anything else as it is. Raises
    :class:`ValueError` for a value no row of that column can hold (invalid base64)."""
    if column is None or value is None:
        return value
    if column.kind in ("binary", "geometry"):
        try:
            return base64.b64decode(str(value), validate=True)
        except ValueError:
            raise ValueError(f"{value!r:.60} is not the base64 form of a {column.data_type} value") from None
    return value

"""The mapping: one converter per kind of column type (:data:`_CONVERTERS`), whatever the source."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from schemas.values.base import _untyped
from schemas.values.columns import ColumnType, JsonValue
from schemas.values.documents import _json
from schemas.values.numbers import _bit, _decimal, _double, _float, _integer, _year
from schemas.values.temporal import _date, _datetime, _time, _timestamp
from schemas.values.text import _binary, _enum, _inet4, _inet6, _set, _string, _text, _uuid


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

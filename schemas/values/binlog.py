"""The binlog reader (mysql-replication 1.0.x): column types from its table map, and its quirks undone."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from schemas.values.base import _untyped
from schemas.values.columns import ColumnType, JsonValue
from schemas.values.compiled import ValueConverter, value_converter
from schemas.values.mapping import to_json_value

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


RowConverter = Callable[[Mapping[str, object], Mapping[str, str] | None], dict[str, JsonValue]]
"""``(values, none_sources) -> JSON image``: :func:`binlog_row_to_json` for one table's columns."""


def binlog_row_converter(columns: Mapping[str, ColumnType]) -> RowConverter:
    """:func:`binlog_row_to_json` with ``columns`` fixed: ``converter(values, none_sources)`` gives the
    same image, with each column's conversion chosen once (per table map) instead of per value
    (:func:`~schemas.values.compiled.value_converter`)."""
    converters: dict[str, ValueConverter] = {name: binlog_value_converter(c) for name, c in columns.items()}
    sets = frozenset(name for name, column in columns.items() if column.kind == "set")
    converter_of = converters.get

    def convert(values: Mapping[str, object], none_sources: Mapping[str, str] | None) -> dict[str, JsonValue]:
        # One comprehension, each column's converter looked up by name (an unknown column: by type).
        result: dict[str, JsonValue] = {
            name: None if value is None else converter_of(name, _untyped)(value)
            for name, value in values.items()
        }
        if sets and none_sources:
            # binlog_value: a SET the reader returned as None because it was empty is [].
            for name in sets:
                if name in result and result[name] is None and none_sources.get(name) == EMPTY_SET:
                    result[name] = []
        return result

    return convert


def binlog_value_converter(column: ColumnType) -> ValueConverter:
    """One column's converter of the binlog reader's values that are not None: what
    :func:`binlog_row_converter` applies to that column (its quirks undone, :func:`binlog_value`)."""
    if column.kind != "time":
        return value_converter(column)  # binlog_value changes no other value that is not None

    def time(value: object) -> JsonValue:
        return to_json_value(binlog_value(value, column), column)

    return time

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

The package: :mod:`~schemas.values.columns` (:class:`ColumnType`), :mod:`~schemas.values.mapping` (the
mapping, one converter per kind: :mod:`~schemas.values.numbers`, :mod:`~schemas.values.temporal`,
:mod:`~schemas.values.text`, :mod:`~schemas.values.documents`, with the shared helpers and the untyped
mapping in :mod:`~schemas.values.base`; :mod:`~schemas.values.compiled` chooses a column's converter
once, for rows converted by the thousand), :mod:`~schemas.values.binlog` (the binlog reader's types and
quirks, and :func:`binlog_row_converter`, a table's images converted with its converters chosen once)
and :mod:`~schemas.values.information_schema` (types of direct reads, key parameters).
"""

from schemas.values.base import NON_FINITE
from schemas.values.binlog import (
    EMPTY_SET,
    RowConverter,
    binlog_column_types,
    binlog_row_converter,
    binlog_row_to_json,
    binlog_value,
    binlog_value_converter,
    column_type_from_binlog,
)
from schemas.values.columns import ColumnType, JsonValue
from schemas.values.compiled import ValueConverter, value_converter
from schemas.values.information_schema import (
    column_type_from_information_schema,
    json_checked_columns,
    json_to_sql,
)
from schemas.values.mapping import row_to_json, to_json_value
from schemas.values.numbers import float32_json

__all__ = [
    "EMPTY_SET",
    "NON_FINITE",
    "ColumnType",
    "JsonValue",
    "RowConverter",
    "ValueConverter",
    "binlog_column_types",
    "binlog_row_converter",
    "binlog_row_to_json",
    "binlog_value",
    "binlog_value_converter",
    "column_type_from_binlog",
    "column_type_from_information_schema",
    "float32_json",
    "json_checked_columns",
    "json_to_sql",
    "row_to_json",
    "to_json_value",
    "value_converter",
]

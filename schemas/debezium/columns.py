"""Column values of Debezium messages: Debezium's encoding -> a Python value of the MySQL type -> freshkey's
JSON form.

Column values are decoded with the field's Connect schema when the message has one (``io.debezium.time.*``,
``org.apache.kafka.connect.data.Decimal``, ``io.debezium.data.Bits``...), with the MySQL column type when
known (the worker's ``column_types`` lookup from information_schema, or Debezium's
``__debezium.source.column.type`` parameter), and otherwise with the Debezium settings the user declares
in :class:`~schemas.debezium.options.DebeziumOptions`; then mapped by ``schemas.values`` into exactly the
JSON form of freshkey's own connector.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from schemas.debezium.options import DebeziumError, DebeziumOptions
from schemas.values import ColumnType, JsonValue, to_json_value

_EXACT = decimal.Context(prec=200)  # DECIMAL has at most 65 digits: never round
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DAY = dt.date(1970, 1, 1)
_SOURCE_TYPE = "__debezium.source.column.type"


class RowDecoder:
    """Decodes the column values of one message: Debezium's encoding -> a Python value of the MySQL type
    -> ``schemas.values.to_json_value``."""

    def __init__(self, options: DebeziumOptions, known: Mapping[str, ColumnType] | None) -> None:
        self.options = options
        self.known = known or {}

    def image(
        self, values: Any, fields: Mapping[str, Mapping[str, Any]] | None
    ) -> dict[str, JsonValue] | None:
        """A row image (or a key) as column name -> JSON value; None stays None (no such image)."""
        if values is None:
            return None
        if not isinstance(values, dict):
            raise DebeziumError(f"a row image is a JSON {type(values).__name__}, not an object")
        return {
            str(name): self.value(str(name), value, (fields or {}).get(str(name)))
            for name, value in values.items()
        }

    def value(self, name: str, value: Any, field: Mapping[str, Any] | None) -> JsonValue:
        """One column's value in freshkey's JSON form; raises :class:`DebeziumError` naming the column."""
        if value is None:
            return None
        column = self.known.get(name) or (_column_from_schema(field) if field else None)
        if field is None and column is None:  # schema-less and no types: as Debezium wrote it
            return _as_is(value)
        try:
            decoded = (
                _from_schema(value, field, column, self.options.binary_handling_mode)
                if field
                else self._by_type(value, column)
            )
            return to_json_value(decoded, column)
        except (ValueError, TypeError, binascii.Error, ArithmeticError) as exc:
            raise DebeziumError(f"column {name!r}: {exc}") from None

    def _by_type(self, value: Any, column: ColumnType | None) -> Any:
        """A schema-less value of a column whose MySQL type is known, decoded per the declared modes."""
        if column is None:
            return value
        options = self.options
        kind = column.kind
        if kind == "decimal":
            if options.decimal_handling_mode == "precise" and isinstance(value, str):
                return _decimal_bytes(base64.b64decode(value), column.scale or 0)
            return value
        if kind == "integer":
            if isinstance(value, str) and options.bigint_unsigned_handling_mode == "precise":
                return _decimal_bytes(base64.b64decode(value), 0)
            return _unwrap_unsigned(value, column)
        if kind == "bit":
            if isinstance(value, bool):
                return int(value)
            return int.from_bytes(base64.b64decode(value), "little") if isinstance(value, str) else value
        if kind in ("binary", "geometry"):
            if isinstance(value, dict):
                return _geometry(value)
            return _binary(value, options.binary_handling_mode)
        if kind == "date":
            return _EPOCH_DAY + dt.timedelta(days=int(value)) if isinstance(value, int) else _iso(value)
        if kind == "time":
            if isinstance(value, int):
                millis = options.time_precision_mode == "connect" or (
                    options.time_precision_mode == "adaptive" and (column.scale or 0) <= 3
                )
                return dt.timedelta(milliseconds=value) if millis else dt.timedelta(microseconds=value)
            return _iso(value)
        if kind == "datetime":
            if isinstance(value, int):
                millis = options.time_precision_mode == "connect" or (column.scale or 0) <= 3
                return _EPOCH + (
                    dt.timedelta(milliseconds=value) if millis else dt.timedelta(microseconds=value)
                )
            return _iso(value)
        if kind in ("float", "double") and isinstance(value, Decimal):
            return float(value)
        return value


def _as_is(value: Any) -> JsonValue:
    """A schema-less value without a column type (``schemaless=as-is``): as Debezium wrote it."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _as_is(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_is(v) for v in value]
    result: JsonValue = value
    return result


def _column_from_schema(field: Mapping[str, Any]) -> ColumnType | None:
    """The MySQL type a field's Connect schema implies (Debezium's ``__debezium.source.column.type``
    parameter when present, else the logical name and type)."""
    params = field.get("parameters") or {}
    source_type = params.get(_SOURCE_TYPE)
    if source_type:
        words = str(source_type).split()
        data_type = "double" if words[:2] == ["DOUBLE", "PRECISION"] else words[0].lower()
        length = params.get("__debezium.source.column.length")
        scale = params.get("__debezium.source.column.scale")
        allowed = tuple(a for a in str(params.get("allowed") or "").split(",") if a)
        return ColumnType(
            data_type,
            unsigned="UNSIGNED" in str(source_type).upper(),
            length=int(length) if length not in (None, "") and data_type in ("binary", "bit") else None,
            scale=int(scale) if scale not in (None, "") else None,
            members=allowed,
        )
    name = str(field.get("name") or "")
    connect_type = str(field.get("type") or "")
    by_name = {
        "org.apache.kafka.connect.data.Decimal": ColumnType("decimal", scale=_int(params.get("scale"))),
        "io.debezium.data.VariableScaleDecimal": ColumnType("decimal"),
        "io.debezium.data.Bits": ColumnType("bit", length=_int(params.get("length"))),
        "io.debezium.time.Date": ColumnType("date"),
        "org.apache.kafka.connect.data.Date": ColumnType("date"),
        "io.debezium.time.IsoDate": ColumnType("date"),
        "io.debezium.time.Time": ColumnType("time"),
        "io.debezium.time.MicroTime": ColumnType("time"),
        "io.debezium.time.NanoTime": ColumnType("time"),
        "org.apache.kafka.connect.data.Time": ColumnType("time"),
        "io.debezium.time.IsoTime": ColumnType("time"),
        "io.debezium.time.Timestamp": ColumnType("datetime"),
        "io.debezium.time.MicroTimestamp": ColumnType("datetime"),
        "io.debezium.time.NanoTimestamp": ColumnType("datetime"),
        "org.apache.kafka.connect.data.Timestamp": ColumnType("datetime"),
        "io.debezium.time.IsoTimestamp": ColumnType("datetime"),
        "io.debezium.time.ZonedTimestamp": ColumnType("timestamp"),
        "io.debezium.time.Year": ColumnType("year"),
        "io.debezium.data.Enum": ColumnType("enum"),
        "io.debezium.data.EnumSet": ColumnType("set"),
        "io.debezium.data.Json": ColumnType("json"),
        "io.debezium.data.geometry.Geometry": ColumnType("geometry"),
        "io.debezium.data.geometry.Point": ColumnType("geometry"),
        "io.debezium.data.Uuid": ColumnType("uuid"),
    }
    if name in by_name:
        return by_name[name]
    return {
        "int8": ColumnType("tinyint"),
        "int16": ColumnType("smallint"),
        "int32": ColumnType("int"),
        "int64": ColumnType("bigint"),
        "boolean": ColumnType("tinyint"),
        "float32": ColumnType("float"),
        "float64": ColumnType("double"),
        "string": ColumnType("varchar"),
        "bytes": ColumnType("varbinary"),
    }.get(connect_type)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _from_schema(value: Any, field: Mapping[str, Any], column: ColumnType | None, binary_mode: str) -> Any:
    """A value decoded by its field's Connect schema (logical name first, then the Connect type)."""
    name = str(field.get("name") or "")
    connect_type = str(field.get("type") or "")
    params = field.get("parameters") or {}
    if name == "org.apache.kafka.connect.data.Decimal":
        if isinstance(value, str):
            return _decimal_bytes(base64.b64decode(value), int(params.get("scale") or 0))
        return Decimal(value) if isinstance(value, int) else value  # decimal.format=NUMERIC
    if name == "io.debezium.data.VariableScaleDecimal":
        return _decimal_bytes(base64.b64decode(value["value"]), int(value["scale"]))
    if name == "io.debezium.data.Bits":
        return int.from_bytes(base64.b64decode(value), "little")  # little-endian, per Debezium's docs
    if name in ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date"):
        return _EPOCH_DAY + dt.timedelta(days=int(value))
    if name in ("io.debezium.time.Time", "org.apache.kafka.connect.data.Time"):
        return dt.timedelta(milliseconds=int(value))
    if name == "io.debezium.time.MicroTime":
        return dt.timedelta(microseconds=int(value))
    if name == "io.debezium.time.NanoTime":
        return dt.timedelta(microseconds=int(value) // 1000)
    if name in ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"):
        return _EPOCH + dt.timedelta(milliseconds=int(value))
    if name == "io.debezium.time.MicroTimestamp":
        return _EPOCH + dt.timedelta(microseconds=int(value))
    if name == "io.debezium.time.NanoTimestamp":
        return _EPOCH + dt.timedelta(microseconds=int(value) // 1000)
    if name in ("io.debezium.time.IsoDate", "io.debezium.time.IsoTime", "io.debezium.time.IsoTimestamp"):
        return _iso(value)
    if name in ("io.debezium.data.geometry.Geometry", "io.debezium.data.geometry.Point"):
        return _geometry(value)
    if connect_type == "bytes":
        return base64.b64decode(value)
    if connect_type == "string" and column is not None and column.kind in ("binary", "geometry"):
        return _binary(value, binary_mode)  # binary.handling.mode=base64 / base64-url-safe / hex
    if connect_type in ("float32", "float64"):
        return float(value)
    if connect_type == "boolean":
        return int(bool(value))
    if connect_type in ("int8", "int16", "int32", "int64") and column is not None:
        return _unwrap_unsigned(value, column)
    return value


def _unwrap_unsigned(value: Any, column: ColumnType) -> Any:
    # bigint.unsigned.handling.mode=long writes BIGINT UNSIGNED values above 2**63 - 1 as negative longs.
    if column.unsigned and isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return value + (1 << column.integer_bits)
    return value


def _decimal_bytes(data: bytes, scale: int) -> Decimal:
    """Kafka Connect's Decimal: the unscaled value as big-endian two's complement bytes."""
    return Decimal(int.from_bytes(data, "big", signed=True)).scaleb(-scale, _EXACT)


def _binary(value: Any, mode: str) -> bytes:
    text = str(value)
    if mode in ("bytes", "base64"):
        return base64.b64decode(text)
    if mode == "base64-url-safe":
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    return bytes.fromhex(text)


def _geometry(value: Any) -> bytes:
    """Debezium's Geometry struct (``wkb``, ``srid``) as MySQL's internal form: SRID (4 bytes, little
    endian) then the WKB."""
    if not isinstance(value, dict) or "wkb" not in value:
        raise ValueError("a geometry value needs a wkb field")
    srid = int(value.get("srid") or 0)
    return srid.to_bytes(4, "little") + base64.b64decode(value["wkb"])


def _iso(value: Any) -> Any:
    """An ISO 8601 string of ``time.precision.mode=isostring``: a date (``YYYY-MM-DD[Z]``) or a time of
    day (``HH:MM:SS[.f][Z]``) loses its Z; a timestamp keeps it (UTC)."""
    text = str(value).strip()
    if text.endswith("Z") and "T" not in text:
        return text[:-1]
    return text

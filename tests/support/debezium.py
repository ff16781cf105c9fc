"""Debezium MySQL messages written the documented way, for the tests of freshkey's Debezium input.

:class:`DebeziumEncoder` writes the messages Debezium's MySQL connector would (mysql.adoc, "Data type
mappings" and "Data change events") from freshkey's JSON forms of a row; the unit tests of
``schemas.debezium`` and the integration test that feeds a worker Debezium topics built from the real
binlog both use it, so a decoding bug and an encoding bug cannot agree by accident in only one of them.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from schemas.values import ColumnType, JsonValue

VERSION = "2.7.0.Final"
"""The Debezium version the messages claim (``source.version``)."""

SOURCE_FIELDS = [
    {"type": "string", "optional": False, "field": "version"},
    {"type": "string", "optional": False, "field": "connector"},
    {"type": "string", "optional": False, "field": "name"},
    {"type": "int64", "optional": False, "field": "ts_ms"},
    {"type": "boolean", "optional": True, "default": False, "field": "snapshot"},
    {"type": "string", "optional": False, "field": "db"},
    {"type": "string", "optional": True, "field": "table"},
    {"type": "int64", "optional": False, "field": "server_id"},
    {"type": "string", "optional": True, "field": "gtid"},
    {"type": "string", "optional": False, "field": "file"},
    {"type": "int64", "optional": False, "field": "pos"},
    {"type": "int32", "optional": False, "field": "row"},
    {"type": "int64", "optional": True, "field": "thread"},
    {"type": "string", "optional": True, "field": "query"},
]
"""The documented ``source`` struct of a MySQL change event."""


def json_bytes(document: Any) -> bytes:
    """``document`` as the JSON converter's bytes."""
    return json.dumps(document).encode()


class DebeziumEncoder:
    """Writes Debezium MySQL messages the documented way (mysql.adoc, "Data type mappings") from freshkey's
    JSON forms, for tests: ``time.precision.mode=adaptive_time_microseconds``, ``decimal.handling.mode``
    precise, ``binary.handling.mode`` bytes, ``bigint.unsigned.handling.mode`` long, unless told otherwise."""

    def __init__(
        self, *, source_types: bool = False, binary_mode: str = "bytes", decimal_mode: str = "precise"
    ):
        self.source_types = source_types
        self.binary_mode = binary_mode
        self.decimal_mode = decimal_mode

    def field(self, name: str, column: ColumnType, *, optional: bool = True) -> dict[str, Any]:
        kind = column.kind
        field: dict[str, Any] = {"field": name, "optional": optional}
        if kind == "integer":
            wide = column.data_type == "bigint" or (column.unsigned and column.data_type == "int")
            field["type"] = (
                "int64" if wide else "int32" if column.data_type in ("mediumint", "int") else "int16"
            )
        elif kind == "decimal":
            if self.decimal_mode == "precise":
                field.update(type="bytes", name="org.apache.kafka.connect.data.Decimal")
                field["parameters"] = {"scale": str(column.scale or 0), "connect.decimal.precision": "65"}
            else:
                field["type"] = "string" if self.decimal_mode == "string" else "float64"
        elif kind in ("float", "double"):
            field["type"] = "float32" if kind == "float" else "float64"
        elif kind == "bit":
            if column.length == 1:
                field["type"] = "boolean"
            else:
                field.update(
                    type="bytes", name="io.debezium.data.Bits", parameters={"length": str(column.length)}
                )
        elif kind == "date":
            field.update(type="int32", name="io.debezium.time.Date")
        elif kind == "datetime":
            micro = (column.scale or 0) > 3
            field.update(
                type="int64",
                name="io.debezium.time.MicroTimestamp" if micro else "io.debezium.time.Timestamp",
            )
        elif kind == "timestamp":
            field.update(type="string", name="io.debezium.time.ZonedTimestamp")
        elif kind == "time":
            field.update(type="int64", name="io.debezium.time.MicroTime")
        elif kind == "year":
            field.update(type="int32", name="io.debezium.time.Year")
        elif kind in ("enum", "set"):
            name_ = "io.debezium.data.Enum" if kind == "enum" else "io.debezium.data.EnumSet"
            field.update(type="string", name=name_, parameters={"allowed": ",".join(column.members)})
        elif kind == "json":
            field.update(type="string", name="io.debezium.data.Json")
        elif kind == "geometry":
            field.update(
                type="struct",
                name="io.debezium.data.geometry.Geometry",
                fields=[
                    {"field": "wkb", "type": "bytes"},
                    {"field": "srid", "type": "int32", "optional": True},
                ],
            )
        elif kind == "binary":
            field["type"] = "bytes" if self.binary_mode == "bytes" else "string"
        else:
            field["type"] = "string"
        if self.source_types:
            params = field.setdefault("parameters", {})
            type_name = column.data_type.upper() + (" UNSIGNED" if column.unsigned else "")
            params["__debezium.source.column.type"] = type_name
            if column.length is not None:
                params["__debezium.source.column.length"] = str(column.length)
            if column.scale is not None:
                params["__debezium.source.column.scale"] = str(column.scale)
        return field

    def value(self, value: JsonValue, column: ColumnType) -> Any:
        """One column value as Debezium's JSON converter writes it."""
        if value is None:
            return None
        kind = column.kind
        if kind == "integer":
            number = int(str(value))
            if column.unsigned and column.data_type == "bigint" and number >= 2**63:
                return number - 2**64  # bigint.unsigned.handling.mode=long
            return number
        if kind == "decimal":
            exact = Decimal(str(value))
            if self.decimal_mode == "string":
                return str(value)
            if self.decimal_mode == "double":
                return float(exact)
            unscaled = int(exact.scaleb(column.scale or 0, decimal.Context(prec=200)))
            size = max(1, (unscaled.bit_length() + 8) // 8)
            return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()
        if kind == "bit":
            number = int(str(value))
            if column.length == 1:
                return bool(number)
            return base64.b64encode(number.to_bytes(((column.length or 1) + 7) // 8, "little")).decode()
        if kind == "date":
            return (dt.date.fromisoformat(str(value)) - dt.date(1970, 1, 1)).days
        if kind == "datetime":
            delta = dt.datetime.fromisoformat(str(value)) - dt.datetime(1970, 1, 1)
            micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
            return micros if (column.scale or 0) > 3 else micros // 1000
        if kind == "timestamp":
            return dt.datetime.fromisoformat(str(value)).isoformat() + "Z"
        if kind == "time":
            text = str(value)
            sign = -1 if text.startswith("-") else 1
            hours, minutes, seconds = text.lstrip("-").split(":")
            whole, frac = seconds.split(".")
            return sign * (((int(hours) * 60 + int(minutes)) * 60 + int(whole)) * 1_000_000 + int(frac))
        if kind == "year":
            return 1900 if value == 0 else value  # the binlog carries YEAR 0000 as 0, read back as 1900
        if kind == "set":
            chosen = set(value) if isinstance(value, list) else set()
            return ",".join(m for m in column.members if m in chosen)
        if kind == "json":
            return json.dumps(value)
        if kind == "geometry":
            data = base64.b64decode(str(value))
            return {"wkb": base64.b64encode(data[4:]).decode(), "srid": int.from_bytes(data[:4], "little")}
        if kind == "binary":
            data = base64.b64decode(str(value))
            if self.binary_mode == "hex":
                return data.hex()
            if self.binary_mode == "base64-url-safe":
                return base64.urlsafe_b64encode(data).decode()
            return str(value)
        return value

    def message(
        self,
        db: str,
        table: str,
        columns: Mapping[str, ColumnType],
        key_columns: tuple[str, ...],
        *,
        op: str,
        before: Mapping[str, JsonValue] | None,
        after: Mapping[str, JsonValue] | None,
        source: Mapping[str, Any],
        with_schema: bool = True,
        prefix: str = "dbserver1",
    ) -> tuple[bytes, bytes]:
        """(key, value) of one change event."""
        image = after if after is not None else before
        assert image is not None
        row_fields = [self.field(n, c) for n, c in columns.items()]
        payload = {
            "before": {n: self.value(v, columns[n]) for n, v in before.items()}
            if before is not None
            else None,
            "after": {n: self.value(v, columns[n]) for n, v in after.items()} if after is not None else None,
            "source": {
                "version": VERSION,
                "connector": "mysql",
                "name": prefix,
                "db": db,
                "table": table,
                **source,
            },
            "op": op,
            "ts_ms": 1_700_000_000_000,
        }
        key_payload = {n: self.value(image[n], columns[n]) for n in key_columns}
        if not with_schema:
            return json_bytes(key_payload), json_bytes(payload)
        envelope = {
            "type": "struct",
            "name": f"{prefix}.{db}.{table}.Envelope",
            "fields": [
                {"type": "struct", "fields": row_fields, "optional": True, "field": "before"},
                {"type": "struct", "fields": row_fields, "optional": True, "field": "after"},
                {"type": "struct", "fields": SOURCE_FIELDS, "field": "source"},
                {"type": "string", "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
            ],
        }
        key_fields = [self.field(n, columns[n], optional=False) for n in key_columns]
        key_schema = {"type": "struct", "name": f"{prefix}.{db}.{table}.Key", "fields": key_fields}
        return json_bytes({"schema": key_schema, "payload": key_payload}), json_bytes(
            {"schema": envelope, "payload": payload}
        )

"""JSON columns: the document itself, with integers beyond 64 bits as doubles (what orjson can encode)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson

from schemas.values.base import _finite, _key, _untyped
from schemas.values.columns import ColumnType, JsonValue

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

"""How database values become JSON values (the one conversion every room uses).

The binlog reader (pymysqlreplication) and a plain query (pymysql) return the same Python types for a
column, and both go through :func:`to_json_value`, so a cached value and a fresh read of the row compare
equal. The mapping is part of the cache contract (README, "Values"):

============================  ==============================================
column type                   JSON value
============================  ==============================================
integers, floats, strings     themselves
DECIMAL                       string (exact digits)
DATETIME/TIMESTAMP            ISO 8601 string with microseconds
DATE                          ISO 8601 date
TIME                          ``[-]HH:MM:SS.ffffff``
BLOB/BINARY/BIT               standard base64 string
SET                           sorted list of strings
JSON                          the JSON value
============================  ==============================================
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

JsonValue = None | bool | int | float | str | list[Any] | dict[str, Any]


def to_json_value(value: object) -> JsonValue:
    """Convert one database value to its JSON form (see the module table)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return str(value)
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
        return {_key(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v) for v in value]
    raise TypeError(f"no JSON form for a database value of type {type(value).__name__}")


def row_to_json(row: Mapping[str, object]) -> dict[str, JsonValue]:
    """Convert a whole row (column name -> value)."""
    return {str(k): to_json_value(v) for k, v in row.items()}


def _key(key: object) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


def _format_time(value: dt.timedelta) -> str:
    total_us = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    seconds, micros = divmod(total_us, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}:{secs:02d}.{micros:06d}"

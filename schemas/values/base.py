"""What every converter shares: the error for a value of the wrong form, the JSON forms of non-finite
floats and of TIME, and the mapping by Python type for values without a column type."""

from __future__ import annotations

import base64
import datetime as dt
import math
from collections.abc import Mapping
from decimal import Decimal

from schemas.values.columns import ColumnType, JsonValue


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


def _format_time(value: dt.timedelta) -> str:
    total_us = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    seconds, micros = divmod(total_us, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}:{secs:02d}.{micros:06d}"

"""Temporal column types: DATE, DATETIME, TIMESTAMP (in UTC) and TIME; zero dates are null."""

from __future__ import annotations

import datetime as dt
import re

from schemas.values.base import _format_time, _wrong
from schemas.values.columns import ColumnType, JsonValue


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

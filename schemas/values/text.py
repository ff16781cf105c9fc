"""Character and byte column types: strings, binary (base64), ENUM, SET, and MariaDB's UUID, INET4 and
INET6 in the server's text form."""

from __future__ import annotations

import base64
import ipaddress

from schemas.values.base import _wrong
from schemas.values.columns import ColumnType, JsonValue


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

"""Entry versions: a per-row number that only goes forward.

Every cache write and invalidation is a compare-and-set on this number (invariant 1). Versions are
unsigned 64-bit integers, stored in Redis as decimal strings and compared as integers.

Sources (chosen per connector with ``FRESHKEY_CONNECTOR_VERSION_SOURCE`` or per binding with
``version_column``):

``binlog`` (default)
    ``file_seq << 48 | end_pos << 16 | row`` where ``file_seq`` is the numeric suffix of the binlog file
    (``binlog.000042`` -> 42), ``end_pos`` the end position of the rows event in that file, and ``row`` the
    index of the row inside the event. Binlog order on one server is total, so the version of a later change
    is always larger. Bounds: 65,535 binlog files, 4 GiB per file, 65,536 rows per event (a rows event is
    at most a few KiB to MiB). Valid while the connector reads one server's binlog: after a fail-over to a
    replica, file names and positions differ -- use ``gtid`` or a column then.
``gtid``
    ``seq << 24 | ordinal``: the transaction's GTID sequence number (MariaDB ``domain-server-seq``: ``seq``;
    MySQL ``uuid:gno``: ``gno``) and the row's ordinal inside the transaction (< 16,777,216). Survives a
    fail-over inside one MariaDB GTID domain or one MySQL source uuid; not comparable across domains.
``column``
    A row column named in the binding: a non-negative integer (e.g. ``version`` bumped by the application)
    or a DATETIME(6)/TIMESTAMP(6) (e.g. ``updated_at``), taken as microseconds since the Unix epoch (UTC).
    The application must make it grow with every change of the row, deletes included.
"""

from __future__ import annotations

import datetime as dt
import functools
import re

from schemas.errors import InvalidInput

MAX_VERSION = 2**64 - 1
_FILE_BITS, _POS_BITS, _ROW_BITS = 16, 32, 16
_GTID_ORDINAL_BITS = 24
_FILE_SUFFIX = re.compile(r"\.(\d+)$")
_EPOCH = dt.datetime(1970, 1, 1)


class VersionError(InvalidInput):
    """A version cannot be computed from the given input."""


@functools.lru_cache(maxsize=64)
def binlog_file_seq(file: str) -> int:
    """The numeric suffix of a binlog file name (``mysql-bin.000123`` -> 123).

    Cached: the connector asks once per rows event, for the few files it reads (a name that has no
    suffix raises, and is not cached)."""
    match = _FILE_SUFFIX.search(file)
    if match is None:
        raise VersionError(f"binlog file name {file!r} has no numeric suffix")
    return int(match.group(1))


def binlog_version(file: str, end_pos: int, row: int) -> int:
    """Version from binlog coordinates (see the module docstring for the formula and its bounds)."""
    seq = binlog_file_seq(file)
    if not 0 <= seq < 2**_FILE_BITS:
        raise VersionError(f"binlog file sequence {seq} out of range (< {2**_FILE_BITS})")
    if not 0 <= end_pos < 2**_POS_BITS:
        raise VersionError(f"binlog position {end_pos} out of range (< 2**32)")
    if not 0 <= row < 2**_ROW_BITS:
        raise VersionError(f"row index {row} inside one rows event out of range (< {2**_ROW_BITS})")
    return seq << (_POS_BITS + _ROW_BITS) | end_pos << _ROW_BITS | row


def gtid_sequence(gtid: str) -> int:
    """The transaction sequence number of a MariaDB (``0-1-42``) or MySQL (``uuid:42``) GTID."""
    tail = gtid.rsplit(":", 1)[1] if ":" in gtid else gtid.rsplit("-", 1)[-1]
    if not _is_decimal(tail):
        raise VersionError(f"cannot read a sequence number from GTID {gtid!r}")
    return int(tail)


def _is_decimal(text: str) -> bool:
    return text.isascii() and text.isdecimal()


def gtid_version(gtid: str, ordinal: int) -> int:
    """Version from a GTID and the row's ordinal inside its transaction."""
    if not 0 <= ordinal < 2**_GTID_ORDINAL_BITS:
        raise VersionError(f"row ordinal {ordinal} inside one transaction out of range")
    version = gtid_sequence(gtid) << _GTID_ORDINAL_BITS | ordinal
    if version > MAX_VERSION:
        raise VersionError(f"GTID {gtid!r} gives a version beyond 64 bits")
    return version


def column_version(value: object) -> int:
    """Version from a row column: an integer, or a datetime (JSON: ISO string) as epoch microseconds."""
    if isinstance(value, bool):
        raise VersionError("a boolean column cannot be a version")
    if isinstance(value, int):
        if not 0 <= value <= MAX_VERSION:
            raise VersionError(f"version column value {value} is not an unsigned 64-bit integer")
        return value
    if isinstance(value, str):
        if _is_decimal(value):
            return column_version(int(value))
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise VersionError(f"version column value {value!r} is not an integer or a datetime") from None
    if isinstance(value, dt.datetime):
        micros = datetime_to_us(value)
        if micros < 0:
            raise VersionError(f"version column value {value.isoformat()} is before 1970-01-01 (UTC)")
        return micros
    raise VersionError(f"version column value of type {type(value).__name__} is not usable")


def datetime_to_us(value: dt.datetime) -> int:
    """Microseconds since the Unix epoch; a naive datetime is taken as UTC."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds

"""schemas.versions: versions only go forward along binlog order; GTID and column versions."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.versions import (
    MAX_VERSION,
    VersionError,
    binlog_file_seq,
    binlog_version,
    column_version,
    datetime_to_us,
    gtid_sequence,
    gtid_version,
)

# 2024-01-01T00:00:00Z in seconds since the epoch (19723 days * 86400).
JAN_1_2024_S = 1_704_067_200


# --- binlog coordinates ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "seq"),
    [("binlog.000042", 42), ("mysql-bin.000123", 123), ("host-bin.1", 1), ("a.b.000007", 7), ("x.0", 0)],
)
def test_binlog_file_seq(name: str, seq: int) -> None:
    assert binlog_file_seq(name) == seq


@pytest.mark.parametrize("name", ["binlog", "binlog.", "binlog.00a1", "binlog.000001.index", ""])
def test_binlog_file_seq_without_numeric_suffix(name: str) -> None:
    with pytest.raises(VersionError, match="numeric suffix"):
        binlog_file_seq(name)


def test_binlog_version_formula() -> None:
    assert binlog_version("binlog.000000", 0, 0) == 0
    assert binlog_version("binlog.000001", 0, 0) == 1 << 48
    assert binlog_version("binlog.000001", 1, 0) == (1 << 48) | (1 << 16)
    assert binlog_version("binlog.000001", 1, 1) == (1 << 48) | (1 << 16) | 1
    assert binlog_version("binlog.065535", 2**32 - 1, 2**16 - 1) == MAX_VERSION


def test_binlog_version_examples_in_binlog_order() -> None:
    ordered = [
        ("binlog.000001", 4, 0),
        ("binlog.000001", 4, 1),
        ("binlog.000001", 4, 65535),
        ("binlog.000001", 5, 0),
        ("binlog.000001", 2**32 - 1, 65535),
        ("binlog.000002", 0, 0),  # next file, any position
        ("binlog.000002", 4, 0),
        ("binlog.000010", 0, 0),
    ]
    versions = [binlog_version(*c) for c in ordered]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)


_file_seq = st.integers(0, 2**16 - 1)
_pos = st.integers(0, 2**32 - 1)
_row = st.integers(0, 2**16 - 1)
_coords = st.tuples(_file_seq, _pos, _row)


@settings(max_examples=200, deadline=None)
@given(_coords, _coords)
def test_binlog_version_preserves_binlog_order(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    va = binlog_version(f"binlog.{a[0]:06d}", a[1], a[2])
    vb = binlog_version(f"binlog.{b[0]:06d}", b[1], b[2])
    assert (a < b) == (va < vb)
    assert (a == b) == (va == vb)
    assert 0 <= va <= MAX_VERSION


@settings(max_examples=200, deadline=None)
@given(_coords, st.integers(1, 2**16 - 1), st.integers(1, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_binlog_version_later_change_is_larger(
    c: tuple[int, int, int], drow: int, dpos: int, any_pos: int
) -> None:
    seq, pos, row = c
    v = binlog_version(f"binlog.{seq:06d}", pos, row)
    if row + drow < 2**16:  # same event, a later row
        assert binlog_version(f"binlog.{seq:06d}", pos, row + drow) > v
    if pos + dpos < 2**32:  # same file, a later event (row index restarts)
        assert binlog_version(f"binlog.{seq:06d}", pos + dpos, 0) > v
    if seq + 1 < 2**16:  # next file, any position
        assert binlog_version(f"binlog.{seq + 1:06d}", any_pos % 2**32, 0) > v


@pytest.mark.parametrize(
    ("file", "pos", "row", "words"),
    [
        ("binlog.065536", 0, 0, "file sequence"),
        ("binlog.999999", 0, 0, "file sequence"),
        ("binlog.000001", 2**32, 0, "position"),
        ("binlog.000001", -1, 0, "position"),
        ("binlog.000001", 0, 2**16, "row index"),
        ("binlog.000001", 0, -1, "row index"),
        ("binlog", 0, 0, "numeric suffix"),
    ],
)
def test_binlog_version_bounds(file: str, pos: int, row: int, words: str) -> None:
    with pytest.raises(VersionError, match=words):
        binlog_version(file, pos, row)


# --- GTIDs -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gtid", "seq"),
    [
        ("0-1-42", 42),
        ("12-3000-1", 1),
        ("0-1-18446744073709551615", 2**64 - 1),
        ("3E11FA47-71CA-11E1-9E33-C80AA9429562:23", 23),
        ("3e11fa47-71ca-11e1-9e33-c80aa9429562:1", 1),
        ("3E11FA47-71CA-11E1-9E33-C80AA9429562:mytag:7", 7),  # MySQL 8.4 tagged GTID
    ],
)
def test_gtid_sequence(gtid: str, seq: int) -> None:
    assert gtid_sequence(gtid) == seq


@pytest.mark.parametrize(
    "gtid", ["", "0-1-", "abc", "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5", "uuid:", "0-1-4x2"]
)
def test_gtid_sequence_unreadable(gtid: str) -> None:
    with pytest.raises(VersionError, match="sequence number"):
        gtid_sequence(gtid)


def test_gtid_version_formula_and_order() -> None:
    assert gtid_version("0-1-42", 0) == 42 << 24
    assert gtid_version("0-1-42", 5) == (42 << 24) | 5
    assert gtid_version("3E11FA47-71CA-11E1-9E33-C80AA9429562:23", 1) == (23 << 24) | 1
    assert gtid_version("0-1-42", 2**24 - 1) < gtid_version("0-1-43", 0)
    assert gtid_version("0-1-42", 1) < gtid_version("0-1-42", 2)
    # The server id part of a MariaDB GTID does not matter (survives fail-over inside the domain).
    assert gtid_version("0-1-42", 3) == gtid_version("0-2-42", 3)


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(st.integers(0, 2**40 - 1), st.integers(0, 2**24 - 1)),
    st.tuples(st.integers(0, 2**40 - 1), st.integers(0, 2**24 - 1)),
)
def test_gtid_version_preserves_transaction_order(a: tuple[int, int], b: tuple[int, int]) -> None:
    va = gtid_version(f"0-1-{a[0]}", a[1])
    vb = gtid_version(f"3E11FA47-71CA-11E1-9E33-C80AA9429562:{b[0]}", b[1])
    assert (a < b) == (va < vb)
    assert (a == b) == (va == vb)
    assert va <= MAX_VERSION


@pytest.mark.parametrize(("gtid", "ordinal"), [("0-1-1", -1), ("0-1-1", 2**24)])
def test_gtid_version_ordinal_bounds(gtid: str, ordinal: int) -> None:
    with pytest.raises(VersionError, match="ordinal"):
        gtid_version(gtid, ordinal)


def test_gtid_version_beyond_64_bits() -> None:
    assert gtid_version(f"0-1-{2**40 - 1}", 2**24 - 1) == MAX_VERSION
    with pytest.raises(VersionError, match="64 bits"):
        gtid_version(f"0-1-{2**40}", 0)


# --- column versions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "version"),
    [
        (0, 0),
        (5, 5),
        (MAX_VERSION, MAX_VERSION),
        ("5", 5),
        ("0005", 5),
        ("18446744073709551615", MAX_VERSION),
        ("2024-01-01 00:00:00", JAN_1_2024_S * 1_000_000),
        ("2024-01-01T00:00:00.000001", JAN_1_2024_S * 1_000_000 + 1),
        ("2024-01-01 00:00:01.250000", (JAN_1_2024_S + 1) * 1_000_000 + 250_000),
        ("2024-01-01T01:00:00+01:00", JAN_1_2024_S * 1_000_000),
        ("1970-01-01 00:00:00", 0),
        (dt.datetime(2024, 1, 1, 0, 0, 0, 7), JAN_1_2024_S * 1_000_000 + 7),
        (dt.datetime(2024, 1, 1, 0, 0, 0, 7, tzinfo=dt.UTC), JAN_1_2024_S * 1_000_000 + 7),
        (
            dt.datetime(2023, 12, 31, 19, 0, 0, 7, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
            JAN_1_2024_S * 1_000_000 + 7,
        ),
    ],
)
def test_column_version(value: object, version: int) -> None:
    assert column_version(value) == version


def test_column_version_naive_string_is_utc_whatever_the_local_zone() -> None:
    aware = dt.datetime(2024, 6, 30, 12, 34, 56, 789012, tzinfo=dt.UTC)
    assert column_version("2024-06-30 12:34:56.789012") == column_version(aware)
    assert column_version(aware) == int(aware.timestamp()) * 1_000_000 + 789012


@settings(max_examples=200, deadline=None)
@given(
    st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(9999, 12, 31)),
    st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(9999, 12, 31)),
)
def test_datetime_column_version_preserves_time_order(a: dt.datetime, b: dt.datetime) -> None:
    va, vb = column_version(a.isoformat(sep=" ")), column_version(b)
    assert (a < b) == (va < vb)
    assert (a == b) == (va == vb)
    assert va == datetime_to_us(a)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (True, "boolean"),
        (False, "boolean"),
        (-1, "unsigned 64-bit"),
        (MAX_VERSION + 1, "unsigned 64-bit"),
        ("18446744073709551616", "unsigned 64-bit"),
        ("-5", "not an integer or a datetime"),
        ("", "not an integer or a datetime"),
        ("yesterday", "not an integer or a datetime"),
        ("0000-00-00 00:00:00", "not an integer or a datetime"),
        (1.5, "float"),
        (None, "NoneType"),
        (dt.date(2024, 1, 1), "date"),
        (b"5", "bytes"),
    ],
)
def test_column_version_rejects(value: object, words: str) -> None:
    with pytest.raises(VersionError, match=words):
        column_version(value)


@pytest.mark.parametrize("value", ["1969-12-31 23:59:59", dt.datetime(1000, 1, 1)])
def test_column_version_rejects_datetimes_before_the_epoch(value: object) -> None:
    with pytest.raises(VersionError):
        column_version(value)


@pytest.mark.parametrize("call", [lambda: column_version("\u00b2"), lambda: gtid_sequence("0-1-\u00b2")])
def test_unicode_digits_raise_version_error(call: object) -> None:
    with pytest.raises(VersionError):
        call()  # type: ignore[operator]

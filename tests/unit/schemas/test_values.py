"""schemas.values: one JSON form per MySQL column type, whatever driver gave the value.

Each property test builds a value of a column type, writes it in the form each source gives (the binlog
reader mysql-replication 1.0.x, pymysql's read, a printed text form) and checks that every form maps to
the same JSON value, that the value is valid JSON, and that mapping the JSON form again changes nothing.
The binlog reader's negative-TIME bug is reproduced by running the reader's own decoding code on bytes
encoded the way MySQL stores TIME2 (sql/my_time.cc, ``my_time_packed_to_binary``).
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import math
import struct
import uuid
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import RowsEvent

from schemas.codec import encode_value
from schemas.values import (
    EMPTY_SET,
    ColumnType,
    binlog_column_types,
    binlog_row_to_json,
    binlog_value,
    column_type_from_binlog,
    column_type_from_information_schema,
    float32_json,
    json_checked_columns,
    json_to_sql,
    row_to_json,
    to_json_value,
)

# -- values without a column type: by Python type, as before -------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, True),
        (0, 0),
        (-42, -42),
        (2**64 - 1, 2**64 - 1),
        (1.5, 1.5),
        ("text \u00e9", "text \u00e9"),
        (Decimal("12.50"), "12.50"),
        (dt.datetime(2024, 1, 2, 3, 4, 5, 6), "2024-01-02T03:04:05.000006"),
        (dt.date(2024, 2, 29), "2024-02-29"),
        (dt.timedelta(microseconds=-1), "-00:00:00.000001"),
        (b"\x00\xff", "AP8="),
        (bytes([0xFB, 0xFF]), "+/8="),  # standard alphabet, not URL-safe
        ({"video", "audio"}, ["audio", "video"]),
        ({b"k": [1, b"\x01"]}, {"k": [1, "AQ=="]}),
    ],
)
def test_untyped_values_map_by_python_type(value: object, expected: object) -> None:
    result = to_json_value(value)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("value", "expected"), [(math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")]
)
@pytest.mark.parametrize("column", [None, ColumnType("double"), ColumnType("float")])
def test_non_finite_floats_become_documented_strings(
    value: float, expected: str, column: ColumnType | None
) -> None:
    # orjson would write NaN as null: a value that is not null in the database must never read as null.
    assert to_json_value(value, column) == expected


@pytest.mark.parametrize("value", [object(), 1 + 2j, dt.time(12, 0), [object()], {"k": object()}])
def test_unknown_python_type_raises_type_error(value: object) -> None:
    with pytest.raises(TypeError, match="no JSON form"):
        to_json_value(value)


@pytest.mark.parametrize(
    ("value", "column"),
    [
        ("abc", ColumnType("int")),
        (b"x", ColumnType("decimal")),
        (3, ColumnType("date")),
        (1.5, ColumnType("time")),
        (object(), ColumnType("varbinary")),
        ("2x", ColumnType("bit")),
    ],
)
def test_a_value_that_is_no_form_of_its_column_type_raises(value: object, column: ColumnType) -> None:
    with pytest.raises(TypeError, match=column.data_type.upper()):
        to_json_value(value, column)


# -- the issue's examples (MariaDB 10.11: binlog vs direct read) ---------------------------------------------


@pytest.mark.parametrize(
    ("column", "binlog", "none_source", "read", "expected"),
    [
        (ColumnType("bit", length=64), "1" * 64, None, b"\xff" * 8, 2**64 - 1),
        (ColumnType("set", members=("x", "y", "z")), {"z", "x"}, None, "x,z", ["x", "z"]),
        (ColumnType("set", members=("x", "y")), None, EMPTY_SET, "", []),
        (ColumnType("year"), 1900, None, 0, 0),
        (ColumnType("time", scale=6), -dt.timedelta(microseconds=999_999), None, "-00:00:00.000001", None),
        (ColumnType("binary", length=4), "", None, b"\x00" * 4, "AAAAAA=="),
        (ColumnType("binary", length=4), b"\x01", None, b"\x01\x00\x00\x00", "AQAAAA=="),
        (ColumnType("float"), -3.3999999521443642e38, None, -3.4e38, -3.4e38),
        (ColumnType("float"), 16777216.0, None, 16777216.0, 16777216.0),
        (ColumnType("json"), '{"a": [1, 2.5]}', None, '{"a": [1, 2.5]}', {"a": [1, 2.5]}),
        (ColumnType("timestamp"), dt.datetime(1970, 1, 1), None, "0000-00-00 00:00:00", None),
        (ColumnType("date"), None, "out of date range", "0000-00-00", None),
        (
            ColumnType("uuid"),
            b"\x12>Eg\xe8\x9b\x12\xd3\xa4VBfUD",
            None,
            "123e4567-e89b-12d3-a456-426655440000",
            None,
        ),
        (ColumnType("inet6"), "", None, "::", "::"),
    ],
)
def test_binlog_and_read_forms_give_the_same_json(
    column: ColumnType, binlog: object, none_source: str | None, read: object, expected: object
) -> None:
    from_binlog = to_json_value(binlog_value(binlog, column, none_source), column)
    from_read = to_json_value(read, column)
    assert from_binlog == from_read
    if expected is not None:
        assert from_read == expected
    assert orjson.dumps(from_binlog) == orjson.dumps(from_read)


# -- the binlog reader's TIME2 decoding, run on MySQL's encoding ---------------------------------------------


class _Packet:
    """Just enough of pymysqlreplication's packet for its TIME2 reader, reusing the reader's own methods."""

    read_int_be_by_size = BinLogPacketWrapper.read_int_be_by_size
    read_int24_be = BinLogPacketWrapper.read_int24_be
    read_int40_be = BinLogPacketWrapper.read_int40_be

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def read(self, size: int | float) -> bytes:
        return self._data.read(int(size))


def _mysql_time2_bytes(micros: int, fsp: int) -> bytes:
    """TIME(fsp) as MySQL stores it (my_time_packed_to_binary; C integer division truncates)."""
    sign = -1 if micros < 0 else 1
    magnitude = abs(micros)
    seconds, frac = divmod(magnitude, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    packed = sign * ((((hours << 12) | (minutes << 6) | secs) << 24) + frac)
    int_part = packed >> 24  # arithmetic shift: floor
    frac_part = int(math.copysign(abs(packed) % (1 << 24), packed)) if packed else 0  # C's %
    if fsp >= 5:
        return (packed + 0x800000000000).to_bytes(6, "big")
    head = (0x800000 + int_part).to_bytes(3, "big")
    if fsp in (1, 2):
        return head + struct.pack(">b", int(frac_part / 10000))
    if fsp in (3, 4):
        return head + struct.pack(">h", int(frac_part / 100))
    return head


def _read_time2(data: bytes, fsp: int) -> dt.timedelta:
    event = object.__new__(RowsEvent)
    event.packet = _Packet(data)
    value: dt.timedelta = event._RowsEvent__read_time2(SimpleNamespace(fsp=fsp))
    return value


_TIME_LIMIT = (838 * 3600 + 59 * 60 + 59) * 1_000_000 + 999_999


@given(st.integers(-_TIME_LIMIT, _TIME_LIMIT), st.integers(0, 6))
@settings(max_examples=400)
def test_negative_fractional_time_from_the_binlog_reader_is_restored(micros: int, fsp: int) -> None:
    step = 10 ** (6 - fsp)
    micros = int(math.copysign(abs(micros) // step * step, micros))  # a value TIME(fsp) can hold
    true = dt.timedelta(microseconds=micros)
    column = ColumnType("time", scale=fsp)
    from_reader = _read_time2(_mysql_time2_bytes(micros, fsp), fsp)
    assert to_json_value(binlog_value(from_reader, column), column) == to_json_value(true, column)


def test_the_binlog_reader_still_has_the_time_bug_the_fix_undoes() -> None:
    # If mysql-replication fixes its TIME2 decoding, binlog_value must stop undoing it: this test says so.
    assert _read_time2(_mysql_time2_bytes(-1, 6), 6) == -dt.timedelta(microseconds=999_999)
    assert _read_time2(_mysql_time2_bytes(-1_001_000, 3), 3) == -dt.timedelta(seconds=1, microseconds=999_000)


# -- one property per type: every source's form, one JSON value ----------------------------------------------


# Kinds whose JSON form is not itself a form of the type (base64 is taken as the bytes of a string...).
_NOT_FIXED_POINTS = ("binary", "geometry", "bit", "json", "set")


def _same(column: ColumnType, *forms: object) -> object:
    results = [to_json_value(form, column) for form in forms]
    first = results[0]
    for other in results[1:]:
        assert orjson.dumps(other) == orjson.dumps(first), (column, forms)
    assert orjson.loads(orjson.dumps(first)) == first
    if column.kind not in _NOT_FIXED_POINTS:
        assert to_json_value(first, column) == first, "mapping the JSON form again changes it"
    return first


@given(st.integers(1, 64), st.data())
def test_bit(n: int, data: st.DataObject) -> None:
    value = data.draw(st.integers(0, 2**n - 1))
    result = _same(ColumnType("bit", length=n), format(value, f"0{n}b"), value.to_bytes((n + 7) // 8, "big"))
    assert result == value


@given(st.integers(1, 65), st.data())
def test_decimal(precision: int, data: st.DataObject) -> None:
    scale = data.draw(st.integers(0, min(30, precision)))
    unscaled = data.draw(st.integers(-(10**precision) + 1, 10**precision - 1))
    value = Decimal(unscaled).scaleb(-scale)
    column = ColumnType("decimal", scale=scale)
    result = _same(column, value, format(value, "f"))
    assert isinstance(result, str) and Decimal(result) == value
    assert len(result.partition(".")[2]) == scale


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_float_keeps_its_single_precision_value(single: float) -> None:
    column = ColumnType("float")
    result = _same(column, single, repr(single), Decimal(repr(single)))
    assert isinstance(result, float)
    assert struct.pack("<f", result) == struct.pack("<f", single), "not the same float32"
    # shortest: one digit fewer does not read back as the same float32
    digits = len(f"{result:.9g}".split("e")[0].replace("-", "").replace(".", "").strip("0")) or 1
    if digits > 1:
        shorter = float(f"{single:.{digits - 1}g}")
        assert struct.pack("<f", shorter) != struct.pack("<f", single)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_double(value: float) -> None:
    assert _same(ColumnType("double"), value, repr(value)) == value


@given(st.dates(dt.date(1000, 1, 1), dt.date(9999, 12, 31)))
def test_date(value: dt.date) -> None:
    assert _same(ColumnType("date"), value, value.isoformat()) == value.isoformat()


@given(st.datetimes(dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59)), st.integers(0, 6))
def test_datetime(value: dt.datetime, fsp: int) -> None:
    value = value.replace(microsecond=value.microsecond // 10 ** (6 - fsp) * 10 ** (6 - fsp))
    result = _same(ColumnType("datetime", scale=fsp), value, str(value))
    assert result == value.isoformat(timespec="microseconds")


@given(st.datetimes(dt.datetime(1970, 1, 1, 0, 0, 1), dt.datetime(2038, 1, 19, 3, 14, 7)))
def test_timestamp_is_utc_from_naive_and_aware_forms(value: dt.datetime) -> None:
    aware = value.replace(tzinfo=dt.UTC).astimezone(dt.timezone(dt.timedelta(hours=-7)))
    zulu = value.isoformat() + "Z"
    assert _same(ColumnType("timestamp"), value, aware, zulu) == value.isoformat(timespec="microseconds")


@given(st.integers(-_TIME_LIMIT, _TIME_LIMIT))
def test_time(micros: int) -> None:
    value = dt.timedelta(microseconds=micros)
    text = to_json_value(value, ColumnType("time"))
    assert _same(ColumnType("time"), value, text) == text


@given(st.sampled_from([0, *range(1901, 2156)]))
def test_year(year: int) -> None:
    binlog = 1900 if year == 0 else year
    assert _same(ColumnType("year"), binlog_value(binlog, ColumnType("year")), year, str(year)) == year


_MEMBER = st.text(
    st.characters(blacklist_characters=",", blacklist_categories=["Cs"]), min_size=1, max_size=5
)


@given(st.lists(_MEMBER, min_size=1, max_size=8, unique=True), st.data())
def test_set(members: list[str], data: st.DataObject) -> None:
    column = ColumnType("set", members=tuple(members))
    chosen = data.draw(st.sets(st.sampled_from(members)))
    binlog = binlog_value(chosen or None, column, EMPTY_SET if not chosen else None)
    read = ",".join(m for m in members if m in chosen)  # MySQL prints members in their defined order
    mask = sum(1 << i for i, m in enumerate(members) if m in chosen)
    assert _same(column, binlog, read, mask) == sorted(chosen)


@given(st.integers(1, 255), st.data())
def test_binary_keeps_every_byte(n: int, data: st.DataObject) -> None:
    value = data.draw(st.binary(max_size=n)).ljust(n, b"\x00")
    stripped = value.rstrip(b"\x00")
    binlog: object = stripped if stripped else ""  # the reader gives "" for no bytes
    result = _same(ColumnType("binary", length=n), binlog, value)
    assert base64.b64decode(str(result)) == value


@given(st.binary(max_size=300))
def test_varbinary_and_blob(value: bytes) -> None:
    for data_type in ("varbinary", "blob", "longblob", "geometry"):
        result = _same(ColumnType(data_type), value, bytearray(value), memoryview(value))
        assert base64.b64decode(str(result), validate=True) == value


@given(st.text(st.characters(blacklist_categories=["Cs"])))
def test_text_including_four_byte_characters(value: str) -> None:
    assert _same(ColumnType("varchar"), value, value.encode()) == value


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=["Cs"])),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(st.characters(blacklist_categories=["Cs"]), max_size=6), children, max_size=4
        )
    ),
    max_leaves=12,
)


def _mysql_binary_json(value: Any) -> Any:
    """What the binlog reader returns for MySQL's binary JSON: strings and keys as bytes."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict):
        return {k.encode(): _mysql_binary_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mysql_binary_json(v) for v in value]
    return value


@given(_JSON)
def test_json_documents(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False)
    result = _same(
        ColumnType("json"), text, text.encode(), _mysql_binary_json(value), json.dumps(value, indent=2)
    )
    assert result == value


@given(st.uuids())
def test_uuid(value: uuid.UUID) -> None:
    stripped = value.bytes.rstrip(b"\x00")
    assert _same(ColumnType("uuid"), stripped or "", str(value)) == str(value)


@pytest.mark.parametrize(
    ("text", "packed"),
    [
        ("2001:db8::ff00:42:8329", "20010db8000000000000ff0000428329"),
        ("::ffff:1.2.3.4", "00000000000000000000ffff01020304"),
        ("::1.2.3.4", "00000000000000000000000001020304"),
        ("::1", "00000000000000000000000000000001"),
        ("::", "00000000000000000000000000000000"),
    ],
)
def test_inet6_from_binlog_bytes_reads_like_mariadb(text: str, packed: str) -> None:
    data = bytes.fromhex(packed).rstrip(b"\x00")
    assert _same(ColumnType("inet6"), data or "", text) == text
    assert _same(ColumnType("inet4"), b"\xc0\xa8\x00\x01", "192.168.0.1") == "192.168.0.1"


def test_integers_and_bool_are_numbers_never_booleans() -> None:
    column = ColumnType("tinyint")
    assert to_json_value(True, column) == 1 and type(to_json_value(True, column)) is int
    assert to_json_value(Decimal("18446744073709551615"), ColumnType("bigint", unsigned=True)) == 2**64 - 1


def test_enum_by_member_or_stored_index() -> None:
    column = ColumnType("enum", members=("a", "b"))
    assert [to_json_value(v, column) for v in ("b", 2, 0, "")] == ["b", "b", "", ""]


# -- column types from the binlog's table map and from information_schema ------------------------------------


def _binlog_column(name: str, code: int, **extra: Any) -> SimpleNamespace:
    base = {"name": name, "type": code, "unsigned": False, "character_set_name": None}
    return SimpleNamespace(**{**base, **extra})


def test_column_types_from_the_table_map() -> None:
    columns = [
        _binlog_column("id", 3, unsigned=True),
        _binlog_column("bn", 254, character_set_name="binary", max_length=4),
        _binlog_column("c", 254, character_set_name="utf8", max_length=40),
        _binlog_column("vb", 15, character_set_name="binary", max_length=16),
        _binlog_column("tx", 252, character_set_name="utf8", length_size=2),
        _binlog_column("bl", 252, character_set_name="binary", length_size=2),
        _binlog_column("bits", 16, bits=10, bytes=2),
        _binlog_column("d", 246, precision=10, decimals=2),
        _binlog_column("t", 19, fsp=3),
        _binlog_column("e", 247, enum_values=["", "a", "b"], character_set_name="utf8"),
        _binlog_column("s", 248, set_values=["x", "y"], character_set_name="utf8"),
        _binlog_column("js", 252, character_set_name="utf8", length_size=4),  # MariaDB JSON
        _binlog_column("u", 254, character_set_name="binary", max_length=16),  # MariaDB UUID
        _binlog_column("mj", 245, length_size=4),  # MySQL JSON
        _binlog_column("nometa", 15, max_length=10),
    ]
    refine = {
        "js": ColumnType("json"),
        "u": ColumnType("uuid"),
        "c": ColumnType("json"),  # CHAR is text too: refined alike
        "bn": ColumnType("int"),  # information_schema after an ALTER: the table map decides
    }
    types = binlog_column_types(columns, refine)
    assert types["id"] == ColumnType("int", unsigned=True)
    assert types["bn"] == ColumnType("binary", length=4)
    assert types["c"] == ColumnType("json")
    assert types["vb"] == ColumnType("varbinary")
    assert types["tx"].kind == "text" and types["bl"].kind == "binary"
    assert types["bits"] == ColumnType("bit", length=10)
    assert types["d"] == ColumnType("decimal", scale=2)
    assert types["t"] == ColumnType("time", scale=3)
    assert types["e"] == ColumnType("enum", members=("a", "b"))
    assert types["s"] == ColumnType("set", members=("x", "y"))
    assert types["js"] == ColumnType("json") and types["u"] == ColumnType("uuid")
    assert types["mj"] == ColumnType("json")
    assert types["nometa"].kind == "string"
    assert column_type_from_binlog(_binlog_column("x", 200)).kind == "unknown"


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"DATA_TYPE": "int", "COLUMN_TYPE": "int(10) unsigned"}, ColumnType("int", unsigned=True)),
        ({"data_type": "BINARY", "column_type": "binary(4)"}, ColumnType("binary", length=4)),
        ({"DATA_TYPE": "bit", "COLUMN_TYPE": "bit(64)"}, ColumnType("bit", length=64)),
        (
            {"DATA_TYPE": "decimal", "COLUMN_TYPE": "decimal(10,2)", "NUMERIC_SCALE": 2},
            ColumnType("decimal", scale=2),
        ),
        (
            {"DATA_TYPE": "datetime", "COLUMN_TYPE": "datetime(6)", "DATETIME_PRECISION": 6},
            ColumnType("datetime", scale=6),
        ),
        (
            {"DATA_TYPE": "enum", "COLUMN_TYPE": "enum('a','it''s','x,y')"},
            ColumnType("enum", members=("a", "it's", "x,y")),
        ),
        ({"DATA_TYPE": "set", "COLUMN_TYPE": "set('x','y')"}, ColumnType("set", members=("x", "y"))),
        ({"DATA_TYPE": "float", "COLUMN_TYPE": "float(7,2)"}, ColumnType("float")),
        ({"DATA_TYPE": "json", "COLUMN_TYPE": "json"}, ColumnType("json")),
        ({"DATA_TYPE": "uuid", "COLUMN_TYPE": "uuid"}, ColumnType("uuid")),
    ],
)
def test_column_types_from_information_schema(row: dict[str, Any], expected: ColumnType) -> None:
    assert column_type_from_information_schema(row) == expected


def test_mariadb_json_is_a_checked_longtext() -> None:
    clauses = ["json_valid(`js`)", "JSON_VALID(`we``ird`)", "`n` > 0", "json_valid(`a`) and `b` > 1"]
    assert json_checked_columns(clauses) == {"js", "we`ird"}
    row = {"DATA_TYPE": "longtext", "COLUMN_TYPE": "longtext"}
    assert column_type_from_information_schema(row, json_checked=True) == ColumnType("json")
    assert column_type_from_information_schema(row).kind == "text"


def test_json_to_sql_turns_key_forms_back_into_parameters() -> None:
    assert json_to_sql("AAE=", ColumnType("varbinary")) == b"\x00\x01"
    assert json_to_sql(5, ColumnType("bit", length=3)) == 5
    assert json_to_sql("x", None) == "x"
    with pytest.raises(ValueError, match="base64"):
        json_to_sql("not base64!", ColumnType("binary", length=4))


def test_rows_typed_and_untyped_are_serialisable_and_stable() -> None:
    columns = {"id": ColumnType("int"), "f": ColumnType("float"), "st": ColumnType("set", members=("a", "b"))}
    row = {"id": 7, "f": 0.10000000149011612, "st": "b,a", "extra": b"\x00"}
    converted = row_to_json(row, columns)
    assert converted == {"id": 7, "f": 0.1, "st": ["a", "b"], "extra": "AA=="}
    assert encode_value(converted) == b'{"extra":"AA==","f":0.1,"id":7,"st":["a","b"]}'
    binlog = binlog_row_to_json({"id": 7, "st": None, "f": 0.10000000149011612}, columns, {"st": EMPTY_SET})
    assert binlog == {"id": 7, "st": [], "f": 0.1}


def test_float32_json_edges() -> None:
    assert float32_json(-3.3999999521443642e38) == -3.4e38
    assert float32_json(1.401298464324817e-45) == 1e-45
    assert float32_json(0.10000000149011612) == 0.1
    assert math.copysign(1, float32_json(-0.0)) == -1  # type: ignore[arg-type]
    assert float32_json(1e300) == 1e300  # not a float32: kept


def test_float32_json_at_the_edge_of_the_range() -> None:
    largest = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]  # 3.4028234663852886e38
    result = float32_json(largest)
    assert struct.pack("<f", result) == b"\xff\xff\x7f\x7f"
    assert float32_json(-largest) == -result

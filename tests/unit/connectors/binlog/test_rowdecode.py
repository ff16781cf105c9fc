"""connectors.binlog.rowdecode on hand-made events: what it decodes, and that anything else (a type it
does not cover, a partial image, bytes that do not parse) is handed back (None), never an exception.
Equality with pymysqlreplication on a real binlog: tests/integration/test_binlog_rowdecode.py."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from connectors.binlog.rowdecode import as_is, decode_rows, row_decoder
from schemas.values import binlog_column_types

INT, VARCHAR, DATETIME2, GEOMETRY = 3, 15, 18, 255


def column(name: str, type_: int, **fields: Any) -> SimpleNamespace:
    base = {
        "name": name,
        "type": type_,
        "unsigned": False,
        "character_set_name": None,
        "max_length": 0,
        "fsp": 0,
        "enum_values": None,
        "set_values": None,
        "decimals": 0,
        "bits": 0,
    }
    return SimpleNamespace(**{**base, **fields})


COLUMNS = [
    column("id", INT),
    column("v", VARCHAR, character_set_name="utf8mb4", max_length=80),
    column("at", DATETIME2, fsp=6),
]


def event(body: bytes, *, present: bytes = b"\x07", columns: int = 3) -> SimpleNamespace:
    packet = SimpleNamespace(_data=body, _position=0)
    wrapper = SimpleNamespace(read_bytes=0, packet=packet, **{"_BinLogPacketWrapper__data_buffer": b""})
    return SimpleNamespace(
        complete=True,
        number_of_columns=columns,
        _ignore_decode_errors=False,
        columns_present_bitmap=present,
        event_size=len(body),
        packet=wrapper,
    )


def datetime2(year: int, month: int, day: int, hour: int, minute: int, second: int, micro: int) -> bytes:
    packed = 1 << 39 | (year * 13 + month) << 22 | day << 17 | hour << 12 | minute << 6 | second
    return packed.to_bytes(5, "big") + micro.to_bytes(3, "big")


def row(nulls: int, *values: bytes) -> bytes:
    return bytes([nulls]) + b"".join(values)


ROW_1 = row(
    0, (5).to_bytes(4, "little", signed=True), b"\x02" + "é".encode(), datetime2(2024, 1, 2, 3, 4, 5, 6)
)
ROW_2 = row(0b110, (-7).to_bytes(4, "little", signed=True))  # v and at NULL


def decoder() -> Any:
    return row_decoder(COLUMNS, binlog_column_types(COLUMNS))


def test_rows_decode_to_their_json_images() -> None:
    rows = decode_rows(decoder(), event(ROW_1 + ROW_2), update=False)
    assert rows == [
        {"values": {"id": 5, "v": "é", "at": "2024-01-02T03:04:05.000006"}},
        {"values": {"id": -7, "v": None, "at": None}},
    ]
    assert as_is(rows[0]["values"], None) is rows[0]["values"]


def test_an_invalid_datetime_is_none_as_pymysqlreplication_reads_it() -> None:
    zero = row(0, (1).to_bytes(4, "little"), b"\x00", datetime2(0, 0, 0, 0, 0, 0, 0))
    rows = decode_rows(decoder(), event(zero), update=False)
    assert rows == [{"values": {"id": 1, "v": "", "at": None}}]


def test_a_type_it_does_not_cover_makes_no_decoder() -> None:
    columns = [*COLUMNS, column("spot", GEOMETRY, length_size=4)]
    assert row_decoder(columns, binlog_column_types(columns)) is None
    assert decode_rows(None, event(ROW_1), update=False) is None


def test_a_partial_image_or_another_column_count_is_handed_back() -> None:
    assert decode_rows(decoder(), event(ROW_1, present=b"\x05"), update=False) is None
    assert decode_rows(decoder(), event(ROW_1, columns=4), update=False) is None


def test_bytes_that_do_not_end_on_a_row_are_handed_back() -> None:
    assert decode_rows(decoder(), event(ROW_1[:-1]), update=False) is None
    assert decode_rows(decoder(), event(ROW_1 + b"\x00"), update=False) is None
    bad_utf8 = row(0, (1).to_bytes(4, "little"), b"\x01\xff", datetime2(2024, 1, 1, 0, 0, 0, 0))
    assert decode_rows(decoder(), event(bad_utf8), update=False) is None  # pymysqlreplication raises


VALUES = st.tuples(
    st.integers(-(2**31), 2**31 - 1),
    st.none() | st.text(max_size=20),
    st.none() | st.datetimes(dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31)),
)


def encoded(row_id: int, text: str | None, at: dt.datetime | None) -> bytes:
    nulls = (text is None) << 1 | (at is None) << 2
    parts = [row_id.to_bytes(4, "little", signed=True)]
    if text is not None:
        raw = text.encode()
        parts.append(bytes([len(raw)]) + raw)
    if at is not None:
        parts.append(datetime2(at.year, at.month, at.day, at.hour, at.minute, at.second, at.microsecond))
    return row(nulls, *parts)


def image(row_id: int, text: str | None, at: dt.datetime | None) -> dict[str, Any]:
    return {"id": row_id, "v": text, "at": None if at is None else at.isoformat(timespec="microseconds")}


@given(st.lists(VALUES, min_size=1, max_size=8), st.integers(0, 10_000))
def test_encoded_rows_decode_back_and_a_cut_inside_a_row_is_handed_back(
    rows: list[tuple[int, str | None, dt.datetime | None]], cut: int
) -> None:
    bodies = [encoded(*values) for values in rows]
    decoded = decode_rows(decoder(), event(b"".join(bodies)), update=False)
    assert decoded == [{"values": image(*values)} for values in rows]
    body = b"".join(bodies)[: cut % sum(map(len, bodies))]
    ends = {sum(map(len, bodies[:n])) for n in range(len(bodies) + 1)}
    cut_rows = decode_rows(decoder(), event(body), update=False)
    if len(body) in ends:  # whole rows: the ones before the cut
        assert cut_rows == decoded[: sorted(ends).index(len(body))]
    else:
        assert cut_rows is None

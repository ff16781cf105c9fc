"""The lean reader's look at a packet (connectors.binlog.lean), without a server.

What it reads itself must be read exactly (position, where the rows lie); every form it does not expect
must go to pymysqlreplication (None) without moving the position. The integration test
(tests/integration/test_binlog_lean.py) holds the source's items equal on a real server's binlog; here
are the forms a MariaDB binlog does not show (MySQL's v2 rows events, their extra data, other
post-header lengths, truncated events).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pymysql.protocol import MysqlPacket
from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import WriteRowsEvent

from connectors.binlog.lean import _SKIPPED, LEAN_XID, LeanGtid, LeanReader, LeanRows
from connectors.binlog.tablemaps import DumpConnection

TABLE_ID = 7


@dataclass
class Packet:
    _data: bytes


@dataclass
class Table:
    schema: str = "d"
    table: str = "t"
    columns: list[Any] = field(default_factory=list)
    primary_key: str = "id"


def reader(**kwargs: Any) -> LeanReader:
    settings = {"host": "127.0.0.1", "port": 1, "user": "x", "passwd": ""}
    made = LeanReader(connection_settings=settings, server_id=5, freeze_schema=True, **kwargs)
    made.table_map = {TABLE_ID: Table()}
    made.log_pos = 4
    return made


def packet(
    event_type: int, body: bytes, *, log_pos: int = 900, checksum: bool = False, cut: int = 0
) -> Packet:
    size = 19 + len(body) + (4 if checksum else 0)
    header = (
        (1_700_000_000).to_bytes(4, "little")
        + bytes([event_type])
        + (42).to_bytes(4, "little")
        + size.to_bytes(4, "little")
        + log_pos.to_bytes(4, "little")
        + b"\0\0"
    )
    data = b"\0" + header + body + (b"CRC!" if checksum else b"")
    return Packet(data[: len(data) - cut])


def rows_body(*, table_id: int = TABLE_ID, v2: bool = False, extra: bytes = b"", columns: int = 3) -> bytes:
    post = table_id.to_bytes(6, "little") + b"\1\0"
    if v2:
        post += (2 + len(extra)).to_bytes(2, "little") + extra
    bitmap = bytes([0b111])
    return post + bytes([columns]) + bitmap + bitmap + b"ROWS"


@pytest.mark.parametrize("checksum", [False, True])
def test_a_rows_event_of_a_held_table_is_read_with_its_rows_where_they_lie(checksum: bool) -> None:
    lean = reader()
    lean._BinLogStreamReader__use_checksum = checksum  # type: ignore[attr-defined]
    p = packet(24, rows_body(), checksum=checksum)  # UPDATE_ROWS v1
    event = lean._lean(p)
    assert isinstance(event, LeanRows)
    assert (event.kind, event.schema, event.table, event.log_pos, event.server_id) == (
        "update",
        "d",
        "t",
        900,
        42,
    )
    assert event.timestamp == 1_700_000_000 and event.number_of_columns == 3
    assert event.present == event.present_after == bytes([0b111])
    assert p._data[event.start : event.end] == b"ROWS"  # the checksum left out
    assert lean.log_pos == 900


def test_a_v2_rows_event_without_extra_data_is_read_and_one_with_it_is_handed_on() -> None:
    lean = reader()
    event = lean._lean(packet(30, rows_body(v2=True)))  # WRITE_ROWS v2
    assert isinstance(event, LeanRows) and event.kind == "write"
    assert event.data[event.start : event.end] == bytes([0b111]) + b"ROWS"  # one bitmap for a write
    lean.log_pos = 4
    assert lean._lean(packet(30, rows_body(v2=True, extra=b"\1\0\0"))) is None  # partition info
    assert lean.log_pos == 4, "a packet handed on must not move the position"


def test_forms_it_does_not_expect_are_handed_on_unmoved() -> None:
    lean = reader()
    assert lean._lean(packet(23, rows_body(columns=251))) is None  # a longer length-coded count
    assert lean._lean(packet(23, rows_body(), cut=3)) is None  # shorter than its size says
    assert lean._lean(Packet(b"\xfe\0\0\0\0")) is None  # EOF
    assert lean._lean(packet(2, b"query")) is None  # any other event type
    lean._BinLogStreamReader__post_header_lengths = [8] * 22 + [10] + [8] * 20  # type: ignore[attr-defined]
    assert lean._lean(packet(23, rows_body())) is None  # a post-header of another length
    assert lean.log_pos == 4


def test_what_fetchone_would_skip_is_skipped_with_the_position_moved() -> None:
    lean = reader()
    assert lean._lean(packet(23, rows_body(table_id=99), log_pos=500)) is _SKIPPED  # an unbound table
    assert lean.log_pos == 500
    held_map = packet(19, TABLE_ID.to_bytes(6, "little") + b"\0\0rest", log_pos=600)
    assert lean._lean(held_map) is _SKIPPED
    assert lean.log_pos == 600
    lean.table_map = {}
    assert lean._lean(held_map) is None  # a table map it does not hold: pymysqlreplication parses it


def test_xid_and_mariadb_gtid() -> None:
    lean = reader()
    assert lean._lean(packet(16, (77).to_bytes(8, "little"), log_pos=700)) is LEAN_XID
    assert lean.log_pos == 700
    body = (123).to_bytes(8, "little") + (0).to_bytes(4, "little") + b"\0"
    assert lean._lean(packet(162, body, log_pos=800)) == LeanGtid("0-42-123")
    assert lean.log_pos == 800


def test_only_what_the_caller_asked_for_is_read_the_short_way() -> None:
    lean = reader(only_events=[WriteRowsEvent, QueryEvent])
    assert lean._lean(packet(16, (77).to_bytes(8, "little"))) is None
    assert lean._lean(packet(24, rows_body())) is None  # updates were not asked for
    assert isinstance(lean._lean(packet(23, rows_body())), LeanRows)


def connected(made: LeanReader) -> LeanReader:
    """``made`` as if its stream were connected through a DumpConnection (nothing is opened)."""
    made._stream_connection = object.__new__(DumpConnection)
    made._BinLogStreamReader__connected_stream = True  # type: ignore[attr-defined]
    made._BinLogStreamReader__connected_ctl = True  # type: ignore[attr-defined]
    return made


@pytest.mark.parametrize(
    "asked",
    [
        {"end_log_pos": 10_000},
        {"skip_to_timestamp": 5},
        {"ignore_decode_errors": True},
        {"verify_checksum": True},
    ],
    ids=["end_log_pos", "skip_to_timestamp", "ignore_decode_errors", "verify_checksum"],
)
def test_a_reader_asked_for_what_the_short_way_does_not_do_never_takes_it(asked: dict[str, Any]) -> None:
    assert connected(reader())._lean_ready() is not None  # the same reader without it takes the short way
    assert connected(reader(**asked))._lean_ready() is None
    assert reader()._lean_ready() is None  # not connected: fetchone connects


class _Ctl:
    charset = "utf8mb4"

    def _get_dbms(self) -> str:
        return "mysql"


def upstream(p: Packet, event_class: Any) -> Any:
    """pymysqlreplication's event of the same bytes."""
    wrapper = BinLogPacketWrapper(
        MysqlPacket(p._data, "utf8"), {}, _Ctl(), (8, 0, 36), False, {event_class}, None, None, None, None,
        False, False, False, False, False,
    )  # fmt: skip
    return wrapper.event


@pytest.mark.parametrize("number", [1, 23, 2**40 + 5, 2**63 - 1])
def test_gtids_are_spelled_as_pymysqlreplication_spells_them(number: int) -> None:
    lean = reader()
    sid = bytes(range(0x3E, 0x4E))
    mysql = packet(33, b"\0" + sid + number.to_bytes(8, "little") + b"\2" + bytes(16), log_pos=910)
    assert lean._lean(mysql) == LeanGtid(upstream(mysql, GtidEvent).gtid)
    assert lean.log_pos == 910
    mariadb = packet(162, number.to_bytes(8, "little") + (3).to_bytes(4, "little") + b"\0" + bytes(6))
    assert lean._lean(mariadb) == LeanGtid(upstream(mariadb, MariadbGtidEvent).gtid)
    assert lean._lean(packet(33, b"\0" + sid)) is None  # cut short: pymysqlreplication's to read

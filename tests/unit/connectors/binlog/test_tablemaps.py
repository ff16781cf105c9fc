"""connectors.binlog.tablemaps: a parsed table map is dropped whenever its table id comes with other bytes.

No server: the guard is given the bodies of TABLE_MAP events (and whole event packets, through
:class:`DumpConnection`'s packet hook) and a stand-in for the reader's ``table_map``.
"""

from __future__ import annotations

import socket
import struct
import zlib
from types import SimpleNamespace
from typing import Any

import pytest
from pymysql.connections import Connection

from connectors.binlog import tablemaps
from connectors.binlog.tablemaps import TABLE_MAP_EVENT, DumpConnection, TableMapGuard


def body(table_id: int, rest: bytes = b"\x01\x00\x01d\x00\x01a\x00\x02\x03\x03") -> bytes:
    return table_id.to_bytes(6, "little") + rest


def guarded(table_map: dict[int, Any]) -> TableMapGuard:
    guard = TableMapGuard()
    guard.reader = SimpleNamespace(table_map=table_map)
    return guard


def test_the_same_bytes_keep_the_parsed_table() -> None:
    parsed = object()
    table_map = {18: parsed}
    guard = guarded(table_map)
    guard.table_map_event(body(18))  # first sight: the reader's entry is not known to be from these bytes
    assert 18 not in table_map
    table_map[18] = parsed  # the reader parsed it
    for _ in range(3):
        guard.table_map_event(body(18))
        assert table_map[18] is parsed


def test_other_bytes_for_the_same_id_drop_the_parsed_table() -> None:
    table_map: dict[int, Any] = {}
    guard = guarded(table_map)
    guard.table_map_event(body(18))
    table_map[18] = "table a (id, x)"
    table_map[22] = "table b"
    guard.table_map_event(body(22))
    table_map[22] = "table b"
    guard.table_map_event(body(18, b"\x01\x00\x01d\x00\x01b\x00\x03\x03\x0f\x03"))  # another table, same id
    assert 18 not in table_map
    assert table_map[22] == "table b"


def test_a_new_table_map_dict_after_a_rotation_is_guarded_too() -> None:
    reader = SimpleNamespace(table_map={})
    guard = TableMapGuard()
    guard.reader = reader
    guard.table_map_event(body(18))
    reader.table_map = {18: "parsed after the rotation"}  # pymysqlreplication replaces the dict
    guard.table_map_event(body(18, b"other"))
    assert reader.table_map == {}


def test_bodies_of_tables_the_reader_does_not_keep_are_pruned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tablemaps, "PRUNE_ABOVE", 4)
    table_map: dict[int, Any] = {}
    guard = guarded(table_map)
    guard.table_map_event(body(1))
    table_map[1] = "bound"
    for unbound in range(100, 120):
        guard.table_map_event(body(unbound))
    assert len(guard._bodies) <= 1 + 4 + 1
    guard.table_map_event(body(1))
    assert table_map == {1: "bound"}


def packet(event_type: int, payload: bytes, *, checksum: bool) -> bytes:
    header = struct.pack("<IBIIIH", 1_700_000_000, event_type, 1, 19 + len(payload) + 4 * checksum, 900, 0)
    data = header + payload
    if checksum:
        data += zlib.crc32(data).to_bytes(4, "little")
    return b"\x00" + data


class Packet:
    def __init__(self, data: bytes) -> None:
        self._data = data


def connection(guard: TableMapGuard, *, checksum: bool, dumping: bool = True) -> DumpConnection:
    conn = DumpConnection.__new__(DumpConnection)  # no server: only the packet hook is exercised
    conn._guard, conn._dumping, conn._checksum, conn._pushed = guard, dumping, checksum, None
    return conn


@pytest.mark.parametrize("checksum", [True, False])
def test_the_connection_hands_table_map_bodies_without_header_or_checksum(
    monkeypatch: pytest.MonkeyPatch, checksum: bool
) -> None:
    seen: list[bytes] = []
    guard = TableMapGuard()
    monkeypatch.setattr(guard, "table_map_event", seen.append)
    queue = [
        packet(TABLE_MAP_EVENT, body(18), checksum=checksum),
        packet(30, b"\x00" * 12, checksum=checksum),  # a rows event: not a table map
    ]
    monkeypatch.setattr(Connection, "_read_packet", lambda self, *a, **k: Packet(queue.pop(0)))
    conn = connection(guard, checksum=checksum)
    conn._read_packet()
    conn._read_packet()
    assert seen == [body(18)]


def test_only_a_connection_that_started_a_binlog_dump_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bytes] = []
    guard = TableMapGuard()
    monkeypatch.setattr(guard, "table_map_event", seen.append)
    monkeypatch.setattr(
        Connection,
        "_read_packet",
        lambda self, *a, **k: Packet(packet(TABLE_MAP_EVENT, body(18), checksum=True)),
    )
    written: list[bytes] = []
    monkeypatch.setattr(Connection, "_write_bytes", lambda self, data: written.append(data))
    conn = connection(guard, checksum=True, dumping=False)
    conn._read_packet()
    assert seen == []
    conn._write_bytes(struct.pack("<i", 11) + bytes([0x03]) + b"SELECT 1")  # COM_QUERY
    conn._read_packet()
    assert seen == []
    conn._write_bytes(struct.pack("<i", 11) + bytes([0x12]) + b"\x00" * 10)  # COM_BINLOG_DUMP
    conn._read_packet()
    assert seen == [body(18)]


def test_the_checksum_is_known_from_the_statement_that_asks_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Connection, "query", lambda self, sql, unbuffered=False: 0)
    conn = connection(TableMapGuard(), checksum=False)
    conn.query("SHOW GLOBAL VARIABLES LIKE 'BINLOG_CHECKSUM'")
    assert not conn._checksum
    conn.query("SET @master_binlog_checksum= @@global.binlog_checksum")
    assert conn._checksum


@pytest.mark.parametrize("dumping", [True, False], ids=["counted", "peeked"])
def test_caught_up_says_whether_the_next_read_would_wait(dumping: bool) -> None:
    """Nothing on the socket: caught up. Bytes on the socket, or bytes the reader buffered while the
    socket is empty: not. Once the dump command is sent the reader counts what it took (no system call
    while bytes are buffered); before it (and on TLS) a non-blocking peek answers. pymysql's reads are
    unchanged and the socket's timeout is what it was (its read timeout)."""
    connection = DumpConnection(TableMapGuard(), defer_connect=True)
    assert not connection.caught_up(), "not connected: nothing to tell"
    ours, server = socket.socketpair()
    try:
        ours.settimeout(30.0)
        connection._sock, connection._rfile = ours, ours.makefile("rb")
        connection._current_timeout = connection._write_timeout = 30.0  # as connect() leaves them
        if dumping:
            dump = bytes([0x12]) + b"\x04\x00\x00\x00\x00\x00\x01\x00\x00\x00"
            connection._write_bytes(len(dump).to_bytes(3, "little") + b"\x00" + dump)
            assert server.recv(100).endswith(dump), "the command reached the server"
            assert connection._counting is not None
        else:
            assert connection._counting is None
        assert connection.caught_up()
        server.sendall(b"0123456789")
        assert not connection.caught_up(), "bytes wait on the socket"
        assert connection._read_bytes(4) == b"0123"
        assert not connection.caught_up(), "bytes wait in the reader's buffer, none on the socket"
        assert connection._read_bytes(6) == b"456789"
        assert connection.caught_up()
        assert ours.gettimeout() == 30.0
        server.sendall(b"ab")
        assert connection._read_bytes(2) == b"ab", "a blocking read still reads"
        server.close()
        if dumping:  # (a peek cannot tell the end from "nothing yet"; the next read raises either way)
            assert not connection.caught_up(), "the server closed: the next read raises, not waits"
    finally:
        connection._force_close()
        assert ours.fileno() == -1, "closing the connection closed its socket"
        server.close()

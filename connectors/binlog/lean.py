"""The events of a busy backlog read from their bytes, without pymysqlreplication's event objects.

For every event ``BinLogStreamReader.fetchone`` builds a ``BinLogPacketWrapper`` and an event object
(seventeen arguments, a header unpack, a dozen attribute copies, a read call per field): on single-row
transactions, four events each (GTID, TABLE_MAP, UPDATE_ROWS, XID), that was a third of the binlog
source's CPU, more than decoding the rows.

:class:`LeanReader` is that reader with a shorter way for the four events of a plain transaction. It
reads each packet itself and looks at its header; for

- a rows event (WRITE/UPDATE/DELETE_ROWS, v1 and v2) of a table in the reader's ``table_map``: a
  :class:`LeanRows` that holds the table, the header fields and where its rows lie in the packet, for
  :meth:`RowDecoder.rows_of <connectors.binlog.rowdecode.RowDecoder.rows_of>`;
- an XID event: :data:`LEAN_XID`; a GTID event (MariaDB's or MySQL's): a :class:`LeanGtid`;
- a TABLE_MAP event of a table id the reader holds (``freeze_schema``: pymysqlreplication would skip
  it too; :class:`~connectors.binlog.tablemaps.TableMapGuard` has already dropped the id whose bytes
  changed) or a rows event of a table id it does not hold (an unbound table): nothing,

and it moves ``log_pos`` exactly as ``fetchone`` does. Any other packet (every other event type, a
form it does not expect: a v2 event with extra data, a post-header of another length, 251 columns or
more, an EOF, an error) goes back to the connection unread (:meth:`DumpConnection.push_back
<connectors.binlog.tablemaps.DumpConnection.push_back>`) and pymysqlreplication's ``fetchone`` reads it,
reconnection and rotation included. A :class:`LeanRows` whose rows the source cannot decode itself
becomes pymysqlreplication's event of the same packet (:meth:`LeanReader.full`), so nothing is read
differently, only faster. ``tests/integration/test_binlog_lean.py`` holds the source's items equal with
and without it (positions included) across rotations, DDL, a restart, unbound tables and events it
hands back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, XidEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from connectors.binlog.tablemaps import TABLE_MAP_EVENT, DumpConnection
from connectors.binlog.translate import RowsKind

XID_EVENT = 16
GTID_LOG_EVENT = 33
"""MySQL's GTID event."""
MARIADB_GTID_EVENT = 162
_ROWS_KINDS: dict[int, RowsKind] = {
    23: "write",
    24: "update",
    25: "delete",
    30: "write",
    31: "update",
    32: "delete",
}
"""WRITE/UPDATE/DELETE_ROWS_EVENT v1 (23-25: MariaDB, MySQL before 5.6) and v2 (30-32: MySQL)."""
_ROWS_CLASSES = {"write": WriteRowsEvent, "update": UpdateRowsEvent, "delete": DeleteRowsEvent}
_V2 = frozenset({30, 31, 32})
_HEADER = 20
"""The OK byte, then the 19-byte event header (timestamp, type, server id, size, end position, flags)."""
_CHECKSUM = 4
_MANGLED = "_BinLogStreamReader__"
"""pymysqlreplication keeps the reader's settings in private attributes (mysql-replication 1.0.x)."""
_CONNECTED_STREAM = _MANGLED + "connected_stream"
_CONNECTED_CTL = _MANGLED + "connected_ctl"
_USE_CHECKSUM = _MANGLED + "use_checksum"
_POST_HEADER_LENGTHS = _MANGLED + "post_header_lengths"
"""Both set when the stream connects (the server's checksum setting, its FORMAT_DESCRIPTION event), so
read per event, not kept."""


@dataclass(slots=True)
class LeanRows:
    """A rows event of a table the reader holds, not parsed beyond its post-header."""

    kind: RowsKind
    table_map: Any
    """pymysqlreplication's ``Table`` of the event's table id."""
    timestamp: int
    server_id: int
    log_pos: int
    """The event's end position (its header's ``log_pos``)."""
    number_of_columns: int
    present: bytes
    """The columns-present bitmap (of the after image for updates: ``present_after``)."""
    present_after: bytes
    data: bytes
    """The packet: the OK byte, the event header, the event."""
    start: int
    """Where the first row starts in :attr:`data`."""
    end: int
    """Where the rows end (the checksum, if any, left out)."""
    packet: Any
    """The pymysql packet, unread, for :meth:`LeanReader.full`."""

    @property
    def schema(self) -> str:
        return str(self.table_map.schema)

    @property
    def table(self) -> str:
        return str(self.table_map.table)

    @property
    def columns(self) -> Any:
        """The table map's columns: the same list pymysqlreplication's event of this packet holds."""
        return self.table_map.columns

    @property
    def primary_key(self) -> Any:
        """The table map's primary key, as pymysqlreplication's event of this packet gives it."""
        return self.table_map.primary_key


@dataclass(frozen=True, slots=True)
class LeanGtid:
    """A GTID event: the transaction's GTID as pymysqlreplication spells it (MariaDB's
    ``domain-server-sequence``, MySQL's ``uuid:number``)."""

    gtid: str


@dataclass(frozen=True, slots=True)
class LeanXid:
    """An XID event: a transaction committed (the reader's ``log_pos`` is its end)."""


LEAN_XID = LeanXid()
_SKIPPED = object()


class LeanReader(BinLogStreamReader):
    """``BinLogStreamReader`` that reads the events of a plain transaction without its event objects.

    Its stream connection must be a :class:`~connectors.binlog.tablemaps.DumpConnection` (the
    ``pymysql_wrapper`` of a :class:`~connectors.binlog.tablemaps.TableMapGuard`); where it is not, or
    where the reader was asked for something the short way does not do (``end_log_pos``,
    ``skip_to_timestamp``, lenient decoding, ``verify_checksum``), every event is pymysqlreplication's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        allowed = self._private("allowed_events")
        # Only what the caller asked for (only_events) is read the short way; the rest is fetchone's.
        self._lean_rows = {t: k for t, k in _ROWS_KINDS.items() if _ROWS_CLASSES[k] in allowed}
        self._lean_xid = XidEvent in allowed
        self._lean_gtid = MariadbGtidEvent in allowed
        self._lean_mysql_gtid = GtidEvent in allowed
        self._freeze = bool(self._private("freeze_schema"))
        # What the short way does not do: stop at a position or a time, decode leniently, check checksums.
        self._usable = not (
            self.end_log_pos
            or self.skip_to_timestamp
            or self._private("ignore_decode_errors")
            or self._private("verify_checksum")
        )

    def _private(self, name: str) -> Any:
        return getattr(self, _MANGLED + name)

    def _lean_ready(self) -> DumpConnection | None:
        """The stream connection, when the short way may read the next packet."""
        connection = getattr(self, "_stream_connection", None)
        if (
            not self._usable
            or not isinstance(connection, DumpConnection)
            or not getattr(self, _CONNECTED_STREAM)
            or not getattr(self, _CONNECTED_CTL)
        ):
            return None
        return connection

    def fetchone(self) -> Any:
        connection = self._lean_ready()
        if connection is not None:
            while True:
                try:
                    packet = connection._read_packet()
                except pymysql.OperationalError as exc:  # fetchone's to handle (it reconnects)
                    connection.push_back(exc)
                    break
                event = self._lean(packet)
                if event is None:
                    connection.push_back(packet)
                    break
                if event is not _SKIPPED:
                    return event
        return super().fetchone()

    def _moved(self, data: bytes) -> None:
        """``fetchone``'s position for every event but a rotation: the end of the last one read."""
        log_pos = int.from_bytes(data[14:18], "little")
        if log_pos:
            self.log_pos = log_pos

    def _lean(self, packet: Any) -> Any:
        """The short way's event of ``packet``; :data:`_SKIPPED` for one ``fetchone`` would skip; None
        for one it must read."""
        data = packet._data
        if type(data) is not bytes or len(data) < _HEADER or data[0] != 0:
            return None
        event_type = data[5]
        if event_type in self._lean_rows:
            return self._rows(packet, data, event_type)
        if event_type == XID_EVENT and self._lean_xid:
            self._moved(data)
            return LEAN_XID
        if event_type == MARIADB_GTID_EVENT and self._lean_gtid:
            if len(data) < _HEADER + 13:
                return None
            sequence = int.from_bytes(data[20:28], "little")
            domain = int.from_bytes(data[28:32], "little")
            server_id = int.from_bytes(data[6:10], "little")
            self._moved(data)
            return LeanGtid(f"{domain}-{server_id}-{sequence}")
        if event_type == GTID_LOG_EVENT and self._lean_mysql_gtid:
            if len(data) < _HEADER + 25:
                return None
            sid = data[21:37].hex()  # after the commit flag
            number = int.from_bytes(data[37:45], "little")
            self._moved(data)
            return LeanGtid(f"{sid[:8]}-{sid[8:12]}-{sid[12:16]}-{sid[16:20]}-{sid[20:]}:{number}")
        if (
            event_type == TABLE_MAP_EVENT
            and self._freeze
            and len(data) >= _HEADER + 6
            and int.from_bytes(data[20:26], "little") in self.table_map
        ):
            self._moved(data)
            return _SKIPPED
        return None

    def _rows(self, packet: Any, data: bytes, event_type: int) -> Any:
        v2 = event_type in _V2
        post_header = 10 if v2 else 8
        lengths = getattr(self, _POST_HEADER_LENGTHS)
        if lengths and 0 <= event_type - 1 < len(lengths) and lengths[event_type - 1] != post_header:
            return None
        pos = _HEADER + post_header
        if len(data) < pos + 1:
            return None
        table = self.table_map.get(int.from_bytes(data[20:26], "little"))
        if table is None:  # fetchone skips it too: a table that is not bound (its map was filtered)
            self._moved(data)
            return _SKIPPED
        if v2 and int.from_bytes(data[28:30], "little") > 2:  # extra data (NDB, partition): fetchone's
            return None
        columns = data[pos]
        if columns >= 251:  # a longer length-coded count: fetchone's
            return None
        pos += 1
        size = (columns + 7) // 8
        present = present_after = data[pos : pos + size]
        pos += size
        kind = self._lean_rows[event_type]
        if kind == "update":
            present_after = data[pos : pos + size]
            pos += size
        event_size = int.from_bytes(data[10:14], "little")
        end = 1 + event_size - (_CHECKSUM if getattr(self, _USE_CHECKSUM) else 0)
        if end > len(data) or pos > end:
            return None
        self._moved(data)
        return LeanRows(
            kind=kind,
            table_map=table,
            timestamp=int.from_bytes(data[1:5], "little"),
            server_id=int.from_bytes(data[6:10], "little"),
            log_pos=int.from_bytes(data[14:18], "little"),
            number_of_columns=columns,
            present=present,
            present_after=present_after,
            data=data,
            start=pos,
            end=end,
            packet=packet,
        )

    def full(self, lean: LeanRows) -> Any:
        """pymysqlreplication's event of ``lean``'s packet (not read yet), as ``fetchone`` would have
        made it; None where it would have skipped it."""
        wrapper = BinLogPacketWrapper(
            lean.packet,
            self.table_map,
            self._ctl_connection,
            self.mysql_version,
            getattr(self, _USE_CHECKSUM),
            self._private("allowed_events_in_packet"),
            self._private("only_tables"),
            self._private("ignored_tables"),
            self._private("only_schemas"),
            self._private("ignored_schemas"),
            self._private("freeze_schema"),
            self._private("ignore_decode_errors"),
            self._private("verify_checksum"),
            self._private("optional_meta_data"),
            self._private("enable_logging"),
            self._private("use_column_name_cache"),
            getattr(self, _POST_HEADER_LENGTHS),
        )
        event = wrapper.event
        if event is None or event.__class__ not in self._private("allowed_events"):
            return None
        return event

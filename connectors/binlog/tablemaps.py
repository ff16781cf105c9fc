"""Table maps parsed once, not once per transaction: pymysqlreplication's ``freeze_schema``, made safe.

Every transaction in a row-based binlog starts with a TABLE_MAP event per table it touches, and
pymysqlreplication parses each one in full (columns, optional metadata, character sets): on single-row
transactions that was a quarter of the connector's CPU. Its ``freeze_schema=True`` skips the parse of a
table id it has seen, but trusts that an id always describes the same table, which a server restart
between two binlog files, or a DDL on a server that kept the id, would break: rows would then be decoded
with another table's columns, silently.

:class:`TableMapGuard` keeps ``freeze_schema`` and removes that trust. The replication connection is
:class:`DumpConnection`, which sees every binlog event's bytes before pymysqlreplication does; for a
TABLE_MAP event it compares the event's body (everything after the header except the checksum) with the
body the reader parsed for that table id, and when they differ it drops the reader's entry, so that
this event is parsed again. The same bytes can only parse into the same table, so what the reader reuses
is always what it would have parsed.
"""

from __future__ import annotations

import io
import select
import ssl
from typing import Any

from pymysql.protocol import MysqlPacket

from connectors.mysql import Connection

TABLE_MAP_EVENT = 19
"""The binlog event type of a table map (``TABLE_MAP_EVENT`` in MySQL's and MariaDB's ``log_event.h``)."""
_TABLE_MAP = bytes([TABLE_MAP_EVENT])
_COM_BINLOG_DUMPS = frozenset({0x12, 0x1E})
"""COM_BINLOG_DUMP and COM_BINLOG_DUMP_GTID: after either, the connection streams binlog events."""
_HEADER = 20
"""An event packet: the OK byte, then the 19-byte event header (timestamp, type, server id, size, end
position, flags)."""
_TABLE_ID = 6
"""The table id opens a table map's body: 6 bytes, little-endian (every server with FULL row metadata)."""
_CHECKSUM = 4
_CHECKSUM_SET = "SET @MASTER_BINLOG_CHECKSUM"
"""What pymysqlreplication runs on the replication connection when the server checksums its events
(CRC32, 4 bytes at the end of each event, covering the header: never the same twice)."""
PRUNE_ABOVE = 256
"""Bodies kept for table ids the reader does not hold (unbound tables) before they are pruned."""


class TableMapGuard:
    """Drops a reader's parsed table map whenever its table id arrives with other bytes.

    Pass :meth:`connect` as the reader's ``pymysql_wrapper`` and set :attr:`reader` once it exists;
    the reader must run with ``freeze_schema=True`` (else it re-parses every table map anyway).
    """

    def __init__(self) -> None:
        self.reader: Any = None
        """The ``BinLogStreamReader`` whose ``table_map`` this guards."""
        self._bodies: dict[int, bytes] = {}

    def connect(self, **kwargs: Any) -> DumpConnection:
        """A connection for the reader (its ``pymysql_wrapper``); only the one that starts a binlog dump
        reports events."""
        if "db" in kwargs:  # pymysqlreplication's name for it, deprecated in pymysql
            kwargs["database"] = kwargs.pop("db")
        return DumpConnection(self, **kwargs)

    def table_map_event(self, body: bytes) -> None:
        """A TABLE_MAP event's body (header and checksum left out) is about to be read."""
        table_id = int.from_bytes(body[:_TABLE_ID], "little")
        if self._bodies.get(table_id) == body:
            return
        self._bodies[table_id] = body
        table_map = getattr(self.reader, "table_map", None)
        if table_map is None:
            return
        table_map.pop(table_id, None)  # parsed from other bytes (or not at all): parse this one
        if len(self._bodies) > len(table_map) + PRUNE_ABOVE:
            # Unbound tables are never kept by the reader; their bodies need not be kept either.
            self._bodies = {t: b for t, b in self._bodies.items() if t in table_map or t == table_id}


class _CountingReader(io.RawIOBase):
    """A socket's raw reader that counts the bytes it brought in (:meth:`DumpConnection.caught_up`)."""

    def __init__(self, raw: Any, fd: int) -> None:
        super().__init__()
        self._raw = raw
        self.filled = 0
        self.poll = select.poll()
        """Readable or not, at once (``poll(0)``), whatever the socket's timeout."""
        self.poll.register(fd, select.POLLIN)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        n: int | None = self._raw.readinto(buffer)
        if n:
            self.filled += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class DumpConnection(Connection):
    """A pymysql connection that shows its guard every TABLE_MAP event it reads from a binlog dump."""

    def __init__(self, guard: TableMapGuard, **kwargs: Any) -> None:
        # Set before connecting: the handshake reads packets already.
        self._guard = guard
        self._dumping = False
        self._checksum = False
        self._counting: _CountingReader | None = None
        self._consumed = 0
        self._pushed: Any = None
        super().__init__(**kwargs)

    def push_back(self, item: Any) -> None:
        """The next :meth:`_read_packet` returns ``item`` (a packet already read, not yet looked at by
        pymysqlreplication) or raises it (an exception its read raised): the way
        :class:`~connectors.binlog.lean.LeanReader` hands pymysqlreplication what it does not read."""
        self._pushed = item

    def query(self, sql: Any, unbuffered: bool = False) -> int:
        text = sql.decode(errors="replace") if isinstance(sql, bytes | bytearray) else str(sql)
        if text.lstrip().upper().startswith(_CHECKSUM_SET):
            self._checksum = True
        result: int = super().query(sql, unbuffered)
        return result

    def _write_bytes(self, data: bytes) -> None:
        if len(data) > 4 and data[4] in _COM_BINLOG_DUMPS:
            self._dumping = True
            self._count_reads()
        super()._write_bytes(data)

    def _count_reads(self) -> None:
        """Read the dump through a reader that counts what it takes from the socket (plain TCP only).

        Called just before the dump command is sent: every earlier answer has been read in full (the
        server speaks only when asked), so the reader it replaces holds no byte."""
        sock = self._sock
        rfile: Any = getattr(self, "_rfile", None)
        if sock is None or isinstance(sock, ssl.SSLSocket) or rfile is None:
            return
        counting = _CountingReader(sock.makefile("rb", buffering=0), sock.fileno())
        rfile.close()
        self._rfile = io.BufferedReader(counting)
        self._counting, self._consumed = counting, 0

    def caught_up(self) -> bool:
        """True when the next read would wait for the server: no byte buffered, none on the socket.

        On a plain connection the dump's reader counts what it took from the socket and
        :meth:`_read_bytes` what pymysql consumed, so buffered bytes answer "no" without a system call;
        only an empty buffer costs one ``poll`` of the socket (a ``recv`` would first wait out the
        socket's timeout). A system call lets another thread take the GIL (the producer's delivery
        thread), so the connector asks after every transaction without paying for it while it reads a
        backlog. On TLS a non-blocking peek of the reader answers (three system calls). A socket error
        is not "caught up": the next read raises it where the session handles it."""
        sock, counting = self._sock, self._counting
        rfile: Any = getattr(self, "_rfile", None)  # pymysql leaves it untyped
        if sock is None or rfile is None or self._pushed is not None:
            return False
        if counting is not None:
            if counting.filled > self._consumed:
                return False
            try:
                return not counting.poll.poll(0)  # readable: a byte, the end, or an error to read
            except OSError:
                return False
        timeout = sock.gettimeout()
        sock.setblocking(False)
        try:
            return not rfile.peek(1)
        except ssl.SSLWantReadError:  # TLS: no whole record waiting
            return True
        except OSError:
            return False
        finally:
            sock.settimeout(timeout)

    def _read_bytes(self, num_bytes: int) -> bytes:
        data: bytes = super()._read_bytes(num_bytes)
        self._consumed += num_bytes
        return data

    def _read_packet(self, packet_type: Any = MysqlPacket) -> Any:
        pushed = self._pushed
        if pushed is not None:  # seen once already (the guard too)
            self._pushed = None
            if isinstance(pushed, BaseException):
                raise pushed
            return pushed
        packet = super()._read_packet(packet_type)
        if self._dumping:
            data: bytes = packet._data
            # data[5:6], not data[5]: a packet shorter than a header (an EOF) is no table map.
            if data[5:6] == _TABLE_MAP and data[0] == 0 and len(data) > _HEADER + _TABLE_ID:
                end = len(data) - _CHECKSUM if self._checksum else len(data)
                self._guard.table_map_event(data[_HEADER:end])
        return packet

"""The binlog source: row events of the bound tables as change events, in binlog order.

Reads with pymysqlreplication from a transaction boundary (file/position), and yields, in order:
:class:`ChangeEvent` per row, :class:`DdlEvent` per schema change that may touch a bound table (run in a
bound database, or naming a bound ``db.table`` from anywhere), :class:`DeadLetter` for rows it cannot
turn into events (a table without a primary key), a :class:`FenceEvent` wherever a bound table's changes
are lost to it (a rows event it cannot read, also a :class:`DeadLetter`; rows that became dead letters; a
statement-logged row change; a compressed event: :mod:`connectors.binlog.lost`), a :class:`Boundary` after
every committed transaction, which is where a checkpoint may point, and a :class:`Tick` whenever the
server shows it is alive without a change (the stream's start, a heartbeat about every second while
idle), so that the reader can check its other connections while the database is quiet.

This module does the I/O (the replication connection, the column types from information_schema); what
an event becomes is decided in :mod:`connectors.binlog.translate`. A position the server cannot serve
any more (its file purged, error 1236) raises :class:`~connectors.exceptions.BinlogGapError`
(:mod:`connectors.binlog.positions`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    PartialUpdateRowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from connectors.binlog.ddl import mentioned_databases, statement_kind, translate_ddl
from connectors.binlog.lean import LEAN_XID, LeanGtid, LeanReader, LeanRows
from connectors.binlog.lost import (
    COMPRESSED_EVENTS,
    PartialJsonUpdate,
    compressed,
    event_bytes,
    rows_lost,
    statement_logged,
    unreadable_rows,
)
from connectors.binlog.positions import ER_MASTER_FATAL_ERROR_READING_BINLOG, binary_logs, refusal_error
from connectors.binlog.rowdecode import RowDecoder, as_is, decode_rows, row_decoder
from connectors.binlog.tablemaps import DumpConnection, TableMapGuard
from connectors.binlog.translate import (
    EventOrigin,
    RowsEvent,
    RowsKind,
    VersionSource,
    translate_rows,
)
from connectors.checkpoint import BinlogPosition
from connectors.database import column_types
from connectors.exceptions import ConnectorError
from connectors.settings import MySQLSettings
from schemas import ChangeEvent, DdlEvent, DeadLetter, FenceEvent
from schemas.values import ColumnType, RowConverter, binlog_column_types, binlog_row_converter

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Boundary:
    """The end of a committed transaction: resuming here replays nothing partial."""

    position: BinlogPosition


@dataclass(frozen=True, slots=True)
class Tick:
    """The server is alive and the stream connected; nothing to produce."""


SourceItem = ChangeEvent | DdlEvent | FenceEvent | DeadLetter | Boundary | Tick


@dataclass(frozen=True, slots=True)
class _TableMap:
    """What the source makes once per table map: the types of its columns, the converter of
    pymysqlreplication's images and the decoder of its rows (None where its types are not covered)."""

    columns: object
    types: dict[str, ColumnType]
    converter: RowConverter
    decoder: RowDecoder | None


_ROWS_EVENTS = frozenset({WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent})
"""The rows events the reader yields: it filters on exact classes (``only_events``), so an event is one of
these or of another class, never a subclass of them. MySQL's PartialUpdateRowsEvent (a subclass) is
asked for only to be said unreadable: its after image holds only the changed parts of JSON documents."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class BinlogSource:
    """Iterates the binlog from ``start``; blocks waiting for new events (``blocking=True``).

    ``read_timeout_s``: a connection that brings nothing (not even the server's heartbeat, sent every
    second while idle) for this long is taken as lost (pymysql then raises error 2013).
    ``checkpoint``: only named in the error raised when the server cannot serve ``start``.
    ``fast_rows``: decode rows straight from the events' bytes where their types allow
    (:mod:`connectors.binlog.rowdecode`), the events of plain transactions read without
    pymysqlreplication's event objects (:mod:`connectors.binlog.lean`); False reads every event and row
    with pymysqlreplication.
    """

    def __init__(
        self,
        settings: MySQLSettings,
        tables: Collection[tuple[str, str]],
        *,
        start: BinlogPosition,
        version_source: VersionSource = "binlog",
        blocking: bool = True,
        read_timeout_s: float | None = None,
        checkpoint: Path | None = None,
        fast_rows: bool = True,
    ) -> None:
        self._settings = settings
        self._tables = {(db, table) for db, table in tables}
        self._databases = {db for db, _ in self._tables}
        self._start = start
        self._version_source: VersionSource = version_source
        self._blocking = blocking
        self._read_timeout_s = read_timeout_s
        self._checkpoint = checkpoint
        self._decode_rows = fast_rows
        self._stream: BinLogStreamReader | None = None
        # Column types per table (schemas.values): the table map's, refined from information_schema for
        # what it cannot name (MariaDB JSON, UUID, INET); refreshed after DDL on the table's database.
        self._refine: dict[tuple[str, str], dict[str, ColumnType]] = {}
        self._types: dict[tuple[str, str], _TableMap] = {}

    def _open(self) -> BinLogStreamReader:
        connection = settings = self._settings.connection_kwargs()
        if self._read_timeout_s is not None:
            connection = {**settings, "read_timeout": max(1, round(self._read_timeout_s))}
        guard = TableMapGuard()
        reader = (LeanReader if self._decode_rows else BinLogStreamReader)(
            connection_settings=connection,
            ctl_connection_settings=connection,
            server_id=self._settings.server_id,
            resume_stream=True,
            log_file=self._start.file,
            log_pos=self._start.pos,
            blocking=self._blocking,
            only_events=[
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
                PartialUpdateRowsEvent,
                NotImplementedEvent,  # only to see compressed events (lost.COMPRESSED_EVENTS)
                XidEvent,
                QueryEvent,
                RotateEvent,
                GtidEvent,
                MariadbGtidEvent,
                HeartbeatLogEvent,
            ],
            filter_non_implemented_events=False,  # NotImplementedEvent is asked for (compressed events)
            only_schemas=sorted(self._databases),
            only_tables=sorted({t for _, t in self._tables}),
            slave_heartbeat=1.0,
            enable_logging=False,
            # A table map is parsed once per table, not per transaction: the guard makes the reader
            # parse it again whenever its bytes change (connectors.binlog.tablemaps).
            freeze_schema=True,
            pymysql_wrapper=guard.connect,
        )
        guard.reader = reader
        return reader

    def __iter__(self) -> Iterator[SourceItem]:
        stream = self._stream = self._open()
        try:
            yield from self._read(stream)
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == ER_MASTER_FATAL_ERROR_READING_BINLOG:
                at = BinlogPosition(stream.log_file or self._start.file, stream.log_pos or self._start.pos)
                raise refusal_error(
                    at,
                    str(exc.args[-1]),
                    server_id=self._settings.server_id,
                    list_logs=lambda: binary_logs(self._settings),
                    checkpoint=self._checkpoint,
                ) from None
            raise

    def _read(self, stream: BinLogStreamReader) -> Iterator[SourceItem]:
        gtid: str | None = self._start.gtid
        ordinal = 0  # rows so far in the current transaction (GTID versions)
        for event in stream:
            # Rows events first, by exact type (what the reader makes): most events are rows events,
            # and an isinstance() with a union costs more than a set lookup.
            if type(event) is LeanRows or type(event) in _ROWS_EVENTS:
                if (event.schema, event.table) not in self._tables:
                    continue
                read_ms = _now_ms()
                try:
                    rows = self._rows_event(event, stream, gtid)
                    if rows is None:  # pymysqlreplication skips the event (LeanReader.full)
                        continue
                    translated = translate_rows(
                        rows, version_source=self._version_source, first_ordinal=ordinal, read_ms=read_ms
                    )
                    changes = list(translated)
                except (pymysql.err.Error, ConnectorError):  # the database away, a setting: not the event
                    raise
                except Exception as exc:  # the event's bytes: a value the reader cannot decode
                    yield from self._unreadable(event, stream.log_file, gtid, exc)
                    continue
                yield from changes
                ordinal += len(rows.rows)
                lost = rows_lost(rows, changes, read_ms=read_ms)  # rows that became dead letters
                if lost is not None:
                    yield lost
            elif type(event) is LeanGtid:
                gtid, ordinal = event.gtid, 0
            elif event is LEAN_XID:
                yield Boundary(BinlogPosition(stream.log_file, stream.log_pos, gtid))
            elif type(event) is PartialUpdateRowsEvent:
                if (event.schema, event.table) in self._tables:
                    yield from self._unreadable(event, stream.log_file, gtid, PartialJsonUpdate())
            elif type(event) is NotImplementedEvent:
                what = COMPRESSED_EVENTS.get(getattr(event.packet, "event_type", -1))
                if what is not None:
                    origin = self._origin(event, stream.log_file, gtid)
                    yield from compressed(origin, what, self._tables, read_ms=_now_ms())
            elif isinstance(event, GtidEvent | MariadbGtidEvent):
                gtid, ordinal = event.gtid, 0
            elif isinstance(event, XidEvent):
                yield Boundary(BinlogPosition(stream.log_file, stream.log_pos, gtid))
            elif isinstance(event, HeartbeatLogEvent | RotateEvent):
                yield Tick()
            elif isinstance(event, QueryEvent):
                query = event.query.strip() if isinstance(event.query, str) else str(event.query)
                kind = statement_kind(query)
                if kind == "dml":  # its rows are not in the binlog: the tables it may touch are fenced
                    origin = self._origin(event, stream.log_file, gtid)
                    yield from statement_logged(
                        origin, _text(event.schema), query, self._tables, read_ms=_now_ms()
                    )
                    continue
                if kind != "ddl":
                    if kind == "commit":
                        yield Boundary(BinlogPosition(stream.log_file, stream.log_pos, gtid))
                    continue
                schema = _text(event.schema)
                self._forget_types(schema, query)
                origin = self._origin(event, stream.log_file, gtid)
                yield from translate_ddl(query, schema, origin, self._tables, read_ms=_now_ms())
                # a DDL statement commits implicitly
                yield Boundary(BinlogPosition(stream.log_file, stream.log_pos, gtid))

    def _unreadable(
        self, event: Any, file: str, gtid: str | None, exc: Exception
    ) -> tuple[DeadLetter, FenceEvent]:
        """A rows event that cannot be read: a dead letter and the fence of its table (``lost``)."""
        origin = self._origin(event, file, gtid)
        raw = event.data if type(event) is LeanRows else event_bytes(event)
        return unreadable_rows(origin, str(event.schema), str(event.table), exc, raw, read_ms=_now_ms())

    def _origin(self, event: Any, file: str, gtid: str | None) -> EventOrigin:
        if type(event) is LeanRows:
            return EventOrigin(
                server_id=event.server_id,
                file=file,
                end_pos=event.log_pos,
                timestamp_s=event.timestamp,
                gtid=gtid,
            )
        return EventOrigin(
            server_id=int(event.packet.server_id),
            file=file,
            end_pos=int(event.packet.log_pos),
            timestamp_s=int(event.timestamp),
            gtid=gtid,
        )

    def _rows_event(self, event: Any, stream: BinLogStreamReader, gtid: str | None) -> RowsEvent | None:
        """The fields of a rows event (pymysqlreplication's or a :class:`LeanRows`) that
        :func:`translate_rows` needs; None where pymysqlreplication skips a lean one's packet."""
        kind: RowsKind
        if type(event) is LeanRows:
            kind = event.kind
        else:
            kind = (
                "update"
                if isinstance(event, UpdateRowsEvent)
                else "write"
                if isinstance(event, WriteRowsEvent)
                else "delete"
            )
        pk = event.primary_key
        table = self._table_map(event)
        converter = table.converter
        # Straight from the event's bytes where the table's column types allow (connectors.binlog.
        # rowdecode: the same images); else pymysqlreplication's rows, converted per image.
        rows = decode_rows(table.decoder, event, kind == "update")
        if rows is None:
            full = stream.full(event) if type(event) is LeanRows else event  # only a LeanReader makes one
            if full is None:
                return None
            rows = full.rows
        else:
            converter = as_is
        return RowsEvent(
            kind=kind,
            schema=str(event.schema),
            table=str(event.table),
            primary_key=(pk,) if isinstance(pk, str) and pk else tuple(pk or ()),
            rows=rows,
            column_types=table.types,
            origin=self._origin(event, stream.log_file, gtid),
            row_converter=converter,
        )

    def _table_map(self, event: Any) -> _TableMap:
        """The column types of a rows event's table, the converter of its images and its row decoder,
        made once per table map (the reader keeps a table map's columns while its bytes stay the same)."""
        table = (str(event.schema), str(event.table))
        cached = self._types.get(table)
        if cached is not None and cached.columns is event.columns:
            return cached
        refine = self._refine.get(table)
        if refine is None:
            refine = self._refine[table] = column_types(self._settings, *table)
        types = binlog_column_types(event.columns, refine)
        made = _TableMap(
            columns=event.columns,
            types=types,
            converter=binlog_row_converter(types),
            decoder=row_decoder(event.columns, types) if self._decode_rows else None,
        )
        if made.decoder is None and self._decode_rows:
            log.info(
                "rows of %s.%s are read by pymysqlreplication (slower): a column type the row decoder does "
                "not cover (%s)",
                *table,
                ", ".join(sorted({t.data_type for t in types.values()})),
            )
        self._types[table] = made
        return made

    def caught_up(self) -> bool:
        """True when the binlog has nothing more to read now (the next event is not written yet): the
        moment to send what waits for a batch (:meth:`ChangeProducer.push`)."""
        connection = getattr(self._stream, "_stream_connection", None)
        return isinstance(connection, DumpConnection) and connection.caught_up()

    def _forget_types(self, schema: str, query: str) -> None:
        """After DDL, read information_schema again for the tables it may concern."""
        named = mentioned_databases(query, self._refine.keys())
        for table in [t for t in self._refine if t[0] == schema or t[0] in named]:
            del self._refine[table]
            self._types.pop(table, None)

    def close(self) -> None:
        """Close the binlog connections; never raises (a server that died leaves dead sockets)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception as exc:  # a dead socket: the session is ending anyway
                log.debug("closing the binlog stream: %r", exc)

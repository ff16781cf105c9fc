"""The binlog source: row events of the bound tables as change events, in binlog order.

Reads with pymysqlreplication from a transaction boundary (file/position), and yields, in order:
:class:`ChangeEvent` per row, :class:`DdlEvent` per schema change of an included database,
:class:`DeadLetter` for rows it cannot turn into events (a table without a primary key), and a
:class:`Boundary` after every committed transaction, which is where a checkpoint may point.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pymysql
from pydantic import ValidationError
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from connectors.checkpoint import BinlogPosition
from connectors.exceptions import ConfigurationError
from connectors.settings import MySQLSettings
from schemas import (
    ChangeEvent,
    DdlEvent,
    DeadLetter,
    Source,
    VersionError,
    binlog_version,
    gtid_version,
    row_to_json,
)
from schemas.codec import dead_letter
from schemas.events import Op, Row

log = logging.getLogger(__name__)

VersionSource = Literal["binlog", "gtid"]
_NOT_DDL = ("BEGIN", "COMMIT", "ROLLBACK", "XA ", "SAVEPOINT")


@dataclass(frozen=True, slots=True)
class Boundary:
    """The end of a committed transaction: resuming here replays nothing partial."""

    position: BinlogPosition


SourceItem = ChangeEvent | DdlEvent | DeadLetter | Boundary


def current_position(settings: MySQLSettings, *, earliest: bool = False) -> BinlogPosition:
    """The server's current binlog end (or the start of its oldest binlog file)."""
    conn = pymysql.connect(**settings.connection_kwargs())
    try:
        with conn.cursor() as cur:
            if earliest:
                cur.execute("SHOW BINARY LOGS")
                row = cur.fetchone()
                if row is None:
                    raise ConfigurationError("the server has no binary logs: enable log_bin")
                return BinlogPosition(file=str(row[0]), pos=4)
            try:
                cur.execute("SHOW MASTER STATUS")
            except pymysql.err.ProgrammingError:  # MySQL >= 8.4 renamed it
                cur.execute("SHOW BINARY LOG STATUS")
            row = cur.fetchone()
            if row is None:
                raise ConfigurationError("SHOW MASTER STATUS is empty: the binlog is off (set log_bin)")
            return BinlogPosition(file=str(row[0]), pos=int(row[1]))
    finally:
        conn.close()


class BinlogSource:
    """Iterates the binlog from ``start``; blocks waiting for new events (``blocking=True``)."""

    def __init__(
        self,
        settings: MySQLSettings,
        tables: Collection[tuple[str, str]],
        *,
        start: BinlogPosition,
        version_source: VersionSource = "binlog",
        blocking: bool = True,
    ) -> None:
        self._settings = settings
        self._tables = {(db, table) for db, table in tables}
        self._databases = {db for db, _ in self._tables}
        self._start = start
        self._version_source = version_source
        self._blocking = blocking
        self._stream: BinLogStreamReader | None = None

    def _open(self) -> BinLogStreamReader:
        return BinLogStreamReader(
            connection_settings=self._settings.connection_kwargs(),
            server_id=self._settings.server_id,
            resume_stream=True,
            log_file=self._start.file,
            log_pos=self._start.pos,
            blocking=self._blocking,
            only_events=[
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
                XidEvent,
                QueryEvent,
                RotateEvent,
                GtidEvent,
                MariadbGtidEvent,
            ],
            only_schemas=sorted(self._databases),
            only_tables=sorted({t for _, t in self._tables}),
            slave_heartbeat=1.0,
            enable_logging=False,
        )

    def __iter__(self) -> Iterator[SourceItem]:
        stream = self._stream = self._open()
        gtid: str | None = self._start.gtid
        ordinal = 0
        for event in stream:
            if isinstance(event, GtidEvent | MariadbGtidEvent):
                gtid, ordinal = event.gtid, 0
            elif isinstance(event, XidEvent):
                yield Boundary(BinlogPosition(stream.log_file, stream.log_pos, gtid))
            elif isinstance(event, QueryEvent):
                query = event.query.strip() if isinstance(event.query, str) else str(event.query)
                if query.upper().startswith(_NOT_DDL):
                    if query.upper() == "COMMIT":
                        yield Boundary(BinlogPosition(stream.log_file, stream.log_pos, gtid))
                    continue
                schema = event.schema.decode() if isinstance(event.schema, bytes) else str(event.schema)
                if schema in self._databases:
                    yield self._ddl(event, stream.log_file, schema, query, gtid)
                # a DDL statement commits implicitly
                yield Boundary(BinlogPosition(stream.log_file, stream.log_pos, gtid))
            elif isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                if (event.schema, event.table) not in self._tables:
                    continue
                for index, row in enumerate(event.rows):
                    try:
                        yield from self._changes(event, stream.log_file, index, row, gtid, ordinal)
                    except (ValidationError, VersionError) as exc:
                        yield dead_letter(
                            f"row of {event.schema}.{event.table} is not a valid change: {exc}",
                            json.dumps(row, default=str).encode(),
                            stage="connector",
                        )
                    ordinal += 1  # noqa: SIM113 - counts rows across events of a transaction

    def _source(self, event: Any, file: str, row: int, db: str, table: str, gtid: str | None) -> Source:
        return Source(
            server_id=int(event.packet.server_id),
            file=file,
            pos=int(event.packet.log_pos),
            row=row,
            gtid=gtid,
            ts_ms=int(event.timestamp) * 1000,
            db=db,
            table=table,
        )

    def _ddl(self, event: QueryEvent, file: str, schema: str, query: str, gtid: str | None) -> DdlEvent:
        source = self._source(event, file, 0, schema, "*", gtid)
        return DdlEvent(
            event_id=f"{source.server_id}:{file}:{source.pos}:ddl",
            source=source,
            query=query,
            ts_ms=int(time.time() * 1000),
        )

    def _changes(
        self, event: Any, file: str, index: int, row: dict[str, Any], gtid: str | None, ordinal: int
    ) -> Iterator[ChangeEvent | DeadLetter]:
        source = self._source(event, file, index, event.schema, event.table, gtid)
        if isinstance(event, UpdateRowsEvent):
            before, after = row_to_json(row["before_values"]), row_to_json(row["after_values"])
        elif isinstance(event, WriteRowsEvent):
            before, after = None, row_to_json(row["values"])
        else:
            before, after = row_to_json(row["values"]), None
        pk = event.primary_key
        pk_columns: tuple[str, ...] = (pk,) if isinstance(pk, str) and pk else tuple(pk or ())
        if not pk_columns:
            yield dead_letter(
                f"table {event.schema}.{event.table} has no primary key; freshkey needs one to address rows",
                json.dumps({"before": before, "after": after}, default=str).encode(),
                stage="connector",
            )
            return
        if self._version_source == "gtid":
            if gtid is None:
                raise ConfigurationError("FRESHKEY_CONNECTOR_VERSION_SOURCE=gtid but the binlog has no GTIDs")
            version = gtid_version(gtid, ordinal)
        else:
            version = binlog_version(file, source.pos, index)
        base_id = f"{source.server_id}:{file}:{source.pos}:{index}"
        read_ms = int(time.time() * 1000)

        def change(suffix: str, op: Op, image_before: Row | None, image_after: Row | None) -> ChangeEvent:
            image = image_after if image_after is not None else image_before
            assert image is not None
            # A key value of another type than int/str fails validation -> dead letter.
            key: dict[str, Any] = {c: image[c] for c in pk_columns}
            return ChangeEvent(
                event_id=base_id + suffix,
                op=op,
                key=key,
                before=image_before,
                after=image_after,
                source=source,
                ts_ms=read_ms,
                version=version,
                commit_ts_us=source.ts_ms * 1000,
                commit_ts_coarse=True,
            )

        if before is not None and after is not None:
            if any(before[c] != after[c] for c in pk_columns):
                # The primary key changed: the old row is gone, a new row exists.
                yield change(":d", "d", before, None)
                yield change(":c", "c", None, after)
            else:
                yield change("", "u", before, after)
        elif after is not None:
            yield change("", "c", None, after)
        else:
            yield change("", "d", before, None)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

"""The binlog source: row events of the bound tables as change events, in binlog order.

Reads with pymysqlreplication from a transaction boundary (file/position), and yields, in order:
:class:`ChangeEvent` per row, :class:`DdlEvent` per schema change that may touch a bound table (run in a
bound database, or naming a bound ``db.table`` from anywhere), :class:`DeadLetter` for rows it cannot
turn into events (a table without a primary key), a :class:`Boundary` after every committed
transaction, which is where a checkpoint may point, and a :class:`Tick` whenever the server shows it is
alive without a change (the stream's start, a heartbeat about every second while idle), so that the
reader can check its other connections while the database is quiet.

A position the server cannot serve any more (its file purged, error 1236) raises
:class:`~connectors.exceptions.BinlogGapError`, whose message names the file needed, the oldest file
the server still has and the ways on.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pymysql
from pydantic import ValidationError
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from connectors.checkpoint import BinlogPosition
from connectors.database import column_types
from connectors.exceptions import (
    BinlogGapError,
    ConfigurationError,
    DatabaseUnavailableError,
    retry_cause,
)
from connectors.settings import MySQLSettings
from schemas import (
    ChangeEvent,
    DdlEvent,
    DeadLetter,
    Source,
    VersionError,
    binlog_version,
    gtid_version,
)
from schemas.codec import dead_letter
from schemas.events import Op, Row
from schemas.values import ColumnType, binlog_column_types, binlog_row_to_json

log = logging.getLogger(__name__)

VersionSource = Literal["binlog", "gtid"]
_NOT_DDL = ("BEGIN", "COMMIT", "ROLLBACK", "XA ", "SAVEPOINT")


@dataclass(frozen=True, slots=True)
class Boundary:
    """The end of a committed transaction: resuming here replays nothing partial."""

    position: BinlogPosition


@dataclass(frozen=True, slots=True)
class Tick:
    """The server is alive and the stream connected; nothing to produce."""


SourceItem = ChangeEvent | DdlEvent | DeadLetter | Boundary | Tick

ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236
"""The server cannot send the binlog from the asked position (purged file, impossible position...)."""

ACCEPT_GAP_HINT = (
    "run `freshkey connector --accept-gap`: it fences every bound namespace (nothing cached before is "
    "served) and continues from the current binlog position; then run `freshkey snapshot` to refill"
)


def binary_logs(settings: MySQLSettings) -> list[tuple[str, int]]:
    """The server's binlog files, oldest first, with their sizes (``SHOW BINARY LOGS``)."""
    conn = _connect(settings)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [(str(row[0]), int(row[1])) for row in cur.fetchall()]
    finally:
        conn.close()


def position_problem(position: BinlogPosition, logs: Sequence[tuple[str, int]]) -> str | None:
    """Why the server cannot serve the binlog from ``position`` (given its ``SHOW BINARY LOGS``), or
    None when it can."""
    if not logs:
        return "the server lists no binary logs (is log_bin on?)"
    sizes = dict(logs)
    if position.file not in sizes:
        oldest = logs[0][0]
        if position.file < oldest:
            return f"{position.file} has been purged; the oldest binlog the server still has is {oldest}"
        return (
            f"{position.file} is not on the server, whose binlogs are {oldest} to {logs[-1][0]} "
            "(another server, or its binlog was reset)"
        )
    if position.pos > sizes[position.file]:
        return (
            f"position {position.pos} is past the end of {position.file} ({sizes[position.file]} bytes); "
            f"the oldest binlog the server still has is {logs[0][0]}"
        )
    return None


def gap_message(
    position: BinlogPosition, problem: str, *, checkpoint: Path | str | None = None, detail: str = ""
) -> str:
    """The error a connector stops with when it cannot resume from ``position``."""
    where = f" (checkpoint {checkpoint})" if checkpoint is not None else ""
    said = f" The server said: {detail}." if detail else ""
    return (
        f"cannot resume the binlog at {position.file}:{position.pos}{where}: {problem}.{said} The changes "
        "in between are lost to freshkey, so cached entries of the bound tables may be stale. Ways on: "
        f"{ACCEPT_GAP_HINT}. To keep this from happening, keep binlogs longer than the connector may be "
        "down (binlog_expire_logs_seconds on the server)."
    )


def check_position(
    settings: MySQLSettings, position: BinlogPosition, *, checkpoint: Path | None = None
) -> None:
    """Raise :class:`BinlogGapError` when the server cannot serve the binlog from ``position``."""
    problem = position_problem(position, binary_logs(settings))
    if problem is not None:
        raise BinlogGapError(gap_message(position, problem, checkpoint=checkpoint))


def _connect(settings: MySQLSettings) -> pymysql.connections.Connection:
    try:
        return pymysql.connect(**settings.connection_kwargs())
    except pymysql.err.OperationalError as exc:
        if retry_cause(exc) == "database":
            raise DatabaseUnavailableError(
                f"MySQL at {settings.host}:{settings.port} is unavailable: {exc.args[-1]}"
            ) from exc
        raise


# -- DDL that names a bound table from another database --------------------------------------------------

_IDENTIFIER = re.compile(r'`((?:[^`]|``)+)`|"((?:[^"]|"")+)"|([\w$]+)')
_DATABASE_WORD = re.compile(r"(?:DATABASE|SCHEMA)(?:\s+IF(?:\s+NOT)?\s+EXISTS)?\s*$", re.IGNORECASE)


def _identifiers(query: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of every identifier-like token: quoted names unescaped, bare words as is."""
    found = []
    for match in _IDENTIFIER.finditer(query):
        backticked, quoted, bare = match.groups()
        name = (
            backticked.replace("``", "`")
            if backticked is not None
            else quoted.replace('""', '"')
            if quoted is not None
            else bare
        )
        found.append((match.start(), match.end(), name))
    return found


def mentioned_databases(query: str, tables: Collection[tuple[str, str]]) -> dict[str, set[str]]:
    """Bound databases a statement names, each with the bound tables of it named as ``db.table``.

    Case-insensitive, with or without backticks (or ANSI double quotes), spaces allowed around the dot;
    a quoted name holding a dot (```shop.assets```) counts too. ``DATABASE``/``SCHEMA <db>``
    (``DROP DATABASE shop``) names the database with no table (an empty set). Deliberately generous: a
    false positive costs the worker a re-signing, a miss leaves stale entries.
    """
    by_lower: dict[tuple[str, str], tuple[str, str]] = {(d.lower(), t.lower()): (d, t) for d, t in tables}
    databases = {d.lower(): d for d, _ in tables}
    found: dict[str, set[str]] = {}
    tokens = _identifiers(query)
    pairs: list[tuple[str, str]] = []
    for (_, end, first), (start, _, second) in itertools.pairwise(tokens):
        if query[end:start].strip() == ".":
            pairs.append((first, second))
    for _, _, name in tokens:
        if "." in name:  # `shop.assets`: not a qualified name in SQL, but cheap to honour
            db, _, table = name.partition(".")
            pairs.append((db, table))
    for db, table in pairs:
        bound = by_lower.get((db.lower(), table.lower()))
        if bound is not None:
            found.setdefault(bound[0], set()).add(bound[1])
    for start, _, name in tokens:
        if name.lower() in databases and _DATABASE_WORD.search(query[max(0, start - 40) : start]):
            found.setdefault(databases[name.lower()], set())
    return found


def current_position(settings: MySQLSettings, *, earliest: bool = False) -> BinlogPosition:
    """The server's current binlog end (or the start of its oldest binlog file)."""
    conn = _connect(settings)
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
    """Iterates the binlog from ``start``; blocks waiting for new events (``blocking=True``).

    ``read_timeout_s``: a connection that brings nothing (not even the server's heartbeat, sent every
    second while idle) for this long is taken as lost (pymysql then raises error 2013).
    ``checkpoint``: only named in the error raised when the server cannot serve ``start``.
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
    ) -> None:
        self._settings = settings
        self._tables = {(db, table) for db, table in tables}
        self._databases = {db for db, _ in self._tables}
        self._start = start
        self._version_source = version_source
        self._blocking = blocking
        self._read_timeout_s = read_timeout_s
        self._checkpoint = checkpoint
        self._stream: BinLogStreamReader | None = None
        # Column types per table (schemas.values): the table map's, refined from information_schema for
        # what it cannot name (MariaDB JSON, UUID, INET); refreshed after DDL on the table's database.
        self._refine: dict[tuple[str, str], dict[str, ColumnType]] = {}
        self._types: dict[tuple[str, str], tuple[object, dict[str, ColumnType]]] = {}

    def _open(self) -> BinLogStreamReader:
        connection = settings = self._settings.connection_kwargs()
        if self._read_timeout_s is not None:
            connection = {**settings, "read_timeout": max(1, round(self._read_timeout_s))}
        return BinLogStreamReader(
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
                XidEvent,
                QueryEvent,
                RotateEvent,
                GtidEvent,
                MariadbGtidEvent,
                HeartbeatLogEvent,
            ],
            only_schemas=sorted(self._databases),
            only_tables=sorted({t for _, t in self._tables}),
            slave_heartbeat=1.0,
            enable_logging=False,
        )

    def __iter__(self) -> Iterator[SourceItem]:
        stream = self._stream = self._open()
        try:
            yield from self._read(stream)
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == ER_MASTER_FATAL_ERROR_READING_BINLOG:
                at = BinlogPosition(stream.log_file or self._start.file, stream.log_pos or self._start.pos)
                raise self._refused(at, str(exc.args[-1])) from None
            raise

    def _refused(self, at: BinlogPosition, said: str) -> ConfigurationError:
        """The error for a server that refuses to send the binlog (1236), saying what to change."""
        if "server_id" in said or "server_uuid" in said:
            return ConfigurationError(
                f"the server stopped sending the binlog: {said}. Another replica or connector uses "
                f"server id {self._settings.server_id}: set FRESHKEY_MYSQL_SERVER_ID to an id no other "
                "server, replica or connector uses"
            )
        if "max_allowed_packet" in said:
            return ConfigurationError(
                f"the server cannot send a binlog event: {said}. Raise max_allowed_packet on the server "
                "(SET GLOBAL max_allowed_packet=1073741824 and set it under [mysqld] in its config file)"
            )
        try:
            problem = position_problem(at, binary_logs(self._settings))
        except Exception as exc:  # the listing is a courtesy: the server's own words come first
            log.debug("SHOW BINARY LOGS failed: %r", exc)
            problem = None
        return BinlogGapError(
            gap_message(
                at,
                problem or "the server cannot send the binlog from there",
                checkpoint=self._checkpoint,
                detail=said,
            )
        )

    def _read(self, stream: BinLogStreamReader) -> Iterator[SourceItem]:
        gtid: str | None = self._start.gtid
        ordinal = 0
        for event in stream:
            if isinstance(event, GtidEvent | MariadbGtidEvent):
                gtid, ordinal = event.gtid, 0
            elif isinstance(event, XidEvent):
                yield Boundary(BinlogPosition(stream.log_file, stream.log_pos, gtid))
            elif isinstance(event, HeartbeatLogEvent | RotateEvent):
                yield Tick()
            elif isinstance(event, QueryEvent):
                query = event.query.strip() if isinstance(event.query, str) else str(event.query)
                if query.upper().startswith(_NOT_DDL):
                    if query.upper() == "COMMIT":
                        yield Boundary(BinlogPosition(stream.log_file, stream.log_pos, gtid))
                    continue
                schema = event.schema.decode() if isinstance(event.schema, bytes) else str(event.schema)
                self._forget_types(schema, query)
                if schema in self._databases:
                    yield self._ddl(event, stream.log_file, schema, query, gtid)
                for db, named in sorted(mentioned_databases(query, self._tables).items()):
                    if db != schema:  # run from another database, naming a bound table
                        table = next(iter(named)) if len(named) == 1 else "*"
                        yield self._ddl(event, stream.log_file, db, query, gtid, table=table, suffix=f":{db}")
                # a DDL statement commits implicitly
                yield Boundary(BinlogPosition(stream.log_file, stream.log_pos, gtid))
            elif isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                if (event.schema, event.table) not in self._tables:
                    continue
                for index, row in enumerate(event.rows):
                    try:
                        yield from self._changes(event, stream.log_file, index, row, gtid, ordinal)
                    except (ValidationError, VersionError, TypeError) as exc:
                        yield dead_letter(
                            f"row of {event.schema}.{event.table} is not a valid change: {exc}",
                            json.dumps(row, default=str).encode(),
                            stage="connector",
                        )
                    ordinal += 1  # noqa: SIM113 - counts rows across events of a transaction

    def _column_types(self, event: Any) -> dict[str, ColumnType]:
        """The column types of a rows event's table (computed once per table map)."""
        table = (str(event.schema), str(event.table))
        cached = self._types.get(table)
        if cached is not None and cached[0] is event.columns:
            return cached[1]
        refine = self._refine.get(table)
        if refine is None:
            refine = self._refine[table] = column_types(self._settings, *table)
        types = binlog_column_types(event.columns, refine)
        self._types[table] = (event.columns, types)
        return types

    def _forget_types(self, schema: str, query: str) -> None:
        """After DDL, read information_schema again for the tables it may concern."""
        named = mentioned_databases(query, self._refine.keys())
        for table in [t for t in self._refine if t[0] == schema or t[0] in named]:
            del self._refine[table]
            self._types.pop(table, None)

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

    def _ddl(
        self,
        event: QueryEvent,
        file: str,
        schema: str,
        query: str,
        gtid: str | None,
        *,
        table: str = "*",
        suffix: str = "",
    ) -> DdlEvent:
        source = self._source(event, file, 0, schema, table, gtid)
        return DdlEvent(
            event_id=f"{source.server_id}:{file}:{source.pos}:ddl{suffix}",
            source=source,
            query=query,
            ts_ms=int(time.time() * 1000),
        )

    def _changes(
        self, event: Any, file: str, index: int, row: dict[str, Any], gtid: str | None, ordinal: int
    ) -> Iterator[ChangeEvent | DeadLetter]:
        source = self._source(event, file, index, event.schema, event.table, gtid)
        types = self._column_types(event)
        if isinstance(event, UpdateRowsEvent):
            before = binlog_row_to_json(row["before_values"], types, row.get("before_none_sources"))
            after = binlog_row_to_json(row["after_values"], types, row.get("after_none_sources"))
        elif isinstance(event, WriteRowsEvent):
            before, after = None, binlog_row_to_json(row["values"], types, row.get("none_sources"))
        else:
            before, after = binlog_row_to_json(row["values"], types, row.get("none_sources")), None
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
        """Close the binlog connections; never raises (a server that died leaves dead sockets)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception as exc:
                log.debug("closing the binlog stream: %r", exc)

"""Changes the connector cannot read from the binlog, and the fences that say so (no I/O).

Where a bound table's changes are lost to the connector, nothing cached of the table can be vouched for:
a :class:`~schemas.FenceEvent` of the table takes the changes' place in the change topic (the sender puts
it on every partition; the worker fences the table's namespace at each), and an error says why. Four ways
to lose them, each recognised by :class:`~connectors.binlog.source.BinlogSource`:

- a rows event the reader raises on (:func:`unreadable_rows`: also a dead letter with the event's bytes),
  or MySQL's partial JSON update (:class:`PartialJsonUpdate`), which holds only the changed parts;
- rows that became dead letters (:func:`rows_lost`: no primary key, a value that makes no valid change);
- a row change logged as a statement (:func:`statement_logged`: the writer's ``binlog_format``);
- a compressed event (:func:`compressed`: :data:`COMPRESSED_EVENTS`), whose table is unknown.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from connectors.binlog.ddl import statement_tables
from connectors.binlog.translate import EventOrigin, RowsEvent
from schemas import ChangeEvent, DeadLetter, FenceEvent
from schemas.codec import dead_letter
from schemas.events import FENCE_REASON_CHARS

log = logging.getLogger(__name__)

COMPRESSED_EVENTS = {
    0x28: "a MySQL transaction payload (binlog_transaction_compression=ON)",
    0xA5: "a MariaDB compressed query event (log_bin_compress=ON)",
    **dict.fromkeys(range(0xA6, 0xAC), "a MariaDB compressed rows event (log_bin_compress=ON)"),
}
"""Binlog event types that hold changes pymysqlreplication cannot read (it makes them NotImplementedEvent):
compressed events. ``freshkey doctor`` and the connector's start refuse compression; one that is turned
on later (MariaDB's is global and dynamic, MySQL's may be set per session) shows here."""


class PartialJsonUpdate(Exception):
    """A rows event of MySQL's partial JSON format (``binlog_row_value_options=PARTIAL_JSON``, set for a
    session: ``freshkey doctor`` refuses it globally)."""

    def __init__(self) -> None:
        super().__init__(
            "a partial JSON update (binlog_row_value_options=PARTIAL_JSON): its after image holds only the "
            "changed parts of the documents; set it to '' for the writers"
        )


def fence_event(origin: EventOrigin, db: str, table: str, reason: str, *, read_ms: int) -> FenceEvent:
    """The :class:`FenceEvent` of ``db.table`` for changes lost at ``origin`` (``reason`` cut to its
    bound)."""
    return FenceEvent(
        event_id=f"{origin.server_id}:{origin.file}:{origin.end_pos}:fence:{db}.{table}",
        source=origin.source(db, table),
        reason=reason[:FENCE_REASON_CHARS],
        ts_ms=read_ms,
    )


def unreadable_rows(
    origin: EventOrigin, schema: str, table: str, error: BaseException, original: bytes, *, read_ms: int
) -> tuple[DeadLetter, FenceEvent]:
    """A rows event of ``schema.table`` the reader raised on (a value it cannot decode): a dead letter with
    the error and the event's bytes, and the table's fence; said loudly. The connector goes on with the
    next event (no event can stop it, invariant 8)."""
    log.error(
        "a rows event of %s.%s at %s:%d cannot be read (%s: %s): its changes are lost; it goes to the "
        "dead-letter topic and the table's namespace is fenced",
        schema, table, origin.file, origin.end_pos, type(error).__name__, error,
        exc_info=log.isEnabledFor(logging.DEBUG),
    )  # fmt: skip
    reason = f"a rows event of {schema}.{table} could not be read: {type(error).__name__}: {error}"
    fence = fence_event(origin, schema, table, reason, read_ms=read_ms)
    return dead_letter(fence.reason, original, stage="connector-binlog"), fence


def rows_lost(
    rows: RowsEvent, changes: Sequence[ChangeEvent | DeadLetter], *, read_ms: int
) -> FenceEvent | None:
    """The fence of the event's table when rows of it became dead letters (no primary key, a value or
    version that makes no valid change), to send after the event's other changes; None when none did.
    The reason names no value (a dead letter's reason may quote one)."""
    lost = sum(1 for change in changes if type(change) is DeadLetter)
    if not lost:
        return None
    reason = (
        f"{lost} row change(s) of {rows.schema}.{rows.table} could not be sent (the dead-letter topic, "
        "stage connector, says why)"
    )
    return fence_event(rows.origin, rows.schema, rows.table, reason, read_ms=read_ms)


def statement_logged(
    origin: EventOrigin, schema: str, query: str, tables: Collection[tuple[str, str]], *, read_ms: int
) -> list[FenceEvent]:
    """A row change logged as a statement (its writer's session set ``binlog_format`` to STATEMENT or
    MIXED): its rows are not in the binlog, so the bound tables it may touch are fenced
    (``statement_tables``), said loudly. The statement itself is not logged: it holds row values."""
    concerned = statement_tables(query, schema, tables)
    if not concerned:
        return []
    log.error(
        "a row change in %s at %s:%d is logged as a statement (its session's binlog_format is not ROW): "
        "its rows are lost; fencing %s. Set binlog_format=ROW for every writer",
        schema or "(no database)", origin.file, origin.end_pos, ", ".join(f"{d}.{t}" for d, t in concerned),
    )  # fmt: skip
    reason = (
        f"a row change logged as a statement at {origin.file}:{origin.end_pos} (binlog_format not ROW for "
        "its session): its rows are not in the binlog"
    )
    return _fences(origin, concerned, reason, read_ms)


def compressed(
    origin: EventOrigin, what: str, tables: Collection[tuple[str, str]], *, read_ms: int
) -> list[FenceEvent]:
    """A compressed event (``what``: :data:`COMPRESSED_EVENTS`): which table's changes (or which statement)
    it holds is unknown, so every bound table is fenced, said loudly."""
    log.error(
        "%s at %s:%d cannot be read: the changes it holds are lost; fencing every bound table. Turn "
        "binlog compression off (freshkey doctor says how)",
        what, origin.file, origin.end_pos,
    )  # fmt: skip
    reason = f"{what} at {origin.file}:{origin.end_pos} cannot be read: the changes it holds are lost"
    return _fences(origin, sorted(tables), reason, read_ms)


def _fences(
    origin: EventOrigin, tables: Sequence[tuple[str, str]], reason: str, read_ms: int
) -> list[FenceEvent]:
    return [fence_event(origin, db, table, reason, read_ms=read_ms) for db, table in tables]


def event_bytes(event: Any) -> bytes:
    """The bytes of a binlog event's packet as the server sent it (for a dead letter); b"" when the reader
    holds them in another form."""
    data = getattr(getattr(getattr(event, "packet", None), "packet", None), "_data", None)
    return bytes(data) if isinstance(data, bytes | bytearray | memoryview) else b""

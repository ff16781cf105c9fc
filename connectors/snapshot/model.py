"""What a snapshot is made of: the request, each table's progress, the run's state. Pure: no I/O.

A *request* names the tables to read (each with a label, the namespace the command asked for), the
chunk size and the rate limit. Taking a request (:func:`take_request`) turns it into the
:class:`SnapshotState` the connector works on and keeps beside its checkpoint: per table the last key
of the last chunk Kafka acknowledged, the rows sent and dropped, and whether the table is done. A new
request resumes the tables it shares with an unfinished one (the last acknowledged chunk is where it goes
on) unless it asks to ``restart``; after a finished snapshot every table starts over.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from connectors.checkpoint import BinlogPosition
from schemas.versions import binlog_file_seq

Status = Literal["running", "done", "cancelled", "failed"]
"""A snapshot's state: ``running`` until every table is done (``done``), cancelled (Ctrl-C of the
command; resumable), or ``failed`` (the message says why and what to change)."""

HANDLED_KEPT = 64
"""Request ids remembered as taken, so that a binlog replayed after a crash does not take one again."""

MAX_CHUNK_ROWS = 100_000


class SnapshotTable(BaseModel):
    """One table to read, with the label (the namespace) progress and counts are shown under."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    db: str = Field(min_length=1, max_length=64)
    table: str = Field(min_length=1, max_length=64)
    label: str = Field("", max_length=400)

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"


class SnapshotRequest(BaseModel):
    """What ``freshkey snapshot`` (or the connector after a gap) asks for."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    request: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    tables: tuple[SnapshotTable, ...] = Field(min_length=1, max_length=10_000)
    chunk_rows: int = Field(ge=1, le=MAX_CHUNK_ROWS)
    max_rows_per_s: float = Field(0.0, ge=0)
    restart: bool = False
    reason: str = Field("requested by freshkey snapshot", max_length=2000)


class TableProgress(BaseModel):
    """One table's progress: everything up to ``last_key`` (primary-key order) has been read and its
    rows acknowledged by Kafka."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    db: str
    table: str
    label: str = ""
    key_columns: list[str] | None = None
    last_key: list[Any] | None = None
    """The primary key (JSON form, key-column order) of the last row of the last acknowledged chunk."""
    rows: int = 0
    """Rows sent as ``op: "r"`` events and acknowledged by Kafka."""
    dropped: int = 0
    """Rows left out because they changed between their chunk's watermarks (the stream carries them)."""
    chunks: int = 0
    done: bool = False
    skipped: str | None = None
    """Why the table cannot be read (missing, no primary key); a skipped table counts as finished."""
    estimate: int | None = None
    """The server's estimate of the table's rows (information_schema), for progress bars."""

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    @property
    def finished(self) -> bool:
        return self.done or self.skipped is not None


class SnapshotState(BaseModel):
    """The snapshot the connector works on (kept beside the checkpoint, published to the signal table)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    request: str
    status: Status = "running"
    reason: str = ""
    tables: list[TableProgress]
    chunk_rows: int = Field(ge=1, le=MAX_CHUNK_ROWS)
    max_rows_per_s: float = Field(0.0, ge=0)
    started_at: float
    """When this request was taken (unix s)."""
    finished_at: float | None = None
    resumed_rows: int = 0
    """Rows already acknowledged when this request was taken (a resumed snapshot): not this run's."""
    error: str | None = None
    handled: list[str] = Field(default_factory=list)
    """Ids of the requests taken so far (the newest last)."""

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def dropped(self) -> int:
        return sum(t.dropped for t in self.tables)

    @property
    def finished(self) -> bool:
        return all(t.finished for t in self.tables)

    def rows_per_s(self, now: float | None = None) -> float | None:
        """This run's rows per second (acknowledged rows, resumed ones left out); None before a second."""
        end = self.finished_at if self.finished_at is not None else (now or time.time())
        elapsed = end - self.started_at
        if elapsed <= 0:
            return None
        return (self.rows - self.resumed_rows) / elapsed


def take_request(
    current: SnapshotState | None, request: SnapshotRequest, *, now: float
) -> SnapshotState | None:
    """The state after ``request`` arrives, or None when it was taken already (a replayed binlog).

    Tables shared with an unfinished snapshot (running, cancelled or failed) keep their progress unless
    the request asks to restart; every other table starts at its first row.
    """
    handled = list(current.handled) if current is not None else []
    if request.request in handled:
        return None
    previous: dict[tuple[str, str], TableProgress] = {}
    if current is not None and not request.restart and current.status != "done":
        previous = {(t.db, t.table): t for t in current.tables}
    tables: list[TableProgress] = []
    for wanted in dict.fromkeys(request.tables):
        kept = previous.get((wanted.db, wanted.table))
        if kept is not None and kept.skipped is None:
            tables.append(kept.model_copy(update={"label": wanted.label or kept.label}))
        else:
            tables.append(TableProgress(db=wanted.db, table=wanted.table, label=wanted.label))
    handled.append(request.request)
    return SnapshotState(
        request=request.request,
        reason=request.reason,
        tables=tables,
        chunk_rows=request.chunk_rows,
        max_rows_per_s=request.max_rows_per_s,
        started_at=now,
        resumed_rows=sum(t.rows for t in tables),
        handled=handled[-HANDLED_KEPT:],
    )


def void_progress(state: SnapshotState, reason: str) -> SnapshotState:
    """After a gap was fenced: nothing read before it counts any more (its entries are no longer served),
    so every table starts over at the next request. A running snapshot is cancelled."""
    tables = [TableProgress(db=t.db, table=t.table, label=t.label) for t in state.tables]
    status: Status = "cancelled" if state.status == "running" else state.status
    return state.model_copy(
        update={
            "tables": tables,
            "status": status,
            "resumed_rows": 0,
            "error": reason if status != "done" else None,
        }
    )


# -- chunks and their acknowledgement ---------------------------------------------------------------------


def position_order(position: BinlogPosition) -> tuple[int, int]:
    """A binlog position as a sortable pair (file sequence, position): binlog order on one server."""
    return binlog_file_seq(position.file), position.pos


class ChunkDone(BaseModel):
    """A chunk whose rows were sent at its high watermark; it counts once Kafka acknowledged them."""

    model_config = ConfigDict(frozen=True)

    table: int
    """Index of the table in the state's list."""
    last_key: list[Any] | None
    emitted: int
    dropped: int
    exhausted: bool


class Ledger:
    """Chunks sent but not yet acknowledged, in binlog order, each with the position of its high
    watermark. A chunk counts (:meth:`settle`) once the connector's checkpoint, which moves only past
    events Kafka acknowledged (invariant 4), is at or past that position: its rows were produced before
    the high watermark's transaction ended, so they were acknowledged too."""

    def __init__(self) -> None:
        self._pending: list[tuple[tuple[int, int], ChunkDone]] = []

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, high_watermark: BinlogPosition, chunk: ChunkDone) -> None:
        self._pending.append((position_order(high_watermark), chunk))

    def settle(self, committed: BinlogPosition) -> list[ChunkDone]:
        """The chunks whose high watermark is at or before ``committed``, oldest first (removed)."""
        if not self._pending:
            return []
        at = position_order(committed)
        done = [chunk for where, chunk in self._pending if where <= at]
        if done:
            self._pending = [(where, chunk) for where, chunk in self._pending if where > at]
        return done

    def clear(self) -> None:
        self._pending.clear()


def apply_chunks(state: SnapshotState, chunks: Sequence[ChunkDone], *, now: float) -> bool:
    """Count acknowledged chunks into ``state`` (in place); True when it finished with them."""
    for chunk in chunks:
        progress = state.tables[chunk.table]
        progress.chunks += 1
        progress.rows += chunk.emitted
        progress.dropped += chunk.dropped
        if chunk.last_key is not None:
            progress.last_key = chunk.last_key
        if chunk.exhausted:
            progress.done = True
    if chunks and state.status == "running" and state.finished:
        state.status = "done"
        state.finished_at = now
        return True
    return False


class Pacer:
    """The rate limit: chunks are spaced so that the rows read never run ahead of ``max_rows_per_s``
    (0: no limit). A virtual clock moves by ``rows / max_rows_per_s`` per chunk read, from the later of
    itself and now: a slow chunk is not made up for by a burst after it."""

    def __init__(self, max_rows_per_s: float) -> None:
        self.max_rows_per_s = max_rows_per_s
        self._next = 0.0

    def read(self, rows: int, now: float) -> None:
        """``rows`` more were read at ``now``."""
        if self.max_rows_per_s > 0:
            self._next = max(self._next, now) + rows / self.max_rows_per_s

    def wait_s(self, now: float) -> float:
        """Seconds until the next chunk may start."""
        return max(0.0, self._next - now)


class SnapshotStatus(SnapshotState):
    """The status row the connector publishes (what ``freshkey snapshot`` follows): the state, with what
    is in flight and when it was written."""

    model_config = ConfigDict(extra="ignore")

    in_flight_rows: int = 0
    """Rows sent that Kafka has not acknowledged yet."""
    server_id: int | None = None
    published_at: float | None = None

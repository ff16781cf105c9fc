"""The snapshot inside the connector: requests from the signal table, chunks between watermarks, rows
sent in binlog order, progress kept and published.

Two threads share a :class:`SnapshotCoordinator`:

- the **binlog reader** (the connector's session loop) hands it every signal-table change
  (:meth:`~SnapshotCoordinator.on_signal`: requests, cancels, and the chunk's own watermarks, at the
  high one of which it returns the chunk's ``op: "r"`` events to produce right there, in binlog order),
  every other item while a chunk's window is open (:meth:`~SnapshotCoordinator.observe`) and every
  transaction boundary (:meth:`~SnapshotCoordinator.read_to`: chunks whose rows Kafka acknowledged are
  counted and saved);
- the **driver** (:meth:`~SnapshotCoordinator._drive`, one thread per session) writes a chunk's low
  watermark, SELECTs it, writes its high watermark, and waits until the reader has closed it before
  the next one, paced by the rate limit. It also publishes the progress to the signal table's status row
  for ``freshkey snapshot`` to follow.

What it guarantees: the rows of a chunk are produced before the high watermark's transaction boundary,
so the checkpoint passes that boundary only once Kafka acknowledged them (invariant 4), and only then
does the chunk count as done in the progress file (:class:`~connectors.snapshot.model.Ledger`). A
connector killed mid-snapshot resumes after the last chunk Kafka has (replayed watermarks of chunks it
no longer holds are ignored); a gap that was fenced voids the progress (the entries it wrote are no
longer served) and, with ``after_gap``, starts a new snapshot of those tables first, before the fence.
A failure of the driver (the database away) never stops the stream: the driver retries with backoff,
the chunk it was reading is read again.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pymysql
from pydantic import ValidationError
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential_jitter

from connectors.checkpoint import BinlogPosition
from connectors.exceptions import ConfigurationError, RetriableError, retry_cause
from connectors.settings import ConnectorSettings, MySQLSettings
from connectors.snapshot.model import (
    ChunkDone,
    Ledger,
    Pacer,
    SnapshotRequest,
    SnapshotState,
    SnapshotTable,
    apply_chunks,
    position_order,
    take_request,
    void_progress,
)
from connectors.snapshot.reader import ChunkReader, ShapeError, TableShape
from connectors.snapshot.signals import SignalTable, parse_signal
from connectors.snapshot.store import SnapshotStore
from connectors.snapshot.window import Chunk, close
from schemas import ChangeEvent, DeadLetter

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 0.5
"""Least time between two status rows while a snapshot runs (a final state is published at once)."""
PROGRESS_LOG_EVERY_S = 5.0

OnGap = Callable[[str], object]


class _Stopped(Exception):
    """The session is ending: the driver stops where it is."""


class _Reshape(RetriableError):
    """A chunk's SELECT failed on the table's shape: read the shape again after a backoff."""

    cause = "database"


class SnapshotCoordinator:
    """A connector's snapshots (see the module docstring). One per connector run, across its sessions."""

    def __init__(
        self,
        mysql: MySQLSettings,
        connector: ConnectorSettings,
        *,
        after_gap: Sequence[SnapshotTable] | None = None,
    ) -> None:
        self.mysql = mysql
        self.connector = connector
        self.signal = SignalTable(connector.signal_table, mysql.server_id)
        self.store = SnapshotStore(connector.snapshot_state_path)
        self.after_gap = tuple(after_gap or ())
        self.keep_changed = connector.snapshot_unsafe_keep_changed_rows
        if self.keep_changed:
            log.error(
                "FRESHKEY_CONNECTOR_SNAPSHOT_UNSAFE_KEEP_CHANGED_ROWS is on: snapshots keep rows that "
                "changed between their watermarks and WILL leave stale cache entries (tests only)"
            )
        self.state: SnapshotState | None = self.store.load()
        self.chunk: Chunk | None = None
        """The chunk between its watermarks (set by the driver, closed by the reader)."""
        self._cond = threading.Condition()
        self._ledger = Ledger()
        self._cursors: dict[int, tuple[list[Any] | None, bool]] = {}
        """Per table: where the next chunk starts and whether the table is read to its end (closed
        chunks, acknowledged or not); defaults to the saved progress."""
        self._in_flight_rows = 0
        self._changed = 0
        self._committed: Callable[[], BinlogPosition] | None = None
        self._last_read: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._driver: threading.Thread | None = None
        self._last_progress_log = 0.0

    @property
    def table(self) -> tuple[str, str]:
        """The signal table (``db``, ``table``): the connector reads its binlog rows too."""
        return self.signal.key

    # -- the session (binlog reader thread) ---------------------------------------------------------------
    def begin(self, committed: Callable[[], BinlogPosition]) -> None:
        """A session starts reading; ``committed()`` is its checkpoint (what Kafka acknowledged)."""
        with self._cond:
            self._committed = committed
            self._last_read = None
            self._reset_chunks()
            self._changed += 1
            state = self.state
        if state is not None and state.status == "running":
            log.info(
                "continuing snapshot %s (%s): %d row(s) acknowledged so far, %d of %d table(s) read",
                state.request,
                state.reason,
                state.rows,
                sum(t.finished for t in state.tables),
                len(state.tables),
            )
        self._stop = threading.Event()
        self._driver = threading.Thread(target=self._drive, name="snapshot-driver", daemon=True)
        self._driver.start()

    def end(self) -> None:
        """The session ended: stop the driver, count what Kafka acknowledged, drop what it did not."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._driver is not None:
            self._driver.join(timeout=10)
            self._driver = None
        self.read_to(None)
        with self._cond:
            self._reset_chunks()
            self._committed = None

    def _reset_chunks(self) -> None:
        self.chunk = None
        self._ledger.clear()
        self._cursors = {}
        self._in_flight_rows = 0

    def observe(self, item: object) -> None:
        """An item of the stream (not of the signal table): noted while a chunk's window is open."""
        chunk = self.chunk
        if chunk is not None and chunk.opened:
            chunk.note(item)

    def on_signal(self, event: ChangeEvent) -> list[ChangeEvent | DeadLetter]:
        """A change of the signal table; returns what to produce now (a chunk's rows, at its high
        watermark)."""
        signal = parse_signal(event, self.signal.server_id)
        if signal is None:
            return []
        if signal.kind == "low":
            chunk = self.chunk
            if chunk is not None and chunk.id == signal.body.get("chunk"):
                chunk.opened = True
        elif signal.kind == "high":
            return self._close(event, signal.body.get("chunk"))
        elif signal.kind == "request":
            self._take(signal.body)
        elif signal.kind == "cancel":
            self._cancel(signal.body)
        return []

    def read_to(self, position: BinlogPosition | None) -> None:
        """The reader passed a transaction boundary at ``position`` (None: a tick): count the chunks
        whose rows Kafka acknowledged."""
        if position is not None and self.chunk is not None:
            self._last_read = position_order(position)
        if not len(self._ledger) or self._committed is None:
            return
        committed = self._committed()
        with self._cond:
            done = self._ledger.settle(committed)
            if not done or self.state is None:
                return
            finished = apply_chunks(self.state, done, now=time.time())
            self._in_flight_rows -= sum(chunk.emitted for chunk in done)
            self._save()
            self._cond.notify_all()
            state = self.state
        if finished:
            log.info(
                "snapshot %s done: %d row(s) sent, %d dropped (changed while read: the stream has them), "
                "%.0f rows/s",
                state.request,
                state.rows,
                state.dropped,
                state.rows_per_s() or 0,
            )
        elif time.monotonic() - self._last_progress_log >= PROGRESS_LOG_EVERY_S:
            self._last_progress_log = time.monotonic()
            log.info(
                "snapshot %s: %d row(s) sent, %d dropped, %.0f rows/s",
                state.request,
                state.rows,
                state.dropped,
                state.rows_per_s() or 0,
            )

    def _close(self, high: ChangeEvent, chunk_id: object) -> list[ChangeEvent | DeadLetter]:
        chunk = self.chunk
        if chunk is None or chunk.id != chunk_id or not chunk.opened or chunk.rows is None:
            return []  # a watermark of a chunk this session does not hold (replayed, abandoned)
        closed = close(chunk, high, read_ms=int(time.time() * 1000), keep_changed=self.keep_changed)
        with self._cond:
            self.chunk = None
            self._cond.notify_all()
            if chunk.spoiled is not None:
                log.info("snapshot chunk of %s.%s read again: %s", chunk.db, chunk.table, chunk.spoiled)
                return []
            previous = self._cursor(chunk.table_index)[0]
            self._cursors[chunk.table_index] = (chunk.last_key or previous, chunk.exhausted)
            self._ledger.add(
                BinlogPosition(high.source.file, high.source.pos),
                ChunkDone(
                    table=chunk.table_index,
                    last_key=chunk.last_key,
                    emitted=closed.emitted,
                    dropped=closed.dropped,
                    exhausted=chunk.exhausted,
                ),
            )
            self._in_flight_rows += closed.emitted
        if len(closed.events) != closed.emitted:
            log.warning(
                "snapshot of %s.%s: %d row(s) are no valid change: dead letters",
                chunk.db,
                chunk.table,
                len(closed.events) - closed.emitted,
            )
        return closed.events

    def _take(self, body: dict[str, Any]) -> None:
        try:
            request = SnapshotRequest.model_validate(body)
        except ValidationError as exc:
            log.error("snapshot request ignored, it is not valid: %s", exc.errors(include_url=False)[:3])
            return
        with self._cond:
            state = take_request(self.state, request, now=time.time())
            if state is None:
                return  # taken already: a replayed binlog
            self.state = state
            self._reset_chunks()
            self._save()
            self._cond.notify_all()
        log.info(
            "snapshot %s taken (%s): %d table(s), %d rows per chunk, %s; resumes %d acknowledged row(s)",
            request.request,
            request.reason,
            len(state.tables),
            state.chunk_rows,
            f"at most {state.max_rows_per_s:g} rows/s" if state.max_rows_per_s else "no rate limit",
            state.resumed_rows,
        )

    def _cancel(self, body: dict[str, Any]) -> None:
        with self._cond:
            state = self.state
            if state is None or state.request != body.get("request") or state.status != "running":
                return
            state.status = "cancelled"
            state.finished_at = time.time()
            self._save()
            self._cond.notify_all()
        log.warning(
            "snapshot %s cancelled after %d row(s); `freshkey snapshot` continues it",
            state.request,
            state.rows,
        )

    # -- gaps -------------------------------------------------------------------------------------------
    def gap_hook(self, on_gap: OnGap | None) -> OnGap | None:
        """``on_gap`` (the fence) preceded by :meth:`gap`: the progress is voided, and the refill asked
        for, before the fence (a crash in between leaves a snapshot to run, never a fence without one)."""
        if on_gap is None:
            return None
        fence = on_gap

        def hook(reason: str) -> object:
            self.gap(reason)
            return fence(reason)

        return hook

    def gap(self, reason: str) -> None:
        """Changes were lost to the workers and every namespace is being fenced: nothing a snapshot sent
        before counts any more. With ``after_gap``, a snapshot of those tables is asked for (restart)."""
        with self._cond:
            if self.state is not None:
                self.state = void_progress(self.state, f"voided by a gap: {reason}"[:2000])
            if self.after_gap:
                request = SnapshotRequest(
                    request=f"gap-{uuid.uuid4().hex[:16]}",
                    tables=self.after_gap,
                    chunk_rows=self.connector.snapshot_chunk_rows,
                    max_rows_per_s=self.connector.snapshot_max_rows_per_s,
                    restart=True,
                    reason=f"after a gap (--snapshot): {reason}"[:2000],
                )
                self.state = take_request(self.state, request, now=time.time())
            self._reset_chunks()
            if self.state is not None:
                self._save()
            self._cond.notify_all()
        if self.after_gap:
            log.warning("a snapshot of %d table(s) refills the caches after the fence", len(self.after_gap))

    # -- state ------------------------------------------------------------------------------------------
    def _save(self) -> None:
        """Persist and mark for publishing (the caller holds the lock)."""
        assert self.state is not None
        self.store.save(self.state)
        self._changed += 1

    def _cursor(self, index: int) -> tuple[list[Any] | None, bool]:
        cursor = self._cursors.get(index)
        if cursor is not None:
            return cursor
        assert self.state is not None
        progress = self.state.tables[index]
        return progress.last_key, progress.done

    def _next_job(self) -> tuple[str, int, list[Any] | None] | None:
        """(request, table index, key after which to read) of the next chunk; None when there is none
        (no running snapshot, a chunk in flight, every table read). The caller holds the lock."""
        state = self.state
        if state is None or state.status != "running" or self.chunk is not None:
            return None
        for index, progress in enumerate(state.tables):
            if progress.skipped is not None:
                continue
            last_key, done = self._cursor(index)
            if not done:
                return state.request, index, last_key
        return None

    def _fail(self, message: str) -> None:
        with self._cond:
            if self.state is None or self.state.status != "running":
                return
            self.state.status = "failed"
            self.state.error = message
            self.state.finished_at = time.time()
            self.chunk = None
            self._save()
            self._cond.notify_all()
        log.error("snapshot failed: %s", message)

    def status_body(self) -> dict[str, Any] | None:
        """What the status row holds: the state (without the ids taken) and what is in flight."""
        with self._cond:
            if self.state is None:
                return None
            body = self.state.model_dump(mode="json", exclude={"handled"})
            body["in_flight_rows"] = self._in_flight_rows
            body["server_id"] = self.signal.server_id
            body["published_at"] = time.time()
            return body

    # -- the driver thread ------------------------------------------------------------------------------
    def _drive(self) -> None:
        driver = _Driver(self)
        try:
            while not self._stop.is_set():
                retrying = Retrying(
                    retry=retry_if_exception(lambda exc: retry_cause(exc) is not None),
                    wait=wait_exponential_jitter(multiplier=0.5, max=30),
                    sleep=self._sleep,
                    before_sleep=self._before_retry,
                    reraise=True,
                )
                try:
                    retrying(driver.step)
                except _Stopped:
                    return
                except ConfigurationError as exc:
                    self._fail(str(exc))
                except Exception as exc:  # a bug or an unexpected server answer: the stream goes on
                    log.exception("snapshot driver failed")
                    self._fail(f"{type(exc).__name__}: {exc}")
        finally:
            driver.close()

    def _sleep(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise _Stopped

    def _before_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("snapshot paused (%s); the chunk is read again in %.1f s", exc, wait)


class _Driver:
    """The driver's connection and per-request memory; :meth:`step` does one thing (publish, wait, or
    one chunk) and raises on failure (the coordinator retries or fails the snapshot)."""

    def __init__(self, coordinator: SnapshotCoordinator) -> None:
        self.c = coordinator
        self.reader = ChunkReader(coordinator.mysql)
        self.shapes: dict[tuple[str, int], TableShape] = {}
        self.pacer: tuple[str, Pacer] | None = None
        self.published = -1
        self.published_at = 0.0
        self.ensured = False

    def close(self) -> None:
        self.reader.close()

    def step(self) -> None:
        c = self.c
        try:
            self.publish()
            with c._cond:
                job = c._next_job()
                if job is None:
                    c._cond.wait(0.25)
                    return
            request, index, after = job
            pacer = self._pacer(request)
            wait = pacer.wait_s(time.monotonic())
            if wait > 0:
                c._sleep(min(wait, 0.25))  # then look again: a cancel may have come
                return
            shape = self._shape(request, index)
            if shape is not None:
                self.chunk(request, index, shape, after, pacer)
        except (pymysql.err.MySQLError, OSError):
            self.reader.close()  # a new connection for the next attempt
            with c._cond:
                c.chunk = None
            raise

    def publish(self) -> None:
        c = self.c
        running = c.state is not None and c.state.status == "running"
        due = not running or time.monotonic() - self.published_at >= PUBLISH_EVERY_S
        if c._changed == self.published or not due:
            return
        changed = c._changed
        body = c.status_body()
        if body is None:
            return
        self.ensure()
        c.signal.write(self.reader.conn, "status", "", body)
        self.published, self.published_at = changed, time.monotonic()

    def ensure(self) -> None:
        """Create the signal table when missing (once per session)."""
        if not self.ensured:
            if self.c.signal.ensure(self.reader.conn, self.c.mysql.user):
                log.info("created the signal table %s", self.c.signal.name)
            self.ensured = True

    def _pacer(self, request: str) -> Pacer:
        if self.pacer is None or self.pacer[0] != request:
            state = self.c.state
            assert state is not None
            self.pacer = (request, Pacer(state.max_rows_per_s))
        return self.pacer[1]

    def _shape(self, request: str, index: int) -> TableShape | None:
        """The table's shape (read once per request and table); None when it is skipped."""
        c = self.c
        shape = self.shapes.get((request, index))
        if shape is not None:
            return shape
        assert c.state is not None
        progress = c.state.tables[index]
        try:
            shape = self.reader.shape(progress.db, progress.table)
        except ShapeError as exc:
            with c._cond:
                if c.state is not None and c.state.request == request:
                    c.state.tables[index].skipped = str(exc)
                    c._save()
                    if c.state.finished and c.state.status == "running":
                        c.state.status = "done"
                        c.state.finished_at = time.time()
                        c._save()
            log.warning("snapshot skips %s: %s", progress.name, exc)
            return None
        with c._cond:
            if c.state is not None and c.state.request == request:
                table = c.state.tables[index]
                if table.key_columns is not None and table.key_columns != list(shape.key_columns):
                    log.warning("the primary key of %s changed: its snapshot starts over", table.name)
                    table.last_key, table.done = None, False
                    c._cursors.pop(index, None)
                table.key_columns = list(shape.key_columns)
                table.estimate = shape.estimate
                c._save()
        self.shapes[(request, index)] = shape
        return shape

    def chunk(
        self, request: str, index: int, shape: TableShape, after: list[Any] | None, pacer: Pacer
    ) -> None:
        """One chunk: low watermark, SELECT, high watermark; then wait until the reader closed it."""
        c = self.c
        self.ensure()
        assert c.state is not None
        progress = c.state.tables[index]
        chunk = Chunk(
            id=uuid.uuid4().hex,
            table_index=index,
            db=progress.db,
            table=progress.table,
            key_columns=shape.key_columns,
            event_key_columns=shape.event_key_columns,
        )
        limit = c.state.chunk_rows
        with c._cond:
            if c.state is None or c.state.request != request or c.state.status != "running":
                return
            c.chunk = chunk
        conn = self.reader.conn
        c.signal.watermark(conn, "low", chunk.id, table=progress.name)
        started = time.monotonic()
        try:
            rows, last_key = self.reader.read(progress.db, progress.table, shape, after, limit)
        except (pymysql.err.ProgrammingError, pymysql.err.InternalError) as exc:
            # The table changed under the snapshot (a column or the table dropped): read its shape again.
            self.shapes.pop((request, index), None)
            raise _Reshape(
                f"reading {progress.name} failed ({exc.args[-1]}); its columns are read again"
            ) from exc
        pacer.read(len(rows), started)
        chunk.rows, chunk.last_key, chunk.exhausted = rows, last_key, len(rows) < limit
        c.signal.watermark(conn, "high", chunk.id, rows=len(rows))
        end = _binlog_end(conn)
        while True:
            with c._cond:
                if c.chunk is not chunk:
                    return  # closed by the reader (or dropped: a new request, the session ending)
                if end is not None and c._last_read is not None and c._last_read >= end:
                    c.chunk = None
                    raise ConfigurationError(
                        f"the connector read past the high watermark in {c.signal.name} without seeing it: "
                        "the signal table's changes are not in the binlog it reads (a binlog_do_db / "
                        "binlog_ignore_db filter on the server?). Put the signal table "
                        "(FRESHKEY_CONNECTOR_SIGNAL_TABLE) in a database the binlog records"
                    )
                c._cond.wait(0.2)
            if c._stop.is_set():
                raise _Stopped


def _binlog_end(conn: pymysql.connections.Connection) -> tuple[int, int] | None:
    """Where the server's binlog ends now (None when it cannot say)."""
    for statement in ("SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"):
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
                row = cur.fetchone()
        except pymysql.err.ProgrammingError:
            continue
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] in (1227,):  # no privilege to ask: no check
                return None
            raise
        if not row:
            return None
        return position_order(BinlogPosition(str(row[0]), int(row[1])))
    return None

"""The snapshot's driver thread (one per connector session): it writes a chunk's low watermark, SELECTs
the chunk, writes its high watermark, and waits until the binlog reader has closed it before the next
one, paced by the rate limit. It also publishes the progress to the signal table's status row for
``freshkey snapshot`` to follow.

A failure (the database away) never stops the stream: the driver retries with backoff and the chunk it
was reading is read again; a configuration error or an unexpected one fails the snapshot, not the
connector. What it shares with the reader is :class:`~connectors.snapshot.progress.SnapshotProgress`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import pymysql
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential_jitter

from connectors.checkpoint import BinlogPosition
from connectors.exceptions import ConfigurationError, RetriableError, retry_cause
from connectors.settings import MySQLSettings
from connectors.snapshot.model import Pacer, position_order
from connectors.snapshot.progress import SnapshotProgress
from connectors.snapshot.reader import ChunkReader, ShapeError, TableShape
from connectors.snapshot.signals import SignalTable
from connectors.snapshot.window import Chunk

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 0.5
"""Least time between two status rows while a snapshot runs (a final state is published at once)."""


class _Stopped(Exception):
    """The session is ending: the driver stops where it is."""


class _Reshape(RetriableError):
    """A chunk's SELECT failed on the table's shape: read the shape again after a backoff."""

    cause = "database"


def drive(
    progress: SnapshotProgress, mysql: MySQLSettings, signal: SignalTable, stop: threading.Event
) -> None:
    """The driver thread's body, until ``stop`` is set."""
    driver = ChunkDriver(progress, mysql, signal, stop)
    try:
        while not stop.is_set():
            retrying = Retrying(
                retry=retry_if_exception(lambda exc: retry_cause(exc) is not None),
                wait=wait_exponential_jitter(multiplier=0.5, max=30),
                sleep=driver.sleep,
                before_sleep=_before_retry,
                reraise=True,
            )
            try:
                retrying(driver.step)
            except _Stopped:
                return
            except ConfigurationError as exc:
                progress.fail(str(exc))
            except Exception as exc:  # a bug or an unexpected server answer: the stream goes on
                log.exception("snapshot driver failed")
                progress.fail(f"{type(exc).__name__}: {exc}")
    finally:
        driver.close()


def _before_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    wait = state.next_action.sleep if state.next_action is not None else 0.0
    log.warning("snapshot paused (%s); the chunk is read again in %.1f s", exc, wait)


class ChunkDriver:
    """The driver's connection and per-request memory; :meth:`step` does one thing (publish, wait, or
    one chunk) and raises on failure (:func:`drive` retries or fails the snapshot)."""

    def __init__(
        self, progress: SnapshotProgress, mysql: MySQLSettings, signal: SignalTable, stop: threading.Event
    ) -> None:
        self.p = progress
        self.mysql = mysql
        self.signal = signal
        self.stop = stop
        self.reader = ChunkReader(mysql)
        self.shapes: dict[tuple[str, int], TableShape] = {}
        self.pacer: tuple[str, Pacer] | None = None
        self.published = -1
        self.published_at = 0.0
        self.ensured = False

    def close(self) -> None:
        self.reader.close()

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``; raises when the session ends meanwhile."""
        if self.stop.wait(seconds):
            raise _Stopped

    def step(self) -> None:
        p = self.p
        try:
            self.publish()
            with p.cond:
                job = p.next_job()
                if job is None:
                    p.cond.wait(0.25)
                    return
            request, index, after = job
            pacer = self._pacer(request)
            wait = pacer.wait_s(time.monotonic())
            if wait > 0:
                self.sleep(min(wait, 0.25))  # then look again: a cancel may have come
                return
            shape = self._shape(request, index)
            if shape is not None:
                self.chunk(request, index, shape, after, pacer)
        except (pymysql.err.MySQLError, OSError):
            self.reader.close()  # a new connection for the next attempt
            with p.cond:
                p.chunk = None
            raise

    def publish(self) -> None:
        p = self.p
        running = p.state is not None and p.state.status == "running"
        due = not running or time.monotonic() - self.published_at >= PUBLISH_EVERY_S
        if p.changed == self.published or not due:
            return
        changed = p.changed
        body = p.status_body()
        if body is None:
            return
        self.ensure()
        self.signal.write(self.reader.conn, "status", "", body)
        self.published, self.published_at = changed, time.monotonic()

    def ensure(self) -> None:
        """Create the signal table when missing (once per session)."""
        if not self.ensured:
            if self.signal.ensure(self.reader.conn, self.mysql.user):
                log.info("created the signal table %s", self.signal.name)
            self.ensured = True

    def _pacer(self, request: str) -> Pacer:
        if self.pacer is None or self.pacer[0] != request:
            state = self.p.state
            assert state is not None
            self.pacer = (request, Pacer(state.max_rows_per_s))
        return self.pacer[1]

    def _shape(self, request: str, index: int) -> TableShape | None:
        """The table's shape (read once per request and table); None when it is skipped."""
        p = self.p
        shape = self.shapes.get((request, index))
        if shape is not None:
            return shape
        assert p.state is not None
        progress = p.state.tables[index]
        try:
            shape = self.reader.shape(progress.db, progress.table)
        except ShapeError as exc:
            with p.cond:
                if p.state is not None and p.state.request == request:
                    p.state.tables[index].skipped = str(exc)
                    p.save()
                    if p.state.finished and p.state.status == "running":
                        p.state.status = "done"
                        p.state.finished_at = time.time()
                        p.save()
            log.warning("snapshot skips %s: %s", progress.name, exc)
            return None
        with p.cond:
            if p.state is not None and p.state.request == request:
                table = p.state.tables[index]
                if table.key_columns is not None and table.key_columns != list(shape.key_columns):
                    log.warning("the primary key of %s changed: its snapshot starts over", table.name)
                    table.last_key, table.done = None, False
                    p.cursors.pop(index, None)
                table.key_columns = list(shape.key_columns)
                table.estimate = shape.estimate
                p.save()
        self.shapes[(request, index)] = shape
        return shape

    def chunk(
        self, request: str, index: int, shape: TableShape, after: list[Any] | None, pacer: Pacer
    ) -> None:
        """One chunk: low watermark, SELECT, high watermark; then wait until the reader closed it."""
        p = self.p
        self.ensure()
        assert p.state is not None
        progress = p.state.tables[index]
        chunk = Chunk(
            id=uuid.uuid4().hex,
            table_index=index,
            db=progress.db,
            table=progress.table,
            key_columns=shape.key_columns,
            event_key_columns=shape.event_key_columns,
        )
        limit = p.state.chunk_rows
        with p.cond:
            if p.state is None or p.state.request != request or p.state.status != "running":
                return
            p.chunk = chunk
        conn = self.reader.conn
        self.signal.watermark(conn, "low", chunk.id, table=progress.name)
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
        self.signal.watermark(conn, "high", chunk.id, rows=len(rows))
        end = _binlog_end(conn)
        while True:
            with p.cond:
                if p.chunk is not chunk:
                    return  # closed by the reader (or dropped: a new request, the session ending)
                if end is not None and p.last_read is not None and p.last_read >= end:
                    p.chunk = None
                    raise ConfigurationError(
                        f"the connector read past the high watermark in {self.signal.name} without seeing "
                        "it: the signal table's changes are not in the binlog it reads (a binlog_do_db / "
                        "binlog_ignore_db filter on the server?). Put the signal table "
                        "(FRESHKEY_CONNECTOR_SIGNAL_TABLE) in a database the binlog records"
                    )
                p.cond.wait(0.2)
            if self.stop.is_set():
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

"""The snapshot inside the connector: requests from the signal table, chunks between watermarks, rows
sent in binlog order, progress kept and published.

Two threads share a :class:`SnapshotCoordinator`:

- the **binlog reader** (the connector's session loop) hands it every signal-table change
  (:meth:`~SnapshotCoordinator.on_signal`: requests, cancels, and the chunk's own watermarks, at the
  high one of which it returns the chunk's ``op: "r"`` events to produce right there, in binlog order),
  every other item while a chunk's window is open (:meth:`~SnapshotCoordinator.observe`) and every
  transaction boundary (:meth:`~SnapshotCoordinator.read_to`: chunks whose rows Kafka acknowledged are
  counted and saved);
- the **driver** (:func:`connectors.snapshot.driver.drive`, one thread per session) writes a chunk's low
  watermark, SELECTs it, writes its high watermark, and waits until the reader has closed it before
  the next one, paced by the rate limit. It also publishes the progress to the signal table's status row
  for ``freshkey snapshot`` to follow.

What the two share (the state, the open chunk, the chunks Kafka has yet to acknowledge, the cursors) is
a :class:`~connectors.snapshot.progress.SnapshotProgress`.

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

from pydantic import ValidationError

from connectors.checkpoint import BinlogPosition
from connectors.settings import ConnectorSettings, MySQLSettings
from connectors.snapshot.driver import drive
from connectors.snapshot.model import (
    ChunkDone,
    SnapshotRequest,
    SnapshotState,
    SnapshotTable,
    apply_chunks,
    position_order,
    take_request,
    void_progress,
)
from connectors.snapshot.progress import SnapshotProgress
from connectors.snapshot.signals import SignalTable, parse_signal
from connectors.snapshot.store import SnapshotStore
from connectors.snapshot.window import Chunk, close
from schemas import ChangeEvent, DeadLetter

log = logging.getLogger(__name__)

PROGRESS_LOG_EVERY_S = 5.0

OnGap = Callable[[str], object]


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
        self.progress = SnapshotProgress(self.store, self.signal.server_id)
        self._committed: Callable[[], BinlogPosition] | None = None
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
        with self.progress.cond:
            self._committed = committed
            self.progress.last_read = None
            self.progress.reset_chunks()
            self.progress.changed += 1
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
        self._driver = threading.Thread(
            target=drive,
            args=(self.progress, self.mysql, self.signal, self._stop),
            name="snapshot-driver",
            daemon=True,
        )
        self._driver.start()

    def end(self) -> None:
        """The session ended: stop the driver, count what Kafka acknowledged, drop what it did not."""
        self._stop.set()
        with self.progress.cond:
            self.progress.cond.notify_all()
        if self._driver is not None:
            self._driver.join(timeout=10)
            self._driver = None
        self.read_to(None)
        with self.progress.cond:
            self.progress.reset_chunks()
            self._committed = None

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
            self.progress.last_read = position_order(position)
        if not len(self.progress.ledger) or self._committed is None:
            return
        committed = self._committed()
        with self.progress.cond:
            done = self.progress.ledger.settle(committed)
            if not done or self.state is None:
                return
            finished = apply_chunks(self.state, done, now=time.time())
            self.progress.in_flight_rows -= sum(chunk.emitted for chunk in done)
            self.progress.save()
            self.progress.cond.notify_all()
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
        with self.progress.cond:
            self.chunk = None
            self.progress.cond.notify_all()
            if chunk.spoiled is not None:
                log.info("snapshot chunk of %s.%s read again: %s", chunk.db, chunk.table, chunk.spoiled)
                return []
            previous = self.progress.cursor(chunk.table_index)[0]
            self.progress.cursors[chunk.table_index] = (chunk.last_key or previous, chunk.exhausted)
            self.progress.ledger.add(
                BinlogPosition(high.source.file, high.source.pos),
                ChunkDone(
                    table=chunk.table_index,
                    last_key=chunk.last_key,
                    emitted=closed.emitted,
                    dropped=closed.dropped,
                    exhausted=chunk.exhausted,
                ),
            )
            self.progress.in_flight_rows += closed.emitted
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
        with self.progress.cond:
            state = take_request(self.state, request, now=time.time())
            if state is None:
                return  # taken already: a replayed binlog
            self.state = state
            self.progress.reset_chunks()
            self.progress.save()
            self.progress.cond.notify_all()
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
        with self.progress.cond:
            state = self.state
            if state is None or state.request != body.get("request") or state.status != "running":
                return
            state.status = "cancelled"
            state.finished_at = time.time()
            self.progress.save()
            self.progress.cond.notify_all()
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
        with self.progress.cond:
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
            self.progress.reset_chunks()
            if self.state is not None:
                self.progress.save()
            self.progress.cond.notify_all()
        if self.after_gap:
            log.warning("a snapshot of %d table(s) refills the caches after the fence", len(self.after_gap))

    # -- state (shared with the driver: connectors.snapshot.progress) ----------------------------------
    @property
    def state(self) -> SnapshotState | None:
        """The snapshot this connector works on (None before the first request)."""
        return self.progress.state

    @state.setter
    def state(self, state: SnapshotState | None) -> None:
        self.progress.state = state

    @property
    def chunk(self) -> Chunk | None:
        """The chunk between its watermarks (set by the driver, closed by the reader)."""
        return self.progress.chunk

    @chunk.setter
    def chunk(self, chunk: Chunk | None) -> None:
        self.progress.chunk = chunk

    def _next_job(self) -> tuple[str, int, list[Any] | None] | None:
        with self.progress.cond:
            return self.progress.next_job()

    def status_body(self) -> dict[str, Any] | None:
        """What the status row holds: the state (without the ids taken) and what is in flight."""
        return self.progress.status_body()

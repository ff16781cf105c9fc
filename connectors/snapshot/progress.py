"""What the snapshot's two threads share: the state and its saving, the chunk between its watermarks, the
chunks waiting for Kafka's acknowledgement, where each table's next chunk starts, and the condition both
wait on.

The binlog reader's side is :class:`~connectors.snapshot.coordinator.SnapshotCoordinator`, the driver's
:mod:`connectors.snapshot.driver`; each holds :attr:`SnapshotProgress.cond` while it reads or changes
what is here (the methods say where the caller holds it).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from connectors.snapshot.model import Ledger, SnapshotState
from connectors.snapshot.store import SnapshotStore
from connectors.snapshot.window import Chunk

log = logging.getLogger(__name__)


class SnapshotProgress:
    """A connector's snapshot state across its sessions, and the chunk work of the current session."""

    def __init__(self, store: SnapshotStore, server_id: int) -> None:
        self.store = store
        self.server_id = server_id
        self.state: SnapshotState | None = store.load()
        self.chunk: Chunk | None = None
        """The chunk between its watermarks (set by the driver, closed by the reader)."""
        self.cond = threading.Condition()
        self.ledger = Ledger()
        self.cursors: dict[int, tuple[list[Any] | None, bool]] = {}
        """Per table: where the next chunk starts and whether the table is read to its end (closed
        chunks, acknowledged or not); defaults to the saved progress."""
        self.in_flight_rows = 0
        self.changed = 0
        """Counts the changes worth publishing (the driver publishes when it moved)."""
        self.last_read: tuple[int, int] | None = None
        """Where the reader last passed a transaction boundary while a chunk was open."""

    def reset_chunks(self) -> None:
        """Forget the chunks of this session (the caller holds the lock)."""
        self.chunk = None
        self.ledger.clear()
        self.cursors = {}
        self.in_flight_rows = 0

    def save(self) -> None:
        """Persist and mark for publishing (the caller holds the lock)."""
        assert self.state is not None
        self.store.save(self.state)
        self.changed += 1

    def cursor(self, index: int) -> tuple[list[Any] | None, bool]:
        """(key after which to read, read to its end) of table ``index``."""
        cursor = self.cursors.get(index)
        if cursor is not None:
            return cursor
        assert self.state is not None
        progress = self.state.tables[index]
        return progress.last_key, progress.done

    def next_job(self) -> tuple[str, int, list[Any] | None] | None:
        """(request, table index, key after which to read) of the next chunk; None when there is none
        (no running snapshot, a chunk in flight, every table read). The caller holds the lock."""
        state = self.state
        if state is None or state.status != "running" or self.chunk is not None:
            return None
        for index, progress in enumerate(state.tables):
            if progress.skipped is not None:
                continue
            last_key, done = self.cursor(index)
            if not done:
                return state.request, index, last_key
        return None

    def fail(self, message: str) -> None:
        """The running snapshot failed (``message`` says why and what to change)."""
        with self.cond:
            if self.state is None or self.state.status != "running":
                return
            self.state.status = "failed"
            self.state.error = message
            self.state.finished_at = time.time()
            self.chunk = None
            self.save()
            self.cond.notify_all()
        log.error("snapshot failed: %s", message)

    def status_body(self) -> dict[str, Any] | None:
        """What the status row holds: the state (without the ids taken) and what is in flight."""
        with self.cond:
            if self.state is None:
                return None
            body = self.state.model_dump(mode="json", exclude={"handled"})
            body["in_flight_rows"] = self.in_flight_rows
            body["server_id"] = self.server_id
            body["published_at"] = time.time()
            return body
